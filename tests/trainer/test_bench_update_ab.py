"""benchmarks/bench_update_ab.py's relative gradient difference: a micro-batch whose advantages are all 0
has an exactly zero gradient in both arms, which the bare quotient ‖a − b‖ / ‖a‖ reported as NaN (0/0)."""

import importlib.util
import math
from pathlib import Path

import torch

_SPEC = importlib.util.spec_from_file_location(
    "bench_update_ab", Path(__file__).resolve().parents[2] / "benchmarks" / "bench_update_ab.py")
ab = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(ab)


def test_zero_advantage_micro_batch_gives_zero_not_nan():
    # the gradient of -(logp * A).sum() with A = 0 everywhere: exact zeros in both arms
    lp = torch.randn(3, 5, requires_grad=True)
    (-(lp * torch.zeros(3)[:, None]).sum()).backward()
    g = lp.grad.flatten()
    assert torch.count_nonzero(g) == 0
    assert math.isnan(float((g - g.clone()).norm() / g.norm()))  # the old formula
    assert ab.rel_diff(g, g.clone()) == 0.0


def test_hand_computed_values():
    a, b = torch.tensor([3.0, 4.0]), torch.tensor([3.0, 3.0])
    assert ab.rel_diff(a, b) == 1.0 / 5.0  # ‖(0, 1)‖ / ‖(3, 4)‖
    assert ab.rel_diff(a, a) == 0.0
    assert ab.rel_diff(torch.zeros(2), b) == math.inf  # a zero reference and a non-zero other: undefined ratio

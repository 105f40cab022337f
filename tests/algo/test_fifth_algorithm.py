"""The seam holds: an algorithm defined entirely under tests/ (one module + one recipe) trains on the
tiny model, its estimator and mask take effect, and impossible combinations with it are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import discounted_grpo as algo  # the recipe's plugins: entry; imported here for its constants
from rlvr.config import build_config
from rlvr.errors import ConfigError
from rlvr.trainer.components import validate_components
from rlvr.trainer.trainer import Trainer

RECIPE = Path(__file__).with_name("discounted_grpo.yaml")
TINY = ["per_device_train_batch_size=4", "max_completion_length=8", "max_prompt_length=64", "max_steps=2",
        "learning_rate=1e-3", "logging.progress=false", "logging.tensorboard=false", "reward_timeout_s=0"]


def test_discounted_grpo_trains_two_steps_on_the_tiny_model(tmp_path, tiny, toy_task):
    factory, tok = tiny
    cfg = build_config([RECIPE], TINY + [f"logging.output_dir={tmp_path}"])
    tr = Trainer(cfg, factory(0), tok, toy_task)
    batch, metrics = tr.generate_batch()  # one round by hand: the estimator's output
    A, m = batch.advantages, batch.completion_mask
    assert A.shape == m.shape and (A[m == 0] == 0).all()
    rows = (A[:, 0] != 0) & (m[:, 1] > 0)
    assert rows.any() and torch.allclose(A[rows, 1], algo.GAMMA * A[rows, 0])
    assert metrics["discount/adv_token_mean"] > 0
    planned = []
    plan = tr.schedule.plan
    tr.schedule.plan = lambda b, ctx: planned.append(b) or plan(b, ctx)
    tr.train()
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 2] and len(planned) == 2
    for r, b in zip(logged, planned):
        assert r["actor/grad_norm"] > 0
        head = torch.clamp(b.completion_lengths, max=algo.HEAD_TOKENS).sum() / b.completion_lengths.sum()
        assert r["discount/head_token_frac"] == pytest.approx(float(head))  # the mask's own metric
        assert r["actor/num_loss_tokens"] == float(torch.clamp(b.completion_lengths, max=algo.HEAD_TOKENS).sum())


@pytest.mark.parametrize("extra, match", [
    (["sampler=hard_prompt"], "needs sampler: group"),
    (["batch_filters=[uec_retention]"], "per-sequence advantages"),
    (["dynamic_sampling.enable=true"], "dynamic_sampling"),
    (["loss_masks=[head_tokenz]"], "did you mean 'head_tokens'"),
])
def test_impossible_combinations_are_refused_before_any_model_loads(tmp_path, extra, match):
    cfg = build_config([RECIPE], TINY + [f"logging.output_dir={tmp_path}", *extra])
    with pytest.raises(ConfigError, match=match):
        validate_components(cfg)

"""Truncated / masked importance sampling of the rollout-training mismatch (rlvr.core.rollout_is)."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.core.objective import LossSettings, policy_objective
from rlvr.core.rollout_is import rollout_is_weights

LN = math.log


def _inputs():
    # row 0: ratios 2 and 1 (then padding); row 1: ratios 0.5 and 4
    train = torch.tensor([[LN(0.5), LN(0.9), 0.0], [LN(0.2), LN(0.8), LN(0.3)]])
    roll = torch.tensor([[LN(0.25), LN(0.9), 0.0], [LN(0.4), LN(0.2), LN(0.3)]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    return train, roll, mask


def test_token_truncate_is_min_ratio_c():
    w, changed = rollout_is_weights(*_inputs(), mode="token_truncate", clip_max=1.5)
    assert torch.allclose(w, torch.tensor([[1.5, 1.0, 1.0], [0.5, 1.5, 1.0]]))
    assert changed.tolist() == [[True, False, False], [False, True, False]]


def test_token_truncate_with_lower_bound_and_token_mask():
    w, _ = rollout_is_weights(*_inputs(), mode="token_truncate", clip_max=3.0, clip_min=0.6)
    assert torch.allclose(w, torch.tensor([[2.0, 1.0, 1.0], [0.6, 3.0, 1.0]]))
    w, changed = rollout_is_weights(*_inputs(), mode="token_mask", clip_max=3.0, clip_min=0.6)
    assert torch.allclose(w, torch.tensor([[2.0, 1.0, 1.0], [0.0, 0.0, 1.0]]))
    assert changed.sum() == 2


def test_sequence_modes_use_the_product_of_the_rows_ratios():
    # row 0: 2 · 1 = 2 (padding not counted); row 1: 0.5 · 4 · 1 = 2
    w, _ = rollout_is_weights(*_inputs(), mode="sequence_truncate", clip_max=1.5)
    assert torch.allclose(w, torch.tensor([[1.5, 1.5, 1.0], [1.5, 1.5, 1.5]]))
    w, _ = rollout_is_weights(*_inputs(), mode="sequence_mask", clip_max=3.0)
    assert torch.allclose(w, torch.tensor([[2.0, 2.0, 1.0], [2.0, 2.0, 2.0]]))
    w, _ = rollout_is_weights(*_inputs(), mode="sequence_mask", clip_max=1.5)
    assert torch.allclose(w, torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]))


def test_bad_arguments_are_named():
    t, r, m = _inputs()
    with pytest.raises(ValueError, match="mode must be one of"):
        rollout_is_weights(t, r, m, mode="token")
    with pytest.raises(ValueError, match="clip_min=2.0 > clip_max=1.0"):
        rollout_is_weights(t, r, m, clip_max=1.0, clip_min=2.0)
    with pytest.raises(ValueError, match="one shape"):
        rollout_is_weights(t, r[:, :2], m)


def test_objective_weights_only_the_policy_gradient_term():
    """μ = 1, token-mean over 3 tokens: d loss / d logp_t = −A·w_t / 3 with w = min(ρ_mismatch, C)."""
    logp = torch.tensor([[LN(0.5), LN(0.9), LN(0.6)]], requires_grad=True)
    roll = torch.tensor([[LN(0.25), LN(0.9), LN(0.1)]])  # mismatch ratios 2, 1, 6
    W = torch.ones(1, 3)
    A = torch.tensor([2.0])
    on = LossSettings(rollout_is_mode="token_truncate", rollout_is_clip_max=3.0)
    loss, met = policy_objective(logp, None, A, W, on, on.denominators(W), rollout_logp=roll)
    (g,) = torch.autograd.grad(loss, logp)
    assert torch.allclose(g, torch.tensor([[-2 * 2 / 3, -2 * 1 / 3, -2 * 3 / 3]]))
    assert float(met["rollout_is_ratio"]) == pytest.approx(2 + 1 + 6, rel=1e-5)
    assert float(met["rollout_is_changed"]) == 1.0
    assert float(met["rollout_logp_diff/max"]) == pytest.approx(LN(6), rel=1e-5)
    off = LossSettings()
    loss0, met0 = policy_objective(logp, None, A, W, off, off.denominators(W), rollout_logp=roll)
    (g0,) = torch.autograd.grad(loss0, logp)
    assert torch.allclose(g0, torch.full((1, 3), -2 / 3))  # measured but not corrected
    assert float(met0["rollout_is_changed"]) == 0.0


def test_objective_kl_term_is_not_reweighted():
    logp = torch.tensor([[LN(0.5), LN(0.9)]], requires_grad=True)
    ref = torch.tensor([[LN(0.4), LN(0.8)]])
    roll = torch.tensor([[LN(0.05), LN(0.09)]])  # ratio 10 on both tokens
    W, A = torch.ones(1, 2), torch.tensor([0.0])  # zero advantage: only the KL term has a gradient
    grads = []
    for s in (LossSettings(beta=0.1), LossSettings(beta=0.1, rollout_is_mode="token_truncate")):
        loss, _ = policy_objective(logp, None, A, W, s, s.denominators(W), ref_logp=ref, rollout_logp=roll)
        grads.append(torch.autograd.grad(loss, logp)[0])
    assert torch.allclose(grads[0], grads[1])


def test_objective_requires_rollout_logp_when_on():
    s = LossSettings(rollout_is_mode="token_truncate")
    logp, W = torch.zeros(1, 2, requires_grad=True), torch.ones(1, 2)
    with pytest.raises(ValueError, match="needs rollout_logp"):
        policy_objective(logp, None, torch.zeros(1), W, s, s.denominators(W))
    with pytest.raises(ValueError, match="rollout_is_mode must be None or one of"):
        LossSettings(rollout_is_mode="tis")

"""FBOS-RL core math: shaped / truncated-IS weights, the EPA per-token loss and its clipping rules per
token type, view advantages, and the per-view normalisation of the joint objective (spec §2.7–§2.9, §7.3)."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.core.advantages import grpo_advantages
from rlvr.core.aggregation import LOSS_AGG_MODES, aggregate
from rlvr.core.fbos import (
    ecc_advantages,
    epa_policy_loss,
    offpolicy_weight,
    shaped_offpolicy,
    shaped_weight,
    trunc_is_offpolicy,
    trunc_is_weight,
    view_advantages,
    view_normalised_weights,
)
from rlvr.core.policy_loss import POLICY_LOSSES, clipped_surrogate


@pytest.mark.parametrize("p", [0.01, 0.1, 0.5, 0.9])
def test_shaped_weight_value_and_autograd_derivative(p):
    g = 0.1
    logp = torch.tensor([[math.log(p)]], dtype=torch.float64, requires_grad=True)
    w = shaped_weight(logp, g)
    assert w.item() == pytest.approx(p / (p + g), rel=1e-12)
    (dw,) = torch.autograd.grad(w.sum(), logp)
    assert dw.item() == pytest.approx(g * p / (p + g) ** 2, rel=1e-10)  # ∂w/∂log p = γp/(p+γ)²
    assert dw.item() <= 0.25 + 1e-12


def test_shaped_gradient_is_at_most_a_quarter_and_peaks_at_gamma():
    g = 0.1
    p = torch.linspace(1e-4, 1 - 1e-4, 2001, dtype=torch.float64)
    logp = p.log()[None].requires_grad_(True)
    loss = shaped_offpolicy(logp, torch.ones(1, dtype=torch.float64), g)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    coeff = -grad[0]  # −∂ℓ/∂log p with Â = 1
    assert coeff.max().item() == pytest.approx(0.25, abs=1e-6)
    assert p[coeff.argmax()].item() == pytest.approx(g, abs=1e-3)


def test_trunc_is_weight_caps_and_passes_gradient_only_below_cap():
    logp = torch.tensor([[math.log(0.2), math.log(0.9)]], dtype=torch.float64, requires_grad=True)
    beh = torch.tensor([[math.log(0.4), math.log(0.3)]], dtype=torch.float64)
    w = trunc_is_weight(logp, beh, cap=2.0)
    assert w.tolist()[0] == pytest.approx([0.5, 2.0])  # 0.2/0.4 ; min(0.9/0.3 = 3, 2)
    (g,) = torch.autograd.grad(w.sum(), logp)
    assert g.tolist()[0] == pytest.approx([0.5, 0.0])  # ∂w/∂log p = w below the cap, 0 at the cap
    loss = trunc_is_offpolicy(logp, beh, torch.tensor([-2.0], dtype=torch.float64), cap=2.0)
    assert loss.tolist()[0] == pytest.approx([1.0, 4.0])


def _tokens(ratios, A, off):
    """logp/old_logp [N, 1] with given ratios (p = 0.5·ρ, p_old = 0.5)."""
    old = torch.full((len(ratios), 1), math.log(0.5), dtype=torch.float64)
    logp = (old + torch.tensor(ratios, dtype=torch.float64).log()[:, None]).requires_grad_(True)
    return logp, old, torch.tensor(A, dtype=torch.float64), torch.ones_like(old), torch.tensor(off)


def test_epa_clipping_rules_per_token_type():
    # rows: on-policy ρ=1.5 A>0 (clipped high), on-policy ρ=0.5 A<0 (clipped low), on-policy ρ=1.1 A>0
    # (inside), and the same three ratios on off-policy rows (never clipped)
    ratios = [1.5, 0.5, 1.1] * 2
    A = [1.0, -1.0, 1.0] * 2
    off = [False] * 3 + [True] * 3
    logp, old, A_t, M, off_t = _tokens(ratios, A, off)
    loss, info = epa_policy_loss(logp, old, A_t, M, epsilon=0.2, epsilon_high=0.28, is_offpolicy=off_t, gamma=0.1)
    (g,) = torch.autograd.grad(loss.sum(), logp)
    g = g[:, 0]
    assert g[0] == 0 and g[1] == 0  # clipped at 1 + ε_high and 1 − ε
    assert g[2].item() == pytest.approx(-1.0 * 1.1)  # −A·ρ
    assert info["clip_high"][:, 0].tolist() == [1.0, 0, 0, 0, 0, 0]
    assert info["clip_low"][:, 0].tolist() == [0, 1.0, 0, 0, 0, 0]
    for i in range(3, 6):  # off-policy: −A·γp/(p+γ)², never zero
        p = 0.5 * ratios[i]
        assert g[i].item() == pytest.approx(-A[i] * 0.1 * p / (p + 0.1) ** 2, rel=1e-9)
        assert loss[i, 0].item() == pytest.approx(-A[i] * p / (p + 0.1), rel=1e-9)
    assert info["offpolicy_weight"][:, 0].tolist()[3:] == pytest.approx([0.75 / 0.85, 0.25 / 0.35, 0.55 / 0.65])


def test_epa_ratio_one_at_theta_old_and_equals_clipped_without_offpolicy_rows():
    torch.manual_seed(0)
    logp = torch.randn(4, 5, dtype=torch.float64).clamp(max=-0.1)
    A = torch.tensor([1.0, -0.5, 0.0, 2.0], dtype=torch.float64)
    M = torch.ones_like(logp)
    loss, info = epa_policy_loss(logp, logp.clone(), A, M, is_offpolicy=torch.zeros(4, dtype=torch.bool))
    assert torch.allclose(info["ratio"], torch.ones_like(logp))
    ref, _ = clipped_surrogate(logp, logp.clone(), A, M)
    assert torch.equal(loss, ref)
    loss2, _ = epa_policy_loss(logp, logp.clone(), A, M, is_offpolicy=None)
    assert torch.equal(loss2, ref)
    assert POLICY_LOSSES["fbos_epa"] is epa_policy_loss


def test_epa_plain_and_trunc_is_variants():
    logp, old, A, M, off = _tokens([1.5, 1.5], [1.0, 1.0], [False, True])
    plain, info = epa_policy_loss(logp, old, A, M, epsilon_high=0.2, is_offpolicy=off, offpolicy_weight_kind="plain")
    assert info["clip_high"][:, 0].tolist() == [1.0, 1.0]  # plain: off-policy rows clipped like on-policy
    beh = torch.full_like(old, math.log(0.25))  # p = 0.75 → p/b = 3 → capped at 2
    ti, info = epa_policy_loss(logp, old, A, M, is_offpolicy=off, offpolicy_weight_kind="trunc_is", cap=2.0,
                               behaviour_logp=beh)
    assert ti[1, 0].item() == pytest.approx(-2.0)
    assert info["clip_high"][1, 0] == 0 and info["offpolicy_weight"][1, 0].item() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="behaviour_logp"):
        epa_policy_loss(logp, old, A, M, is_offpolicy=off, offpolicy_weight_kind="trunc_is")
    with pytest.raises(ValueError, match="offpolicy_weight_kind"):
        epa_policy_loss(logp, old, A, M, is_offpolicy=off, offpolicy_weight_kind="nope")
    assert offpolicy_weight(old, "plain", old_logp=old).tolist() == [[1.0], [1.0]]


def test_union_group_advantages_rescue_an_all_fail_prompt():
    # prompt 0: 4 failed initial + 4 FAP rollouts, one correct; prompt 1: constant group
    r = torch.tensor([0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1], dtype=torch.float32)
    gid = torch.tensor([0] * 8 + [1] * 8)
    inc = torch.ones(16, dtype=torch.bool)
    A = view_advantages(r, gid, inc)
    std = math.sqrt((7 * (1 / 8) ** 2 + (7 / 8) ** 2) / 7)  # unbiased
    assert A[4].item() == pytest.approx((7 / 8) / (std + 1e-6), rel=1e-5)
    assert A[0].item() == pytest.approx(-(1 / 8) / (std + 1e-6), rel=1e-5)
    assert (A[8:] == 0).all()
    assert torch.allclose(A, grpo_advantages(r, gid))
    only_initial = torch.tensor([True] * 4 + [False] * 4 + [True] * 8)
    assert (view_advantages(r, gid, only_initial)[:8] == 0).all()  # without FAP rollouts: no signal


def test_ecc_parent_baseline():
    s = torch.tensor([1.0, 0.0, 0.0, 1.0])
    gid = torch.zeros(4, dtype=torch.long)
    inc = torch.ones(4, dtype=torch.bool)
    group = ecc_advantages(s, gid, inc)
    assert torch.allclose(ecc_advantages(s, gid, inc, baseline="parent", parent_rewards=torch.zeros(4)), group)
    parent = torch.tensor([0.0, 0.0, 0.5, 0.5])  # partial-credit parents change the improvement
    d = s - parent
    want = grpo_advantages(d, gid)
    assert torch.allclose(ecc_advantages(s, gid, inc, baseline="parent", parent_rewards=parent), want)
    with pytest.raises(ValueError):
        ecc_advantages(s, gid, inc, baseline="parent")


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_view_normalised_weights_sum_of_per_view_aggregates(mode):
    torch.manual_seed(1)
    X = torch.randn(6, 5, dtype=torch.float64)
    W = (torch.rand(6, 5) > 0.3).to(torch.float64)
    W[2] = 0  # an empty row
    view = torch.tensor([0, 0, 0, 1, 1, 0])
    u = view_normalised_weights(W, view, mode, loss_scale_factor=7.0, view_scale={1: 0.5})
    got = (u * X).sum().item()
    want = 0.0
    for v, lam in ((0, 1.0), (1, 0.5)):
        rows = view == v
        want += lam * aggregate(X[rows], W[rows], mode, loss_scale_factor=7.0).item()
    assert got == pytest.approx(want, rel=1e-10, abs=1e-12)

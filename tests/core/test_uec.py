"""UEC-RL pure math: gate, retention, admission, entropy identity and direction (docs/uec_rl.md §7)."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.core.advantages import grpo_advantages
from rlvr.core.objective import LossSettings, policy_objective
from rlvr.core.uec import (
    entropy_logit_gradient,
    explore_retention_mask,
    group_pass_rates,
    hard_group_mask,
    low_prob_positive_fraction,
    regular_retention_mask,
    replay_admission_mask,
    retention_mask,
    softmax_entropy,
    success_advantage,
    tempered_is_weights,
    truncated_positive_mask,
)


def test_gate_pass_rates_zero_fifth_one():
    # three prompts × G = 5 with pass rates {0, 0.2, 1.0}
    passed = torch.tensor([0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1], dtype=torch.bool)
    gid = torch.tensor([7] * 5 + [3] * 5 + [9] * 5)
    ids, rate = group_pass_rates(passed, gid)
    assert ids.tolist() == [3, 7, 9]
    assert rate.tolist() == pytest.approx([0.2, 0.0, 1.0])
    assert hard_group_mask(passed, gid).tolist() == [True] * 5 + [False] * 10
    assert hard_group_mask(passed, gid, 0.2).tolist() == [True] * 10 + [False] * 5
    with pytest.raises(ValueError):
        hard_group_mask(passed, gid, 1.0)


def test_retention_filters_hand_values():
    adv = torch.tensor([0.0, 0.04, -0.06, 0.7, -1.2, 1.5])
    assert regular_retention_mask(adv).tolist() == [False, False, True, True, True, True]
    assert regular_retention_mask(adv, None).all()
    assert explore_retention_mask(adv).tolist() == [False, True, False, True, False, True]
    assert explore_retention_mask(adv, "abs", 1.0).tolist() == [False, False, False, False, True, True]
    assert explore_retention_mask(adv, "none").all()
    trunc = torch.tensor([True, False, True, True, True, False])
    assert truncated_positive_mask(adv, trunc).tolist() == [False, False, False, True, False, False]
    is_exp = torch.tensor([False, False, False, True, True, True])
    keep = retention_mask(adv, is_exp, trunc)
    # regular: 0 dropped, 0.04 dropped (|Â| ≤ 0.05), -0.06 kept; explore: 0.7 truncated positive dropped,
    # -1.2 dropped (not positive), 1.5 kept
    assert keep.tolist() == [False, False, True, False, False, True]
    assert retention_mask(adv, is_exp, trunc, drop_truncated_positive=False).tolist() == [
        False, False, True, True, False, True
    ]
    with pytest.raises(ValueError):
        explore_retention_mask(adv, "magnitude")
    with pytest.raises(ValueError):
        regular_retention_mask(adv[:, None])


def test_replay_admission_and_success_advantage():
    adv = torch.tensor([1.2, 1.0, -1.5, 0.3])
    assert replay_admission_mask(adv).tolist() == [True, False, False, False]
    assert replay_admission_mask(adv, "abs").tolist() == [True, False, True, False]
    # Â of a success in a binary group of n with k successes equals core GRPO (unbiased std, eps 0)
    for n, k in [(5, 1), (5, 2), (20, 9), (20, 10)]:
        r = torch.tensor([1.0] * k + [0.0] * (n - k))
        a = grpo_advantages(r, torch.zeros(n, dtype=torch.long), adv_eps=0.0)
        assert float(a[0]) == pytest.approx(success_advantage(n, k), rel=1e-6)
    # A_0 = 1 admits successes only from groups with few successes (spec §2.5)
    assert [k for k in range(1, 5) if success_advantage(5, k) > 1] == [1, 2]
    assert max(k for k in range(1, 20) if success_advantage(20, k) > 1) == 9


def test_entropy_gradient_matches_autograd_and_sign_flips_at_exp_minus_h():
    torch.manual_seed(0)
    for _ in range(5):
        z = torch.randn(12, dtype=torch.float64, requires_grad=True)
        H = softmax_entropy(z)
        (g,) = torch.autograd.grad(H, z)
        assert torch.allclose(g, entropy_logit_gradient(z.detach()), atol=1e-6)
        p = torch.softmax(z.detach(), -1)
        thr = math.exp(-float(H))
        for a in range(12):
            dz = torch.zeros(12, dtype=torch.float64)
            dz[a] = 1e-4
            dH = float(softmax_entropy(z.detach() + dz) - H.detach())
            want = -(math.log(float(p[a])) + float(H))
            assert math.copysign(1, dH) == math.copysign(1, want)
            assert (dH > 0) == (float(p[a]) < thr)


def test_low_prob_positive_fraction_hand_value():
    logp = torch.log(torch.tensor([[0.05, 0.9, 0.5], [0.01, 0.2, 0.0 + 1.0]]))
    ent = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])  # exp(-1)=0.368, exp(-2)=0.135
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, -1.0])
    # only row 0 is positive: tokens 0.05 (< 0.368, low) and 0.9 (not low); the third is padding
    assert low_prob_positive_fraction(logp, ent, adv, mask) == pytest.approx(0.5)
    assert math.isnan(low_prob_positive_fraction(logp, ent, -adv.abs(), mask))


def test_tempered_is_weights_clip_and_mask():
    tgt = torch.log(torch.tensor([[0.2, 0.5, 0.9]]))
    beh = torch.log(torch.tensor([[0.4, 0.05, 0.9]]))
    w = tempered_is_weights(tgt, beh, torch.tensor([[1.0, 1.0, 0.0]]), max_weight=5.0)
    assert w.tolist()[0] == pytest.approx([0.5, 5.0, 0.0])


# ------------------------------------------------------------------------------------------------
# entropy direction on a softmax toy (spec §7.4): one context, V actions, logits z are the policy


def _pg_step(z, actions, adv, old_logp=None, lr=0.5, eps=0.2):
    """One step of the core clipped surrogate (token-mean) on a single-context softmax policy."""
    z = z.clone().requires_grad_(True)
    logp = torch.log_softmax(z, -1)[actions][:, None]  # [N, 1], temperature 1
    W = torch.ones_like(logp)
    settings = LossSettings(epsilon=eps, epsilon_high=eps, clip_ratio_c=3.0)
    loss, _ = policy_objective(logp, old_logp, adv, W, settings, settings.denominators(W))
    (g,) = torch.autograd.grad(loss, z)
    return (z - lr * g).detach()


def _hard_toy(seed):
    """32 actions; a wrong action dominates (z = 3), the correct action 0 is rare but not the rarest."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(32, generator=gen, dtype=torch.float64) * 0.5 - 0.5
    z[1] = 3.0
    z[0] = 0.6
    return z, gen


def test_exploration_update_raises_entropy_and_its_tokens_are_low_probability():
    deltas, low_h, low_r = [], [], []
    for seed in range(16):
        z, gen = _hard_toy(seed)
        p = torch.softmax(z, -1)
        H = float(softmax_entropy(z))
        if bool((torch.multinomial(p, 5, replacement=True, generator=gen) == 0).any()):
            continue  # the regular group (G = 5, T = 1) solved it: not a hard prompt
        # exploration: G' = 20 at t' = 1.2, reward = [action == 0], GRPO advantages within G' alone
        q = torch.softmax(z / 1.2, -1)
        acts = torch.multinomial(q, 20, replacement=True, generator=gen)
        r = (acts == 0).double()
        if r.sum() == 0:
            continue
        adv = grpo_advantages(r, torch.zeros(20, dtype=torch.long))
        keep = adv > 0  # positive-only retention (τ_H = 0)
        low_h.append(float((p[acts[keep]] < math.exp(-H)).double().mean()))
        # positive regular samples of an easy prompt: the likely action 1 is the correct one
        reg = torch.multinomial(p, 5, replacement=True, generator=gen)
        low_r.append(float((p[reg[reg == 1]] < math.exp(-H)).double().mean()) if (reg == 1).any() else 0.0)
        z1 = _pg_step(z, acts[keep], adv[keep])
        deltas.append(float(softmax_entropy(z1)) - H)
    assert len(deltas) >= 5
    assert sum(deltas) / len(deltas) > 0
    assert sum(low_h) / len(low_h) > sum(low_r) / len(low_r)


def test_replay_update_on_likely_solution_lowers_entropy_and_stale_ratio_brakes():
    deltas = []
    for seed in range(6):
        z, _ = _hard_toy(seed)
        z[0] = 3.5  # the solution has become likely (p_a > exp(-H)) after exploration + training
        p = torch.softmax(z, -1)
        H = float(softmax_entropy(z))
        assert float(p[0]) > math.exp(-H)
        acts = torch.zeros(4, dtype=torch.long)  # replayed successes
        adv = torch.full((4,), 1.5)  # stored Â > A_0
        old = torch.log_softmax(z, -1)[acts][:, None]  # stored old_logp (bit-identical)
        z1 = _pg_step(z, acts, adv, old_logp=old)
        deltas.append(float(softmax_entropy(z1)) - H)
    assert sum(deltas) / len(deltas) < 0 and max(deltas) < 0
    # the brake: once π(a) rose by more than (1 + ε) since storage, the clipped surrogate has no gradient
    z, _ = _hard_toy(0)
    old = torch.log_softmax(z, -1)[torch.zeros(2, dtype=torch.long)][:, None]
    z_up = z.clone()
    z_up[0] += 1.0  # ratio π/π_old ≈ e > 1.2
    assert torch.equal(_pg_step(z_up, torch.zeros(2, dtype=torch.long), torch.ones(2), old_logp=old), z_up)

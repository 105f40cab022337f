"""μ-GRPO veto mask and relaxed clip (docs/mu_grpo.md §2.2, §2.3, §7.1–7.4): hand-built ratios."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.core.objective import LossSettings, policy_objective
from rlvr.core.policy_loss import clipped_surrogate
from rlvr.core.veto import VETO_SCOPES, neg_veto_mask, veto_metrics, veto_triggers

LOG_D = math.log(1e-4)
RELAXED = LossSettings(epsilon=1.0, epsilon_high=4.0)


def _fixture():
    """Row 0: A<0, triggers at 2 and 5 (κ=2, κ'=5), 8 tokens. Row 1: same ratios, A>0.
    Row 2: A<0, no trigger. Row 3: A<0, trigger at 0, 3 tokens then padding."""
    T = 8
    lr = torch.full((4, T), -0.1)
    lr[0, 2] = lr[1, 2] = -12.0  # ρ ≈ 6e-6 < 1e-4
    lr[0, 5] = lr[1, 5] = -10.0  # later trigger
    lr[2, 3] = -9.0  # ρ ≈ 1.2e-4 ≥ 1e-4: not a trigger
    lr[3, 0] = -11.0
    M = torch.ones(4, T)
    M[3, 3:] = 0
    A = torch.tensor([-1.0, 1.0, -0.5, -2.0])
    return lr, A, M


def test_triggers_only_negative_masked_and_below_threshold():
    lr, A, M = _fixture()
    trig = veto_triggers(lr, A, M, 1e-4)
    assert trig[0].nonzero().flatten().tolist() == [2, 5]
    assert not trig[1].any() and not trig[2].any()
    assert trig[3].nonzero().flatten().tolist() == [0]
    lr2 = lr.clone()
    lr2[3, 5] = -20.0  # padding never triggers
    assert veto_triggers(lr2, A, M).sum() == trig.sum()


@pytest.mark.parametrize("scope", VETO_SCOPES)
def test_scope_masks_exact_sets(scope):
    lr, A, M = _fixture()
    veto = neg_veto_mask(lr, A, M, 1e-4, scope)
    vetoed = {(i, t) for i, t in (veto == 0).nonzero().tolist()}
    suffix0 = {(0, t) for t in (3, 4, 5, 6, 7)}  # strictly after κ=2, later trigger included
    suffix3 = {(3, 1), (3, 2)}  # after κ=0, masked-in only
    want = {
        "none": set(),
        "trigger_only": {(0, 2), (0, 5), (3, 0)},
        "suffix": suffix0 | suffix3,
        "nontrigger_suffix": (suffix0 - {(0, 5)}) | suffix3,
        "sequence": {(0, t) for t in range(8)} | {(3, 0), (3, 1), (3, 2)},
    }[scope]
    assert vetoed == want
    assert veto.dtype == lr.dtype and set(veto.unique().tolist()) <= {0.0, 1.0}


def test_unknown_scope_and_bad_threshold_raise():
    lr, A, M = _fixture()
    with pytest.raises(ValueError, match="veto_scope"):
        neg_veto_mask(lr, A, M, 1e-4, "prefix")
    with pytest.raises(ValueError, match="threshold"):
        neg_veto_mask(lr, A, M, 0.0)
    with pytest.raises(ValueError, match="advantages"):
        neg_veto_mask(lr, A[:3], M)


def test_per_token_advantages_veto_only_negative_tokens():
    lr, _, M = _fixture()
    A = torch.full((4, 8), -1.0)
    A[0, 6:] = 1.0  # positive tokens after the trigger are not vetoed
    veto = neg_veto_mask(lr, A, M, 1e-4, "suffix")
    assert veto[0].tolist() == [1, 1, 1, 0, 0, 0, 1, 1]


def _suffix_grad(denominator_tokens=None):
    lr, A, M = _fixture()
    old = torch.zeros_like(lr)
    logp = lr.clone().requires_grad_(True)  # logp − old = lr
    veto = neg_veto_mask(logp - old, A, M, 1e-4, "suffix")
    loss, _ = policy_objective(logp, old, A, M, RELAXED, None, extra_masks=[veto])
    (g,) = torch.autograd.grad(loss, logp)
    return g, lr, A, M, veto


def test_exact_zero_gradient_after_first_trigger():
    g, lr, A, M, veto = _suffix_grad()
    n_tokens = float((M * veto).sum())  # drop: vetoed tokens leave the token-mean denominator
    assert (g[0, 3:] == 0).all()  # every t > κ, the later trigger κ'=5 included: exactly 0
    assert (g[0, :2] != 0).all()  # before κ: ordinary gradient
    rho_k = math.exp(lr[0, 2].item())
    assert g[0, 2].item() == pytest.approx(-A[0].item() * rho_k / n_tokens, rel=1e-5)  # = |A|·ρ_κ/N
    assert abs(g[0, 2].item()) <= abs(A[0].item()) * rho_k / n_tokens * (1 + 1e-6)
    # the positive response with the same ratios keeps every token
    assert (veto[1] == 1).all() and (g[1] != 0).all()
    # a negative response without ρ < δ is unchanged: its gradient is the plain surrogate's
    assert (veto[2] == 1).all()
    want = -A[2] * torch.exp(lr[2]) / n_tokens
    assert torch.allclose(g[2], want, rtol=1e-5)


def test_reduces_to_grpo_when_rho_is_one():
    torch.manual_seed(0)
    logp0 = torch.randn(6, 7) - 2
    M = (torch.rand(6, 7) > 0.2).float()
    A = torch.randn(6)
    veto = neg_veto_mask(torch.zeros(6, 7), A, M)
    assert (veto == 1).all()
    lp1 = logp0.clone().requires_grad_(True)
    l1, _ = policy_objective(lp1, logp0, A, M, RELAXED, None, extra_masks=[veto])
    (g1,) = torch.autograd.grad(l1, lp1)
    lp2 = logp0.clone().requires_grad_(True)
    l2, _ = policy_objective(lp2, logp0, A, M, LossSettings(), None)  # core GRPO, ε = 0.2
    (g2,) = torch.autograd.grad(l2, lp2)
    want = -(A[:, None] * M).sum() / M.sum()  # −mean_t(A·ρ), ρ ≡ 1
    assert l1.item() == pytest.approx(want.item(), abs=1e-7)
    assert torch.allclose(g1, g2, rtol=1e-6, atol=1e-9)


def test_scope_none_standard_clip_equals_core_surrogate():
    torch.manual_seed(1)
    old = torch.randn(5, 6) - 2
    logp = (old + torch.randn(5, 6) * 3).requires_grad_(True)
    M = torch.ones(5, 6)
    A = torch.tensor([-1.0, 1.0, -0.3, 0.7, -2.0])
    s = LossSettings(epsilon=0.2, epsilon_high=0.2)
    veto = neg_veto_mask((logp - old).detach(), A, M, 1e-4, "none")
    l1, _ = policy_objective(logp, old, A, M, s, None, extra_masks=[veto])
    pg, _ = clipped_surrogate(logp, old, A, M, epsilon=0.2, epsilon_high=0.2)
    assert l1.item() == pytest.approx(pg.mean().item(), rel=1e-6)


def _per_token_grad(rho: float, adv: float) -> float:
    logp = torch.tensor([[math.log(rho)]], requires_grad=True)
    loss, _ = clipped_surrogate(logp, torch.zeros(1, 1), torch.tensor([adv]), torch.ones(1, 1),
                                epsilon=1.0, epsilon_high=4.0)
    (g,) = torch.autograd.grad(loss.sum(), logp)
    return g.item()


@pytest.mark.parametrize("rho", [1e-6, 0.01, 0.5, 1.0, 3.0, 4.99, 5.01, 20.0])
def test_relaxed_clip_positive_zero_iff_above_five(rho):
    g = _per_token_grad(rho, 1.0)
    assert (g == 0.0) == (rho > 5.0)
    if rho <= 5.0:
        assert g == pytest.approx(-rho, rel=1e-5)  # A·ρ·∇logπ, minimised


@pytest.mark.parametrize("rho", [1e-6, 0.01, 0.5, 1.0, 5.01, 100.0])
def test_relaxed_clip_negative_never_clipped(rho):
    g = _per_token_grad(rho, -1.0)
    assert g != 0.0 and g == pytest.approx(rho, rel=1e-5)  # |A|·ρ, → 0 as ρ → 0


def test_clip_fraction_standard_much_larger_than_relaxed():
    gen = torch.Generator().manual_seed(0)
    lr = torch.randn(64, 64, generator=gen) * 0.5  # a stale-looking ratio spread
    A = torch.randn(64, generator=gen)
    M = torch.ones(64, 64)

    def frac(eps, eps_high):
        _, info = clipped_surrogate(lr, torch.zeros_like(lr), A, M, epsilon=eps, epsilon_high=eps_high)
        return info["clip_region"].mean().item()

    std, relaxed = frac(0.2, 0.2), frac(1.0, 4.0)
    assert std > 0.2 and relaxed < 0.01 and std > 20 * relaxed


def test_metrics_pairs_by_hand():
    lr, A, M = _fixture()
    veto = neg_veto_mask(lr, A, M, 1e-4, "suffix")
    m = veto_metrics(lr, A, M, veto, 1e-4)
    assert m["mu_grpo/veto_response_rate"] == (2.0, 3.0)  # rows 0 and 3 of the negative rows 0, 2, 3
    assert m["mu_grpo/veto_token_frac"] == (7.0, 27.0)  # 5 + 2 vetoed of 8 + 8 + 8 + 3
    num, den = m["mu_grpo/trigger_pos_frac"]
    assert den == 2.0 and num == pytest.approx(2 / 8 + 0 / 3)
    neg_tok = (M > 0) & (A[:, None] < 0)
    num, den = m["mu_grpo/ratio_neg_mean"]
    assert den == 19.0 and num == pytest.approx(lr.exp()[neg_tok].sum().item(), rel=1e-6)
    assert m["mu_grpo/ratio_pos_mean"][1] == 8.0


def test_brute_force_suffix_on_random_ratios():
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        lr = torch.randn(5, 9, generator=gen) * 6
        M = (torch.rand(5, 9, generator=gen) > 0.15).float()
        A = torch.randn(5, generator=gen)
        veto = neg_veto_mask(lr, A, M, 1e-3, "suffix")
        for i in range(5):
            seen = False
            for t in range(9):
                want = 0.0 if (seen and M[i, t] > 0 and A[i] < 0) else 1.0
                assert veto[i, t].item() == want
                if M[i, t] > 0 and A[i] < 0 and lr[i, t] < math.log(1e-3):
                    seen = True


def _prefix_fixture():
    """Row 0: A<0, no token below δ = 1e-4 (log δ ≈ −9.21) but the prefix sums −3, −6, −9.5, −9.6, −9.7,
    −4.7, −4.8, −4.9 are below it at t = 2, 3, 4 (κ = 2). Row 1: same ratios, A>0. Row 2: A<0, a padding
    token (t = 2, log ρ = −20) that neither triggers nor enters the sum; sums −5, −9, ·, −9.5, ... (κ = 3)."""
    lr = torch.tensor([[-3.0, -3.0, -3.5, -0.1, -0.1, 5.0, -0.1, -0.1],
                       [-3.0, -3.0, -3.5, -0.1, -0.1, 5.0, -0.1, -0.1],
                       [-5.0, -4.0, -20.0, -0.5, -0.1, -0.1, -0.1, -0.1]])
    M = torch.ones(3, 8)
    M[2, 2] = 0
    return lr, torch.tensor([-1.0, 1.0, -2.0]), M


def test_prefix_trigger_by_hand():
    lr, A, M = _prefix_fixture()
    assert not veto_triggers(lr, A, M, 1e-4, "token").any()  # no single token ratio below δ
    trig = veto_triggers(lr, A, M, 1e-4, "prefix")
    assert trig[0].nonzero().flatten().tolist() == [2, 3, 4]  # the ratio 148 at t = 5 lifts the product above δ
    assert not trig[1].any()  # positive advantage
    assert trig[2].nonzero().flatten().tolist() == [3, 4, 5, 6, 7]  # padding skipped in the sum and as a trigger
    veto = neg_veto_mask(lr, A, M, 1e-4, "suffix", "prefix")
    assert veto[0].tolist() == [1, 1, 1, 0, 0, 0, 0, 0] and (veto[1] == 1).all()
    assert veto[2].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    assert veto_triggers(lr, A, M, 1e-2, "prefix")[0].nonzero().flatten().tolist() == [1, 2, 3, 4, 5, 6, 7]  # log δ ≈ −4.61
    assert (neg_veto_mask(lr, A, M, 1e-4, "suffix", "token") == 1).all()
    m = veto_metrics(lr, A, M, veto, 1e-4, "prefix")
    assert m["mu_grpo/veto_response_rate"] == (2.0, 2.0)
    num, den = m["mu_grpo/trigger_pos_frac"]
    assert den == 2.0 and num == pytest.approx(2 / 8 + 2 / 7)  # row 2: κ = 3 is the 3rd masked-in token (index 2)
    assert veto_metrics(lr, A, M, veto, 1e-4, "token")["mu_grpo/veto_response_rate"] == (0.0, 2.0)
    with pytest.raises(ValueError, match="veto_trigger"):
        neg_veto_mask(lr, A, M, 1e-4, "suffix", "cumulative")


def test_prefix_trigger_zeroes_suffix_gradient():
    lr, A, M = _prefix_fixture()
    logp = lr.clone().requires_grad_(True)  # old = 0: logp − old = lr
    veto = neg_veto_mask(logp.detach(), A, M, 1e-4, "suffix", "prefix")
    loss, _ = policy_objective(logp, torch.zeros_like(lr), A, M, RELAXED, None, extra_masks=[veto])
    (g,) = torch.autograd.grad(loss, logp)
    n_tokens = float((M * veto).sum())  # 24 − 1 padding − 5 − 4 vetoed = 14
    assert n_tokens == 14.0
    assert (g[0, 3:] == 0).all() and (g[2, 4:] == 0).all() and g[2, 2] == 0  # vetoed suffixes, padding
    # before and at κ: the surrogate's −A·ρ/N (negative advantages are never clipped in the relaxed window)
    for i, ts in ((0, [0, 1, 2]), (2, [0, 1, 3])):
        for t in ts:
            assert g[i, t].item() == pytest.approx(-A[i].item() * math.exp(lr[i, t].item()) / n_tokens, rel=1e-5)
    assert (g[1, [0, 1, 2, 3, 4, 6, 7]] != 0).all()  # the positive row keeps its tokens (t = 5, ρ > 5, is clipped)
    assert g[1, 5] == 0

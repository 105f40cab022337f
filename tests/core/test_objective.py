"""grpo_core.md §10–§11, acceptance §14.2 (global scope through the whole objective), §14.4, §14.5, §14.6."""

import math

import pytest
import torch

from rlvr.core import (
    LOSS_AGG_MODES,
    LossSettings,
    aggregate,
    grpo_advantages,
    policy_objective,
    reduce_objective_metrics,
    truncation_mask,
)
from rlvr.registry import UnknownNameError

# ragged [3, 5] weights: n_i = 3, 5, 1; Σ W = 9; B = 3
W = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float64)
A = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)


def _logp():
    return torch.tensor(
        [[-0.5, -1.0, -2.0, -0.1, -0.3], [-0.2, -0.7, -1.5, -0.9, -3.0], [-0.05, -4.0, -1.0, -1.0, -1.0]],
        dtype=torch.float64,
        requires_grad=True,
    )


def S(mode="token-mean", **kw):
    if mode == "seq-mean-token-sum-norm":
        kw.setdefault("loss_scale_factor", 10.0)
    return LossSettings(loss_agg_mode=mode, **kw)


# ---------------------------------------------------------------- §14.4 on-policy reduction, hand values

# With old_logp = sg(logp): ρ ≡ 1 and L = −agg(A) in value; the gradient is −A_i · ∂agg/∂X[i,t]:
#   token-mean:              loss −(1·3 − 2·5 + 0.5·1)/9 = 6.5/9 ; grad −A_i/9 on kept tokens
#   token-sum:               loss 6.5                       ; grad −A_i
#   seq-mean-token-sum:      loss 6.5/3                     ; grad −A_i/3
#   seq-mean-token-mean:     loss −(1 − 2 + 0.5)/3 = 0.5/3  ; grad −A_i/(3·n_i): −1/9, 2/15, −1/6
#   seq-mean-token-sum-norm: loss 6.5/30 (C = 10)           ; grad −A_i/30
ON_POLICY = {
    "token-mean": (6.5 / 9, [-1 / 9, 2 / 9, -0.5 / 9]),
    "token-sum": (6.5, [-1.0, 2.0, -0.5]),
    "seq-mean-token-sum": (6.5 / 3, [-1 / 3, 2 / 3, -0.5 / 3]),
    "seq-mean-token-mean": (0.5 / 3, [-1 / 9, 2 / 15, -1 / 6]),
    "seq-mean-token-sum-norm": (6.5 / 30, [-1 / 30, 2 / 30, -0.5 / 30]),
}


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_on_policy_reduction_hand_values(mode):
    logp = _logp()
    settings = S(mode)
    d = settings.denominators(W)
    loss, m = policy_objective(logp, None, A, W, settings, d)
    value, row_grads = ON_POLICY[mode]
    assert loss.item() == pytest.approx(value, abs=1e-12)
    (g,) = torch.autograd.grad(loss, logp)
    expected = W * torch.tensor(row_grads, dtype=torch.float64)[:, None]
    assert torch.allclose(g, expected, atol=1e-12)
    # ρ ≡ 1 exactly, no clipping
    assert m["_tokens"].item() == 9
    assert m["ratio"].item() == 9.0
    assert m["ratio/min"].item() == 1.0 and m["ratio/max"].item() == 1.0
    for k in ("clip_ratio/low", "clip_ratio/high", "clip_ratio/region", "clip_ratio/dual", "approx_kl_old"):
        assert m[k].item() == 0.0


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("level", ["token", "sequence", "sequence_token"])
def test_on_policy_gradient_is_reinforce_with_group_baseline(mode, level):
    # logp depends on parameters θ; ∇θ L must equal −∇θ agg(A · logp) (REINFORCE with the group baseline)
    g = torch.Generator().manual_seed(3)
    feats = torch.randn(3, 5, 4, generator=g, dtype=torch.float64)
    theta = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    logp = torch.nn.functional.logsigmoid(feats @ theta)
    settings = S(mode, importance_sampling_level=level, epsilon=0.2, epsilon_high=0.28)
    loss, _ = policy_objective(logp, None, A, W, settings, None)
    (g_loss,) = torch.autograd.grad(loss, theta)
    logp = torch.nn.functional.logsigmoid(feats @ theta)
    if level == "sequence":
        # GSPO: every token of row i carries the row's mean log-prob, so the REINFORCE form is
        # −agg(A_i · mean_t logp[i]) (identical to the token form under seq-mean-token-mean)
        row_mean = (logp * W).sum(1, keepdim=True) / W.sum(1, keepdim=True)
        logp = row_mean.expand_as(logp)
    reinforce = -aggregate(A[:, None] * logp, W, mode, loss_scale_factor=settings.loss_scale_factor)
    (g_ref,) = torch.autograd.grad(reinforce, theta)
    assert torch.allclose(g_loss, g_ref, atol=1e-12)
    assert g_loss.abs().max() > 1e-3  # the gradient is not trivially zero


def test_trainer_old_logp_gives_ratio_exactly_one():
    # old_logprob_source=trainer: recomputed at the generation-time weights = the same numbers
    logp = _logp()
    old = logp.detach().clone()
    settings = S("token-mean", clip_ratio_c=3.0)
    loss, m = policy_objective(logp, old, A, W, settings, None)
    loss0, _ = policy_objective(logp, None, A, W, settings, None)
    assert loss.item() == loss0.item()
    assert m["ratio/min"].item() == 1.0 and m["ratio/max"].item() == 1.0
    assert m["ratio"].item() == m["_tokens"].item()


def test_policy_loss_near_zero_with_centred_advantages_but_gradient_not():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv = grpo_advantages(r, torch.zeros(4, dtype=torch.long)).double()
    logp = torch.full((4, 3), -1.0, dtype=torch.float64, requires_grad=True)
    loss, _ = policy_objective(logp, None, adv, torch.ones(4, 3, dtype=torch.float64), S(), None)
    assert abs(loss.item()) < 1e-12
    (g,) = torch.autograd.grad(loss, logp)
    assert g.abs().min() > 0.05


# ---------------------------------------------------------------- §10 total loss, KL, entropy, metrics


def test_total_loss_hand_values():
    # logp [−1, −2], ref [−1.5, −1], A = 1, H = [2, 3], token-mean, beta 0.1 (k2), entropy_coef 0.01
    #   policy  −1 ;  k2 = ½Δ² = [0.125, 0.5] -> mean 0.3125 -> ·0.1 = 0.03125 ;  entropy mean 2.5 -> −0.025
    #   total −0.99375 ; d/dlogp = −A/2 + 0.1·(logp − ref)/2 = [−0.475, −0.55] ; d/dH = −0.01/2
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)
    H = torch.tensor([[2.0, 3.0]], dtype=torch.float64, requires_grad=True)
    settings = LossSettings(beta=0.1, kl_estimator="mse", entropy_coef=0.01)
    loss, m = policy_objective(logp, None, torch.tensor([1.0]), torch.ones(1, 2), settings, None, ref_logp=ref, entropy=H)
    assert loss.item() == pytest.approx(-0.99375, abs=1e-14)
    gl, gh = torch.autograd.grad(loss, (logp, H))
    assert gl[0].tolist() == pytest.approx([-0.475, -0.55], abs=1e-14)
    assert gh[0].tolist() == pytest.approx([-0.005, -0.005], abs=1e-14)
    assert m["loss/policy"].item() == pytest.approx(-1.0)
    assert m["loss/kl"].item() == pytest.approx(0.03125)
    assert m["loss/entropy"].item() == pytest.approx(-0.025)
    assert m["loss/total"].item() == pytest.approx(-0.99375)
    assert m["kl"].item() == pytest.approx(0.625) and m["entropy"].item() == pytest.approx(5.0)
    assert m["_tokens"].item() == 2
    assert all(not v.requires_grad and v.dim() == 0 for v in m.values())


def test_k3_plus_gradient_through_objective():
    # value: k3 mean = (0.10653065971263342 + 0.7182818284590451)/2 ; gradient: (logp − ref)/2
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)
    settings = LossSettings(beta=1.0, kl_estimator="low_var_kl+")
    assert settings.kl_estimator == "k3+"
    loss, m = policy_objective(logp, None, torch.tensor([0.0]), torch.ones(1, 2), settings, None, ref_logp=ref)
    assert m["loss/kl"].item() == pytest.approx((0.10653065971263342 + 0.7182818284590451) / 2, abs=1e-14)
    (g,) = torch.autograd.grad(loss, logp)
    assert g[0].tolist() == pytest.approx([0.25, -0.5], abs=1e-14)


def test_kl_is_correction_k1_keeps_the_gradient_through_the_ratio():
    # token 0: ρ = 2, token 1: ρ = 1; A = 0 isolates the KL; k1 = logp − ref = [0.5, −1]
    #   corrected:   mean(2·0.5, 1·(−1)) = 0 ; d/dlogp (ρ·k1)/2 = ρ(k1 + 1)/2 = [1.5, 0]
    #   uncorrected: mean(0.5, −1) = −0.25   ; d/dlogp = [0.5, 0.5]
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.0 - math.log(2.0), -2.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)
    for corr, value, grad in ((True, 0.0, [1.5, 0.0]), (False, -0.25, [0.5, 0.5])):
        settings = LossSettings(beta=1.0, kl_estimator="k1", kl_is_correction=corr)
        loss, _ = policy_objective(logp, old, torch.tensor([0.0]), torch.ones(1, 2), settings, None, ref_logp=ref)
        assert loss.item() == pytest.approx(value, abs=1e-14)
        (g,) = torch.autograd.grad(loss, logp)
        assert g[0].tolist() == pytest.approx(grad, abs=1e-14)


def test_beta_zero_with_ref_only_logs_kl():
    logp = _logp()
    ref = logp.detach() - 0.3
    loss_a, m = policy_objective(logp, None, A, W, S(), None, ref_logp=ref)
    loss_b, m_b = policy_objective(logp, None, A, W, S(), None)
    assert loss_a.item() == loss_b.item()
    assert m["kl"].item() == pytest.approx(9 * (math.exp(-0.3) + 0.3 - 1), abs=1e-12)  # k3 of Δ = −0.3
    assert m["loss/kl"].item() == 0.0
    assert "kl" not in m_b and "entropy" not in m_b


def test_clip_metrics_are_masked_sums():
    # ρ per token (row 0): [0.5, 1.5, 1.0 (masked)]; A = [−1] -> low at token 0; dual (c = 1.3) at token 1
    logp = torch.log(torch.tensor([[0.5, 1.5, 1.0]], dtype=torch.float64)).requires_grad_(True)
    old = torch.zeros(1, 3, dtype=torch.float64)
    w = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    settings = LossSettings(clip_ratio_c=1.3)
    _, m = policy_objective(logp, old, torch.tensor([-1.0]), w, settings, None)
    assert m["_tokens"].item() == 2
    assert m["ratio"].item() == pytest.approx(2.0)
    assert m["clip_ratio/low"].item() == 1 and m["clip_ratio/dual"].item() == 1
    assert m["clip_ratio/high"].item() == 0 and m["clip_ratio/region"].item() == 1
    assert m["ratio/min"].item() == pytest.approx(0.5) and m["ratio/max"].item() == pytest.approx(1.5)
    # approx_kl_old = Σ (old − logp) = −ln 0.5 − ln 1.5 = 0.2876820724517809
    assert m["approx_kl_old"].item() == pytest.approx(0.2876820724517809, abs=1e-12)
    red = reduce_objective_metrics([m])
    assert red["actor/clip_ratio/low"] == pytest.approx(0.5) and red["actor/ratio"] == pytest.approx(1.0)
    assert red["actor/ratio/min"] == pytest.approx(0.5) and red["actor/num_loss_tokens"] == 2


def test_all_masked_microbatch():
    logp = _logp()
    loss, m = policy_objective(logp, None, A, torch.zeros_like(W), S(), None)
    assert loss.item() == 0.0 and loss.requires_grad
    assert m["_tokens"].item() == 0
    assert m["ratio/min"].item() == math.inf and m["ratio/max"].item() == -math.inf


# ---------------------------------------------------------------- §14.6 truncation mask


def test_truncated_completions_zero_loss_and_denominator_but_keep_rewards():
    # group [1, 0, 0, 1], row 3 truncated; advantages over all 4: ±0.8660254037844386 (test_advantages)
    r = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    adv = grpo_advantages(r, torch.zeros(4, dtype=torch.long), adv_eps=0.0)
    M = torch.ones(4, 2, dtype=torch.float64)
    trunc = truncation_mask(torch.tensor([False, False, False, True]), 2).double()
    settings = S("token-mean")
    d = settings.denominators(M * trunc)
    assert d.token_weight == 6  # row 3's tokens are out of the denominator
    logp = torch.full((4, 2), -1.0, dtype=torch.float64, requires_grad=True)
    loss, m = policy_objective(logp, None, adv, M, settings, d, extra_masks=[trunc])
    # −(A_0·2 + A_1·2 + A_2·2)/6 = 0.8660254037844386/3
    assert loss.item() == pytest.approx(0.28867513459481287, abs=1e-12)
    (g,) = torch.autograd.grad(loss, logp)
    assert torch.equal(g[3], torch.zeros(2, dtype=torch.float64))
    assert m["_tokens"].item() == 6
    # without the mask the 4 centred advantages cancel: loss 0
    loss_nomask, _ = policy_objective(logp, None, adv, M, settings, None)
    assert abs(loss_nomask.item()) < 1e-12


# ---------------------------------------------------------------- global scope through the objective (§14.2)


def _batch(seed):
    g = torch.Generator().manual_seed(seed)
    N, T, H = 8, 6, 3
    feats = torch.randn(N, T, H, generator=g, dtype=torch.float64)
    theta = torch.randn(H, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([6, 1, 3, 0, 5, 2, 6, 4])
    M = (torch.arange(T)[None] < lengths[:, None]).double()
    old = torch.nn.functional.logsigmoid(feats @ theta.detach() + 1.5 * torch.randn(N, T, generator=g, dtype=torch.float64))
    ref = old + 0.2 * torch.randn(N, T, generator=g, dtype=torch.float64)
    adv = torch.randn(N, generator=g, dtype=torch.float64)
    trunc = truncation_mask(torch.tensor([0, 0, 1, 0, 0, 0, 0, 1]).bool(), T).double()
    return feats, theta, M, old, ref, adv, trunc


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_objective_micro_batch_invariance(mode):
    feats, theta, M, old, ref, adv, trunc = _batch(1)
    settings = S(mode, epsilon=0.2, epsilon_high=0.28, clip_ratio_c=2.0, beta=0.05, kl_estimator="k3+",
                 entropy_coef=0.01, kl_is_correction=True)

    def micro(rows, d):
        logp = torch.nn.functional.logsigmoid(feats[rows] @ theta)
        ent = -logp * 0.5  # a differentiable stand-in for the entropy
        return policy_objective(logp, old[rows], adv[rows], M[rows], settings, d, ref_logp=ref[rows], entropy=ent,
                                extra_masks=[trunc[rows]])

    d = settings.denominators(M * trunc)
    full, m_full = micro(list(range(8)), d)
    (g_full,) = torch.autograd.grad(full, theta)
    # clipping, dual clip and the truncation mask are exercised
    assert m_full["clip_ratio/region"].item() > 0 and m_full["clip_ratio/dual"].item() > 0
    red_full = reduce_objective_metrics([m_full])
    for k in (2, 4):
        outs = [micro(list(range(i, 8, k)), d) for i in range(k)]
        total = sum(o[0] for o in outs)
        (g,) = torch.autograd.grad(total, theta)
        assert total.item() == pytest.approx(full.item(), abs=1e-6)
        assert torch.allclose(g, g_full, atol=1e-6, rtol=0)
        red = reduce_objective_metrics([o[1] for o in outs])
        assert red.keys() == red_full.keys()
        for key in red:
            assert red[key] == pytest.approx(red_full[key], abs=1e-9), key


# ---------------------------------------------------------------- validation


def test_settings_validation():
    for kw in (
        {"epsilon": 0.0},
        {"epsilon_high": -1.0},
        {"clip_ratio_c": 0.9},
        {"importance_sampling_level": "seq"},
        {"loss_agg_mode": "token_mean"},
        {"seq_denominator": "any"},
        {"loss_agg_mode": "seq-mean-token-sum-norm"},
        {"loss_scale_factor": 0.0},
        {"beta": -0.1},
        {"kl_estimator": "k9"},
    ):
        with pytest.raises(ValueError):
            LossSettings(**kw)
    with pytest.raises(Exception):
        LossSettings().beta = 1.0  # frozen


def test_objective_validation():
    logp = _logp()
    with pytest.raises(ValueError, match="ref_logp"):
        policy_objective(logp, None, A, W, LossSettings(beta=0.1), None)
    with pytest.raises(ValueError, match="entropy"):
        policy_objective(logp, None, A, W, LossSettings(entropy_coef=0.1), None)
    with pytest.raises(ValueError, match="shape"):
        policy_objective(logp, None, A, W[:, :4], LossSettings(), None)
    with pytest.raises(UnknownNameError, match="POLICY_LOSSES"):
        policy_objective(logp, None, A, W, LossSettings(policy_loss="cispo"), None)
    d = S("token-sum").denominators(W)
    with pytest.raises(ValueError, match="computed for"):
        policy_objective(logp, None, A, W, S("token-mean"), d)

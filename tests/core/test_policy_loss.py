"""grpo_core.md §5, acceptance §14.3 (clipping) and §14.7 (GSPO).

Hand grid (epsilon = 0.2, epsilon_high = 0.28, so the window is [0.8, 1.28]):

    ρ                 0.5    0.9    1.0    1.1    1.25   1.5
    A = +1: L = −min(ρ, clip ρ)
                      −0.5   −0.9   −1.0   −1.1   −1.25  −1.28      (ρ > 1.28 clipped)
        dL/dlogp = −Aρ unless clipped:
                      −0.5   −0.9   −1.0   −1.1   −1.25   0
    A = −1: L = max(ρ, clip ρ)
                      0.8    0.9    1.0    1.1    1.25   1.5        (ρ < 0.8 clipped; above 1.28 unbounded)
        dL/dlogp:      0     0.9    1.0    1.1    1.25   1.5
    A = −1, clip_ratio_c = 1.3: L = min(L, 1.3)
                      0.8    0.9    1.0    1.1    1.25   1.3
        dL/dlogp:      0     0.9    1.0    1.1    1.25   0
    A = +1, symmetric epsilon_high = None (window [0.8, 1.2]):
                      −0.5   −0.9   −1.0   −1.1   −1.2   −1.2
        dL/dlogp:     −0.5   −0.9   −1.0   −1.1    0      0
"""

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rlvr.core import (
    POLICY_LOSSES,
    aggregate,
    clipped_surrogate,
    get_policy_loss,
    importance_log_ratio,
)
from rlvr.registry import UnknownNameError

RHO = [0.5, 0.9, 1.0, 1.1, 1.25, 1.5]


def run(A, rho=RHO, **kw):
    logp = torch.tensor([math.log(r) for r in rho], dtype=torch.float64)[None].requires_grad_(True)
    old = torch.zeros_like(logp)
    mask = torch.ones_like(logp)
    loss, info = clipped_surrogate(logp, old, torch.tensor([A], dtype=torch.float64), mask, **kw)
    (g,) = torch.autograd.grad(loss.sum(), logp)
    return loss.detach()[0].tolist(), g[0].tolist(), {k: v[0].tolist() for k, v in info.items()}


def approx_list(a, b, tol=1e-12):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x == pytest.approx(y, abs=tol), (a, b)


def test_positive_advantage_clip_higher():
    loss, grad, info = run(1.0, epsilon=0.2, epsilon_high=0.28)
    approx_list(loss, [-0.5, -0.9, -1.0, -1.1, -1.25, -1.28])
    approx_list(grad, [-0.5, -0.9, -1.0, -1.1, -1.25, 0.0])
    assert info["clip_high"] == [0, 0, 0, 0, 0, 1]
    assert info["clip_low"] == [0] * 6
    assert info["clip_region"] == [0, 0, 0, 0, 0, 1]
    assert info["clip_dual"] == [0] * 6
    approx_list(info["ratio"], RHO)


def test_positive_advantage_symmetric():
    loss, grad, info = run(1.0, epsilon=0.2)
    approx_list(loss, [-0.5, -0.9, -1.0, -1.1, -1.2, -1.2])
    approx_list(grad, [-0.5, -0.9, -1.0, -1.1, 0.0, 0.0])
    assert info["clip_high"] == [0, 0, 0, 0, 1, 1]


def test_negative_advantage():
    loss, grad, info = run(-1.0, epsilon=0.2, epsilon_high=0.28)
    approx_list(loss, [0.8, 0.9, 1.0, 1.1, 1.25, 1.5])
    approx_list(grad, [0.0, 0.9, 1.0, 1.1, 1.25, 1.5])
    assert info["clip_low"] == [1, 0, 0, 0, 0, 0]
    assert info["clip_high"] == [0] * 6
    assert info["clip_region"] == [1, 0, 0, 0, 0, 0]
    assert info["clip_dual"] == [0] * 6


def test_negative_advantage_dual_clip():
    loss, grad, info = run(-1.0, epsilon=0.2, epsilon_high=0.28, clip_ratio_c=1.3)
    approx_list(loss, [0.8, 0.9, 1.0, 1.1, 1.25, 1.3])
    approx_list(grad, [0.0, 0.9, 1.0, 1.1, 1.25, 0.0])
    assert info["clip_dual"] == [0, 0, 0, 0, 0, 1]
    assert info["clip_low"] == [1, 0, 0, 0, 0, 0]


def test_advantage_scale_and_zero():
    loss, grad, _ = run(2.0, epsilon=0.2, epsilon_high=0.28)
    approx_list(loss, [-1.0, -1.8, -2.0, -2.2, -2.5, -2.56])
    approx_list(grad, [-1.0, -1.8, -2.0, -2.2, -2.5, 0.0])
    loss, grad, info = run(0.0, epsilon=0.2)
    assert loss == [0.0] * 6 and grad == [0.0] * 6
    assert info["clip_region"] == [0] * 6


@settings(max_examples=60, deadline=None)
@given(
    log_rho=st.floats(-1.5, 1.5),
    A=st.sampled_from([-2.0, -0.3, 0.3, 1.7]),
    eps=st.floats(0.05, 0.5),
    eps_high=st.floats(0.0, 0.6),
    c=st.one_of(st.none(), st.floats(1.05, 4.0)),
)
def test_zero_gradient_iff_clip_condition(log_rho, A, eps, eps_high, c):
    rho = math.exp(log_rho)
    bounds = [1 - eps, 1 + eps_high] + ([c] if c is not None else [])
    assume(all(abs(rho - b) > 1e-6 for b in bounds))
    logp = torch.tensor([[log_rho]], dtype=torch.float64, requires_grad=True)
    loss, info = clipped_surrogate(
        logp, torch.zeros_like(logp), torch.tensor([A], dtype=torch.float64), torch.ones_like(logp),
        epsilon=eps, epsilon_high=eps_high, clip_ratio_c=c,
    )
    (g,) = torch.autograd.grad(loss.sum(), logp)
    if A > 0:
        zero = rho > 1 + eps_high
    else:
        zero = rho < 1 - eps or (c is not None and rho > c)
    assert (float(g) == 0.0) == zero
    if not zero:
        assert float(g) == pytest.approx(-A * rho, rel=1e-12)
    # value agrees with the max/min form of the spec
    v = max(-A * rho, -A * min(max(rho, 1 - eps), 1 + eps_high))
    if A < 0 and c is not None:
        v = min(v, -A * c)
    assert loss.item() == pytest.approx(v, rel=1e-12, abs=1e-15)
    # indicators (§5.5)
    assert float(info["clip_low"]) == float(rho < 1 - eps and A < 0)
    assert float(info["clip_high"]) == float(rho > 1 + eps_high and A > 0)
    assert float(info["clip_dual"]) == float(c is not None and A < 0 and rho > c)


def test_gradient_flows_at_exact_bounds():
    # the clip conditions are strict: ρ equal to a bound is not clipped (gradient −A·ρ flows)
    def grad_at(log_rho, A, **kw):
        logp = torch.tensor([[log_rho]], dtype=torch.float64, requires_grad=True)
        loss, info = clipped_surrogate(logp, torch.zeros_like(logp), torch.tensor([A], dtype=torch.float64),
                                       torch.ones_like(logp), **kw)
        (g,) = torch.autograd.grad(loss.sum(), logp)
        return info["ratio"].item(), g.item(), info["clip_region"].item() + info["clip_dual"].item()

    rho, g, clipped = grad_at(0.0, 1.0, epsilon_high=0.0)  # ρ = 1 = 1 + epsilon_high
    assert rho == 1.0 and g == -1.0 and clipped == 0.0
    rho, g, clipped = grad_at(math.log(0.5), -1.0, epsilon=0.5)  # ρ = 0.5 = 1 − epsilon
    assert rho == 0.5 and g == pytest.approx(0.5) and clipped == 0.0
    rho, g, clipped = grad_at(math.log(2.0), -1.0, clip_ratio_c=2.0)  # ρ = 2 = clip_ratio_c
    assert rho == 2.0 and g == pytest.approx(2.0) and clipped == 0.0


def test_advantage_shapes_broadcast():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 4, generator=g, dtype=torch.float64) * 0.3
    old = torch.zeros_like(logp)
    mask = torch.ones_like(logp)
    A = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    l1, _ = clipped_surrogate(logp, old, A, mask)
    l2, _ = clipped_surrogate(logp, old, A[:, None], mask)
    l3, _ = clipped_surrogate(logp, old, A[:, None].expand(3, 4).clone(), mask)
    assert torch.equal(l1, l2) and torch.equal(l1, l3)
    At = torch.tensor([[1.0, -1.0, 0.0, 2.0]] * 3, dtype=torch.float64)  # per-token advantages
    l4, _ = clipped_surrogate(torch.zeros_like(logp), old, At, mask)
    assert torch.equal(l4, -At)  # ρ = 1
    with pytest.raises(ValueError, match="advantages"):
        clipped_surrogate(logp, old, torch.ones(2), mask)


def test_old_logp_none_means_on_policy():
    logp = torch.tensor([[-0.3, -2.0]], requires_grad=True)
    loss, info = clipped_surrogate(logp, None, torch.tensor([1.5]), torch.ones(1, 2))
    assert torch.equal(info["ratio"], torch.ones(1, 2))
    assert torch.equal(loss.detach(), torch.full((1, 2), -1.5))


def test_token_log_ratio_clamped():
    logp = torch.tensor([[50.0, -50.0, 3.0]], dtype=torch.float64)
    lr = importance_log_ratio(logp, torch.zeros_like(logp), torch.ones_like(logp), "token")
    assert lr.tolist() == [[20.0, -20.0, 3.0]]
    _, info = clipped_surrogate(logp, torch.zeros_like(logp), torch.tensor([-1.0], dtype=torch.float64),
                                torch.ones_like(logp))
    assert float(info["ratio"][0, 0]) == pytest.approx(485165195.4097903, rel=1e-12)  # e^20
    assert torch.isfinite(info["ratio"]).all()


def test_validation():
    logp = torch.zeros(1, 2)
    m = torch.ones(1, 2)
    A = torch.ones(1)
    for kw in ({"epsilon": 0.0}, {"epsilon": 1.5}, {"epsilon_high": -0.1}, {"clip_ratio_c": 1.0},
               {"importance_sampling_level": "seq"}):
        with pytest.raises(ValueError):
            clipped_surrogate(logp, logp, A, m, **kw)
    with pytest.raises(ValueError, match="shape"):
        importance_log_ratio(logp, torch.zeros(1, 3), m)


def test_registry():
    assert POLICY_LOSSES["clipped"] is clipped_surrogate  # variants may register more (e.g. "fbos_epa")
    assert get_policy_loss("clipped") is clipped_surrogate
    for name in ("cispo", "sapo", "luspo", "vespo", "grpo", "nope"):
        with pytest.raises(ValueError, match="POLICY_LOSSES") as e:
            get_policy_loss(name)
        assert isinstance(e.value, KeyError) and isinstance(e.value, UnknownNameError)
        assert "'clipped'" in str(e.value)
    with pytest.raises(ValueError, match="separate objective"):
        get_policy_loss("cispo")


# ---------------------------------------------------------------- GSPO (§5.1, §14.7)

# row 0: logp − old = [0.1, 0.3, 0.5], mask [1, 1, 0] -> log s = 0.2, s = e^0.2 = 1.2214027581601699
# row 1: logp − old = [−0.2, 0.0, 0.2], mask [1, 1, 1] -> log s = 0, s = 1
DIFF = torch.tensor([[0.1, 0.3, 0.5], [-0.2, 0.0, 0.2]], dtype=torch.float64)
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.1, -3.0]], dtype=torch.float64)


def test_sequence_ratio_shared_and_equal_to_exp_mean():
    logp = (OLD + DIFF).requires_grad_(True)
    lr = importance_log_ratio(logp, OLD, MASK, "sequence")
    assert torch.allclose(lr.detach(), torch.tensor([[0.2] * 3, [0.0] * 3], dtype=torch.float64), atol=1e-15)
    _, info = clipped_surrogate(logp, OLD, torch.tensor([1.0, -1.0]), MASK, importance_sampling_level="sequence")
    assert torch.allclose(info["ratio"][0], torch.full((3,), 1.2214027581601699, dtype=torch.float64), atol=1e-15)
    assert torch.allclose(info["ratio"][1], torch.ones(3, dtype=torch.float64), atol=1e-15)
    # gradient of the row's log-ratio flows through every masked token with weight 1/n_i
    (g,) = torch.autograd.grad(lr[0, 0] + lr[1, 2], logp)
    assert torch.allclose(g, torch.tensor([[0.5, 0.5, 0.0], [1 / 3] * 3], dtype=torch.float64))


def test_gspo_loss_gradient_hand_values():
    # A = [1, −1], seq-mean-token-mean: loss = (−s_0 + s_1)/2 (no clip: s_0 = 1.2214 < 1.28)
    # dloss/dlogp[0, t] = −s_0 · 1/2 · 1/2 = −0.30535068954004246 on the two masked tokens
    # dloss/dlogp[1, t] = +1 · 1/2 · 1/3 = 0.16666666666666666
    logp = (OLD + DIFF).requires_grad_(True)
    A = torch.tensor([1.0, -1.0], dtype=torch.float64)
    L, _ = clipped_surrogate(logp, OLD, A, MASK, epsilon=0.2, epsilon_high=0.28, importance_sampling_level="sequence")
    loss = aggregate(L, MASK, "seq-mean-token-mean")
    assert loss.item() == pytest.approx((-1.2214027581601699 + 1.0) / 2, abs=1e-14)
    (g,) = torch.autograd.grad(loss, logp)
    expected = torch.tensor([[-0.30535068954004246] * 2 + [0.0], [1 / 6] * 3], dtype=torch.float64)
    assert torch.allclose(g, expected, atol=1e-14)
    # with a symmetric 0.2 window s_0 > 1.2 and A_0 > 0: the whole row is clipped
    L, info = clipped_surrogate(logp, OLD, A, MASK, epsilon=0.2, importance_sampling_level="sequence")
    (g,) = torch.autograd.grad(aggregate(L, MASK, "seq-mean-token-mean"), logp)
    assert torch.equal(g[0], torch.zeros(3, dtype=torch.float64))
    assert info["clip_high"][0].tolist() == [1.0, 1.0, 1.0]


def test_sequence_token_value_and_gradient():
    logp = (OLD + DIFF).requires_grad_(True)
    lr = importance_log_ratio(logp, OLD, MASK, "sequence_token")
    seq = importance_log_ratio(logp, OLD, MASK, "sequence")
    assert torch.allclose(lr.detach(), seq.detach(), atol=1e-15)
    (g,) = torch.autograd.grad(lr[0, 1], logp)  # d log ρ[0,1] / d logp = one-hot at [0, 1]
    expected = torch.zeros_like(logp)
    expected[0, 1] = 1.0
    assert torch.equal(g, expected)


def test_empty_row_sequence_ratio_is_one():
    logp = torch.tensor([[0.7, -0.2]], dtype=torch.float64)
    lr = importance_log_ratio(logp, torch.zeros_like(logp), torch.zeros_like(logp), "sequence")
    assert torch.equal(lr, torch.zeros_like(logp))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 5), seed=st.integers(0, 10_000), mode=st.sampled_from(["token-mean", "seq-mean-token-mean"]))
def test_single_token_completions_token_equals_sequence(n, seed, mode):
    g = torch.Generator().manual_seed(seed)
    T = 3
    logp = (torch.randn(n, T, generator=g, dtype=torch.float64) * 0.4).requires_grad_(True)
    old = torch.randn(n, T, generator=g, dtype=torch.float64) * 0.4
    A = torch.randn(n, generator=g, dtype=torch.float64)
    M = torch.zeros(n, T, dtype=torch.float64)
    M[torch.arange(n), torch.randint(0, T, (n,), generator=g)] = 1.0  # one token per completion
    out = {}
    for level in ("token", "sequence", "sequence_token"):
        L, info = clipped_surrogate(logp, old, A, M, epsilon=0.2, epsilon_high=0.28, importance_sampling_level=level)
        loss = aggregate(L, M, mode)
        (grad,) = torch.autograd.grad(loss, logp)
        out[level] = (loss.item(), grad, info["ratio"] * M)
    for level in ("sequence", "sequence_token"):
        assert out[level][0] == pytest.approx(out["token"][0], abs=1e-12)
        assert torch.allclose(out[level][1], out["token"][1], atol=1e-12)
        assert torch.allclose(out[level][2], out["token"][2], atol=1e-12)

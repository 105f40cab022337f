"""grpo_core.md §6, acceptance §14.2.

Fixed [3, 5] tensor used for the hand calculations:

    X = [[ 1,  2,  3,  4,  5],      W = [[1, 1, 1, 0, 0],     row sums Σ_t W·X = 6, 40, 11
         [ 6,  7,  8,  9, 10],           [1, 1, 1, 1, 1],     n_i = 3, 5, 1;  Σ W = 9;  Σ W·X = 57
         [11, 12, 13, 14, 15]]           [1, 0, 0, 0, 0]]     B_eff = 3

    token-mean              57 / 9                   = 6.333333333333333
    token-sum               57
    seq-mean-token-sum      57 / 3                   = 19
    seq-mean-token-mean     (6/3 + 40/5 + 11/1) / 3  = (2 + 8 + 11)/3 = 7
    seq-mean-token-sum-norm (57 / C) / 3, C = 10     = 1.9
"""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.core import (
    LOSS_AGG_MODES,
    AggDenominators,
    aggregate,
    compute_denominators,
    merge_denominators,
)

X = torch.arange(1.0, 16.0, dtype=torch.float64).reshape(3, 5)
W = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float64)
C = 10.0

HAND = {
    "token-mean": 57 / 9,
    "token-sum": 57.0,
    "seq-mean-token-sum": 19.0,
    "seq-mean-token-mean": 7.0,
    "seq-mean-token-sum-norm": 1.9,
}


def agg(x, w, mode, d=None, **kw):
    if mode == "seq-mean-token-sum-norm":
        kw.setdefault("loss_scale_factor", C)
    return aggregate(x, w, mode, d, **kw)


def test_registry_names():
    assert LOSS_AGG_MODES == (
        "token-mean",
        "token-sum",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
    )


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_hand_values_local(mode):
    assert float(agg(X, W, mode)) == pytest.approx(HAND[mode], abs=1e-12)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_hand_values_with_global_denominators(mode):
    d = compute_denominators(W, mode, loss_scale_factor=C if mode.endswith("norm") else None)
    assert d.token_weight == 9 and d.num_seqs == 3
    assert d.scale == (C if mode.endswith("norm") else 1.0)
    assert float(aggregate(X, W, mode, d)) == pytest.approx(HAND[mode], abs=1e-12)


def test_weighted_tokens_hand_values():
    # W row 0 = [0.5, 1, 1, 0, 0]: row sums 0.5+2+3 = 5.5, 40, 11; n_i = 2.5, 5, 1; Σ W = 8.5
    w = W.clone()
    w[0, 0] = 0.5
    assert float(agg(X, w, "token-mean")) == pytest.approx(56.5 / 8.5, abs=1e-12)  # 6.647058823529412
    assert float(agg(X, w, "seq-mean-token-mean")) == pytest.approx((2.2 + 8 + 11) / 3, abs=1e-12)


def test_hand_gradients():
    x = X.clone().requires_grad_(True)
    agg(x, W, "token-mean").backward()
    assert torch.allclose(x.grad, W / 9)
    x.grad = None
    agg(x, W, "seq-mean-token-mean").backward()
    # d/dX[i,t] = W[i,t] / (n_i * B): rows 1/9, 1/15, 1/3
    expected = W * torch.tensor([[1 / 9], [1 / 15], [1 / 3]], dtype=torch.float64)
    assert torch.allclose(x.grad, expected, atol=1e-15)
    x.grad = None
    agg(x, W, "seq-mean-token-sum-norm").backward()
    assert torch.allclose(x.grad, W / 30)


# ---------------------------------------------------------------- seq_denominator (§6)

W_EMPTY = W.clone()
W_EMPTY[2] = 0  # row 2 fully masked: row sums 6, 40; n = 3, 5; Σ W = 8; Σ W·X = 46


@pytest.mark.parametrize(
    "mode,nonempty,all_",
    [
        ("token-mean", 46 / 8, 46 / 8),
        ("token-sum", 46.0, 46.0),
        ("seq-mean-token-sum", 23.0, 46 / 3),
        ("seq-mean-token-mean", 5.0, 10 / 3),
        ("seq-mean-token-sum-norm", 2.3, 4.6 / 3),
    ],
)
def test_fully_masked_row_hand_values(mode, nonempty, all_):
    assert float(agg(X, W_EMPTY, mode, seq_denominator="nonempty")) == pytest.approx(nonempty, abs=1e-12)
    assert float(agg(X, W_EMPTY, mode, seq_denominator="all")) == pytest.approx(all_, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.lists(st.booleans(), min_size=4, max_size=4), min_size=1, max_size=5),
    mode=st.sampled_from(LOSS_AGG_MODES),
)
def test_seq_denominator_differs_only_with_empty_rows(rows, mode):
    w = torch.tensor(rows, dtype=torch.float64)
    x = torch.rand(w.shape, dtype=torch.float64) + 0.5  # positive: the numerator is > 0 if any token is kept
    a = float(agg(x, w, mode, seq_denominator="all"))
    b = float(agg(x, w, mode, seq_denominator="nonempty"))
    has_empty = bool((w.sum(1) == 0).any())
    if mode.startswith("seq") and has_empty and w.sum() > 0:
        assert a != pytest.approx(b, abs=1e-12)
    else:
        assert a == pytest.approx(b, abs=1e-12)


# ---------------------------------------------------------------- empty denominators and masked garbage


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("seq_denominator", ["nonempty", "all"])
def test_all_masked_gives_zero_with_grad(mode, seq_denominator):
    x = X.clone().requires_grad_(True)
    out = agg(x, torch.zeros_like(W), mode, seq_denominator=seq_denominator)
    assert out.item() == 0.0
    assert out.requires_grad
    out.backward()
    assert torch.equal(x.grad, torch.zeros_like(X))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_nonfinite_values_under_mask_do_not_leak(mode):
    x = X.clone()
    x[0, 3] = float("nan")
    x[2, 4] = float("inf")
    x.requires_grad_(True)
    out = agg(x, W, mode)
    assert out.item() == pytest.approx(HAND[mode], abs=1e-12)
    out.backward()
    assert torch.isfinite(x.grad).all()


# ---------------------------------------------------------------- validation


def test_validation_errors():
    with pytest.raises(ValueError, match="loss_scale_factor"):
        compute_denominators(W, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="loss_scale_factor"):
        aggregate(X, W, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(X, W, "seq_mean")
    with pytest.raises(ValueError, match="seq_denominator"):
        compute_denominators(W, "token-mean", seq_denominator="some")
    with pytest.raises(ValueError, match="shape"):
        aggregate(X, W[:, :4], "token-mean")
    d = compute_denominators(W, "token-mean")
    with pytest.raises(ValueError, match="computed for"):
        aggregate(X, W, "seq-mean-token-mean", d)
    dn = compute_denominators(W, "seq-mean-token-sum-norm", loss_scale_factor=C)
    with pytest.raises(ValueError, match="differs"):
        aggregate(X, W, "seq-mean-token-sum-norm", dn, loss_scale_factor=5.0)
    with pytest.raises(ValueError):
        merge_denominators()
    with pytest.raises(ValueError):
        merge_denominators(d, dn)


def test_denominators_frozen_and_positional():
    d = AggDenominators(9.0, 3.0, 1.0)
    assert d.mode is None
    with pytest.raises(Exception):
        d.token_weight = 1.0  # type: ignore[misc]
    assert float(aggregate(X, W, "token-mean", d)) == pytest.approx(57 / 9)


# ---------------------------------------------------------------- global scope: micro-batches and ranks


def _problem(seed):
    g = torch.Generator().manual_seed(seed)
    N, T, H = 8, 6, 3
    feats = torch.randn(N, T, H, generator=g, dtype=torch.float64)
    theta = torch.randn(H, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([6, 1, 3, 0, 5, 2, 6, 4])  # ragged, one empty row
    w = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    w = w * (1 + torch.rand(N, T, generator=g, dtype=torch.float64))  # non-binary token weights
    return feats, theta, w


def _x(feats, theta):
    return torch.tanh(feats @ theta) * (feats[..., 0] + 2)  # [N, T], nonlinear in theta


def _micro_loss(feats, theta, w, rows, mode, d):
    # each micro-batch is cut to its own longest row, as RolloutBatch.select does
    width = max(int((w[rows] > 0).sum(1).max()), 1)
    return aggregate(_x(feats[rows, :width], theta), w[rows, :width], mode, d)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("seq_denominator", ["nonempty", "all"])
def test_micro_batch_and_rank_invariance(mode, seq_denominator):
    feats, theta, w = _problem(0)
    lsf = 7.0 if mode.endswith("norm") else None
    full_d = compute_denominators(w, mode, seq_denominator=seq_denominator, loss_scale_factor=lsf)
    full = aggregate(_x(feats, theta), w, mode, full_d)
    (g_full,) = torch.autograd.grad(full, theta)

    N = w.shape[0]
    for k in (1, 2, 4):
        splits = [list(range(i, N, k)) for i in range(k)]  # interleaved rows
        total = sum(_micro_loss(feats, theta, w, rows, mode, full_d) for rows in splits)
        (g,) = torch.autograd.grad(total, theta)
        assert total.item() == pytest.approx(full.item(), abs=1e-6)
        assert torch.allclose(g, g_full, atol=1e-6, rtol=0)

    # 2 simulated ranks, each with 2 micro-batches; each rank knows only its own rows' W and the
    # denominators are all-reduced (summed) across ranks
    ranks = [[0, 1, 2, 3], [4, 5, 6, 7]]
    local = [compute_denominators([w[r[:2]], w[r[2:]]], mode, seq_denominator=seq_denominator, loss_scale_factor=lsf)
             for r in ranks]
    merged = merge_denominators(*local)
    assert merged.num_seqs == full_d.num_seqs and merged.scale == full_d.scale and merged.mode == full_d.mode
    assert merged.token_weight == pytest.approx(full_d.token_weight, rel=1e-12)
    grads, vals = [], []
    for r in ranks:
        loss_r = sum(_micro_loss(feats, theta, w, rows, mode, merged) for rows in (r[:2], r[2:]))
        vals.append(loss_r.item())
        grads.append(torch.autograd.grad(loss_r, theta)[0])
    assert sum(vals) == pytest.approx(full.item(), abs=1e-6)
    assert torch.allclose(sum(grads), g_full, atol=1e-6, rtol=0)


def test_micro_scope_differs_from_global():
    # sanity of the test above: with local normalisation the micro-batch sum is not the full loss
    feats, theta, w = _problem(0)
    full = aggregate(_x(feats, theta), w, "token-mean").item()
    halves = [[0, 1, 2, 3], [4, 5, 6, 7]]
    summed = sum(aggregate(_x(feats[h], theta), w[h], "token-mean").item() for h in halves)
    assert abs(summed - full) > 1e-3


def test_compute_denominators_from_list_equals_full():
    rng = random.Random(1)
    w = torch.tensor([[rng.choice([0.0, 1.0]) for _ in range(5)] for _ in range(6)])
    w[3] = 0
    for mode in LOSS_AGG_MODES:
        for sd in ("nonempty", "all"):
            lsf = 3.0 if mode.endswith("norm") else None
            a = compute_denominators(w, mode, seq_denominator=sd, loss_scale_factor=lsf)
            b = compute_denominators([w[:2], w[2:5], w[5:]], mode, seq_denominator=sd, loss_scale_factor=lsf)
            assert a == b
            assert a.num_seqs == (6 if sd == "all" else int((w.sum(1) > 0).sum()))

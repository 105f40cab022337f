"""Chunked LM-head log-probs and entropy (grpo_core.md §4, §8)."""

import math

import pytest
import torch

from rlvr.core import entropy_from_logits, selective_log_softmax_and_entropy


def _problem(n=37, H=6, V=50, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, H, generator=g, dtype=dtype).requires_grad_(True)
    weight = torch.randn(V, H, generator=g, dtype=dtype).requires_grad_(True)
    bias = torch.randn(V, generator=g, dtype=dtype).requires_grad_(True)
    target = torch.randint(0, V, (n,), generator=g)
    return hidden, weight, bias, target


def _reference(hidden, weight, bias, target, temperature):
    z = hidden @ weight.t()
    if bias is not None:
        z = z + bias
    z = z / (temperature if not torch.is_tensor(temperature) else temperature[:, None])
    lp = torch.log_softmax(z, -1)
    return lp.gather(1, target[:, None]).squeeze(1), -(lp.exp() * lp).sum(-1)


@pytest.mark.parametrize("chunk_size", [1, 8, 37, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.7, "tensor"])
@pytest.mark.parametrize("use_bias", [True, False])
def test_matches_full_softmax_values_and_gradients(chunk_size, temperature, use_bias):
    hidden, weight, bias, target = _problem()
    if temperature == "tensor":
        temperature = torch.linspace(0.5, 1.5, hidden.shape[0])
    b = bias if use_bias else None
    logp, ent = selective_log_softmax_and_entropy(hidden, weight, b, target, temperature=temperature,
                                                  chunk_size=chunk_size)
    ref_lp, ref_ent = _reference(hidden, weight, b, target, temperature)
    assert logp.shape == (37,) and ent.shape == (37,)
    assert torch.allclose(logp, ref_lp, atol=1e-5)
    assert torch.allclose(ent, ref_ent, atol=1e-5)
    assert not ent.requires_grad
    coef = torch.linspace(-1, 1, 37)
    params = (hidden, weight) + ((bias,) if use_bias else ())
    got = torch.autograd.grad((logp * coef).sum(), params)
    want = torch.autograd.grad((ref_lp * coef).sum(), params)
    for a, b_ in zip(got, want):
        assert torch.allclose(a, b_, atol=1e-5)


def test_entropy_gradient_when_requested():
    hidden, weight, bias, target = _problem(dtype=torch.float64)
    logp, ent = selective_log_softmax_and_entropy(hidden, weight, bias, target, temperature=0.9, chunk_size=5,
                                                  entropy_grad=True)
    ref_lp, ref_ent = _reference(hidden, weight, bias, target, 0.9)
    c1, c2 = torch.linspace(-1, 1, 37, dtype=torch.float64), torch.linspace(2, -1, 37, dtype=torch.float64)
    got = torch.autograd.grad((logp * c1).sum() + (ent * c2).sum(), (hidden, weight, bias))
    want = torch.autograd.grad((ref_lp * c1).sum() + (ref_ent * c2).sum(), (hidden, weight, bias))
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-10)


def test_without_entropy_and_frozen_weight():
    hidden, weight, bias, target = _problem()
    w = weight.detach()
    logp, ent = selective_log_softmax_and_entropy(hidden, w, None, target, with_entropy=False, chunk_size=4)
    assert ent is None
    ref_lp, _ = _reference(hidden, w, None, target, 1.0)
    (g,) = torch.autograd.grad(logp.sum(), hidden)
    (g_ref,) = torch.autograd.grad(ref_lp.sum(), hidden)
    assert torch.allclose(g, g_ref, atol=1e-5)


def test_backward_does_not_keep_full_logits():
    # autograd must not save [n, V] logits: only inputs and per-token statistics are kept
    n, H, V, chunk = 64, 4, 100, 8
    hidden, weight, bias, target = _problem(n=n, H=H, V=V)
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, ent = selective_log_softmax_and_entropy(hidden, weight, bias, target, chunk_size=chunk, keep_bytes=0)
    assert saved, "the custom function saved nothing: hook not exercised"
    assert sum(saved) < n * V / 2, saved  # inputs (n·H + V·H + V + n) plus O(n) statistics
    assert max(saved) < chunk * V
    logp.sum().backward()  # still differentiable
    assert hidden.grad is not None and weight.grad is not None and bias.grad is not None


class _CountMM(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts aten matmul calls (mm / addmm) run under it."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm):
            self.n += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("with_entropy,entropy_grad", [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("chunk_size", [5, 37])
def test_kept_logprobs_equal_recomputed_bit_for_bit(with_entropy, entropy_grad, chunk_size):
    """Keeping the forward's log p for the backward (within keep_bytes) changes no value and no gradient, and
    saves exactly the backward's logits matmul of every chunk."""
    temps = torch.linspace(0.5, 1.5, 37)
    out = {}
    for keep in (0, 1 << 30):
        hidden, weight, bias, target = _problem()
        logp, ent = selective_log_softmax_and_entropy(hidden, weight, bias, target, temperature=temps,
                                                      chunk_size=chunk_size, with_entropy=with_entropy,
                                                      entropy_grad=entropy_grad, keep_bytes=keep)
        loss = (logp * torch.linspace(-1, 1, 37)).sum()
        if entropy_grad:
            loss = loss + (ent * torch.linspace(2, -1, 37)).sum()
        with _CountMM() as count:
            loss.backward()
        out[keep] = (logp.detach(), None if ent is None else ent.detach(), hidden.grad, weight.grad, bias.grad, count.n)
    chunks = -(-37 // chunk_size)
    for a, b in zip(out[0][:5], out[1 << 30][:5]):
        assert (a is None and b is None) or torch.equal(a, b)
    assert out[0][5] - out[1 << 30][5] == chunks  # one [c, H] × [H, V] matmul less per chunk


def test_keep_budget_falls_back_to_recompute():
    hidden, weight, bias, target = _problem(n=37, V=50)
    need = 37 * 50 * 4  # float32 [n, V]
    counts = []
    for keep in (need - 1, need):
        h = hidden.detach().clone().requires_grad_(True)
        logp, _ = selective_log_softmax_and_entropy(h, weight, bias, target, chunk_size=8, keep_bytes=keep)
        with _CountMM() as count:
            logp.sum().backward()
        counts.append(count.n)
    assert counts[0] == counts[1] + 5  # over budget: the 5 chunks' logits are recomputed


def test_no_grad_call_keeps_nothing():
    hidden, weight, bias, target = _problem()
    with torch.no_grad():
        logp, ent = selective_log_softmax_and_entropy(hidden, weight, bias, target, chunk_size=8)
    assert logp.grad_fn is None and ent.grad_fn is None


def test_validation():
    hidden, weight, bias, target = _problem()
    with pytest.raises(ValueError, match="temperature"):
        selective_log_softmax_and_entropy(hidden, weight, bias, target, temperature=0.0)
    with pytest.raises(ValueError, match="temperature"):
        selective_log_softmax_and_entropy(hidden, weight, bias, target, temperature=torch.zeros(37))
    with pytest.raises(ValueError, match="target_ids"):
        selective_log_softmax_and_entropy(hidden, weight, bias, target.clone().fill_(50))
    with pytest.raises(ValueError, match="chunk_size"):
        selective_log_softmax_and_entropy(hidden, weight, bias, target, chunk_size=0)
    with pytest.raises(ValueError):
        selective_log_softmax_and_entropy(hidden, weight[:, :3], bias, target)
    with pytest.raises(ValueError):
        selective_log_softmax_and_entropy(hidden, weight, bias[:3], target)


def test_empty_input():
    _, weight, bias, _ = _problem()
    h = torch.zeros(0, 6, requires_grad=True)
    logp, ent = selective_log_softmax_and_entropy(h, weight, bias, torch.zeros(0, dtype=torch.long))
    assert logp.shape == (0,) and ent.shape == (0,)


def test_entropy_from_logits_hand_values():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, -math.inf, -math.inf], [5.0, -math.inf, -math.inf, -math.inf]])
    H = entropy_from_logits(logits)
    # uniform over 4: log 4 ; uniform over 2: log 2 ; one-hot: 0
    assert H.tolist() == pytest.approx([1.3862943611198906, 0.6931471805599453, 0.0], abs=1e-6)
    # p = (e, 1)/(e+1): H = −Σ p log p = ln(1+e) − e/(1+e) = 1.3132616875182228 − 0.7310585786300049
    assert entropy_from_logits(torch.tensor([1.0, 0.0], dtype=torch.float64)).item() == pytest.approx(
        0.5822031088882179, abs=1e-12
    )
    # temperature 2 on logits [2, 0] is the same distribution as [1, 0]
    assert entropy_from_logits(torch.tensor([2.0, 0.0], dtype=torch.float64), temperature=2.0).item() == pytest.approx(
        0.5822031088882179, abs=1e-12
    )
    with pytest.raises(ValueError):
        entropy_from_logits(logits, temperature=0.0)

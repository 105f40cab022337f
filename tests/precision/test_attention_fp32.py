"""``model.attention_fp32`` (:mod:`rlvr.models.attention`): attention runs in float32 under a bf16 policy, its
values and gradients are the float64 reference rounded once to bf16, fp32 inputs pass through untouched, and
the config key reaches the model the trainer and the engine run."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from rlvr.config import ModelConfig
from rlvr.models import load_policy
from rlvr.models.attention import FP32_SDPA, sdpa_fp32_forward

MODULE = SimpleNamespace(is_causal=True, num_key_value_groups=1, training=False)


def _reference(q, k, v):
    """Causal softmax(q kᵀ / √d) v in float64, layout [B, L, heads, d] (transformers' output layout)."""
    q, k, v = (t.double() for t in (q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    L = q.shape[-2]
    s = s.masked_fill(torch.triu(torch.ones(L, L, dtype=torch.bool), 1), float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2)


def _qkv(dtype, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(2, 3, 9, 8, generator=g) * 2).to(dtype).requires_grad_(requires_grad) for _ in range(3)]


def _spy(monkeypatch):
    seen = []
    orig = F.scaled_dot_product_attention

    def spy(q, k, v, *a, **kw):
        seen.append(q.dtype)
        return orig(q, k, v, *a, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)  # F is torch.nn.functional, read at call time
    return seen


def test_bf16_output_is_the_exact_result_rounded_once():
    q, k, v = _qkv(torch.bfloat16)
    out, _ = sdpa_fp32_forward(MODULE, q, k, v, None)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 9, 3, 8)
    ref = _reference(q, k, v)
    # one rounding of the fp64 result to bf16 (relative half-ulp 2^-9), plus fp32 noise
    err = (out.double() - ref).abs()
    assert float((err - ref.abs() * 2.0 ** -8 - 1e-6).max()) <= 0
    # the plain bf16 kernel rounds its intermediates too: it is never closer than the fp32 path
    plain, _ = sdpa_attention_forward(MODULE, q, k, v, None)
    assert float(err.max()) <= float((plain.double() - ref).abs().max())


def test_bf16_gradients_match_float64_reference():
    q, k, v = _qkv(torch.bfloat16, seed=1, requires_grad=True)
    w = torch.randn(2, 9, 3, 8, generator=torch.Generator().manual_seed(2))
    out, _ = sdpa_fp32_forward(MODULE, q, k, v, None)
    (out.float() * w).sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    # the output gradient reaches the fp32 kernel through the bf16 output, so it is w rounded to bf16
    (_reference(q64, k64, v64) * w.bfloat16().double()).sum().backward()
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert got.dtype == torch.bfloat16
        # then only the final rounding of each gradient to bf16 (half an ulp) plus fp32 noise
        assert torch.allclose(got.double(), want, rtol=2.0 ** -8, atol=1e-5 * float(want.abs().max()))


def test_fp32_inputs_take_transformers_function_unchanged():
    q, k, v = _qkv(torch.float32, seed=3)
    mine, _ = sdpa_fp32_forward(MODULE, q, k, v, None)
    theirs, _ = sdpa_attention_forward(MODULE, q, k, v, None)
    assert torch.equal(mine, theirs)


def test_float_mask_is_upcast_and_applied(monkeypatch):
    q, k, v = _qkv(torch.bfloat16, seed=4)
    mask = torch.zeros(2, 1, 9, 9, dtype=torch.bfloat16)
    mask[..., 5:] = torch.finfo(torch.bfloat16).min  # keys 5.. masked for every query
    seen = _spy(monkeypatch)
    out, _ = sdpa_fp32_forward(MODULE, q, k, v, mask)
    assert seen == [torch.float32]
    # rows 5.. attend only to keys 0..4: equal to attention over the first five keys alone
    qd, kd, vd = (t.double() for t in (q, k[:, :, :5], v[:, :, :5]))
    s = (qd @ kd.transpose(-1, -2) / math.sqrt(8)).softmax(-1) @ vd
    assert torch.allclose(out[:, 5:].double(), s.transpose(1, 2)[:, 5:], rtol=2.0 ** -7, atol=1e-2)


def test_autocast_cannot_lower_the_kernel_back_to_bf16(monkeypatch):
    q, k, v = _qkv(torch.bfloat16, seed=5)
    seen = _spy(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = sdpa_fp32_forward(MODULE, q, k, v, None)
    assert seen == [torch.float32] and out.dtype == torch.bfloat16


@pytest.mark.parametrize("on", [True, False])
def test_config_key_reaches_the_loaded_model(on, monkeypatch):
    model, tok = load_policy(ModelConfig(name_or_path="tiny", dtype="bf16-pure", attention_fp32=on))
    assert (model.config._attn_implementation == FP32_SDPA) is on
    seen = _spy(monkeypatch)
    ids = torch.randint(0, len(tok), (2, 6), generator=torch.Generator().manual_seed(0))
    logits = model(ids).logits
    logits.float().logsumexp(-1).sum().backward()
    assert seen and set(seen) == {torch.float32 if on else torch.bfloat16}
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
    # the checkpoint stays loadable without rlvr: the attention choice is not written into config.json
    assert model.config.to_dict().get("_attn_implementation") != FP32_SDPA

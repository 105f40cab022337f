"""Attention in float32 under a bf16 policy (``model.attention_fp32``; issue 39's first lever).

On a CPU with native bf16, PyTorch's CPU flash-attention kernel is the one kernel of the update that gets
*slower* in bf16: its backward took 2.2× fp32's time in ``benchmarks/update_op_account.py`` at the default
model (docs/benchmark.md, "Issue 39 — where the bf16 update's time goes"). This module registers an attention
function with transformers' ``AttentionInterface`` that upcasts query, key, value (and a floating mask) to
float32, runs transformers' own SDPA attention on them with autocast off, and casts the output back to the
query's dtype. The matmuls around attention (projections, MLP, LM head) stay in bf16; only the ``[B, heads, L,
L]`` score/softmax/weighted-sum work and its backward run in fp32, which is also the more exact of the two.

Interpretation: the lever trades a few casts of ``[B, heads, L, head_dim]`` tensors for the fp32 kernel; whether
it pays depends on the machine (the casts are memory traffic, the kernel's fp32/bf16 ratio is the CPU's). It is
off by default and measured by ``benchmarks/bench_update_dtype.py`` (arm ``bf16-master+attn32``).

Layer 2 of ``docs/architecture.md``: imports torch and transformers only.
"""

from __future__ import annotations

from typing import Any

import torch

FP32_SDPA = "rlvr_sdpa_fp32"
"""The name the function is registered under in transformers' ``AttentionInterface``."""


def sdpa_fp32_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """transformers' SDPA attention run in float32, its output in ``query``'s dtype.

    Args:
        module: the attention module (read by transformers for ``num_key_value_groups``, ``is_causal``).
        query: ``[B, heads, L_q, head_dim]``; key, value: ``[B, kv_heads, L_kv, head_dim]``, any float dtype.
        attention_mask: ``None``, a bool mask, or an additive float mask broadcastable to
            ``[B, heads, L_q, L_kv]`` (a float mask is upcast too; a bool one is passed as it is).
        *args, **kwargs: passed on unchanged (``dropout``, ``scaling``, ``is_causal``, ...).

    Returns:
        ``(attn_output [B, L_q, heads, head_dim] in query.dtype, None)``: transformers' SDPA layout.

    Float32 inputs take transformers' function unchanged (no casts). Autocast is disabled inside, so under
    ``model.dtype=bf16`` (autocast) the kernel sees float32 too. Gradients flow back through the casts to the
    inputs in their own dtype. Raises what transformers' SDPA function raises (e.g. ``softcap``).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.dtype == key.dtype == value.dtype == torch.float32:
        return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    out_dtype = query.dtype
    mask = attention_mask
    if mask is not None and mask.is_floating_point():
        mask = mask.float()
    with torch.autocast(device_type=query.device.type, enabled=False):
        out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), mask,
                                              *args, **kwargs)
    return out.to(out_dtype), weights


def register_fp32_attention() -> str:
    """Register :func:`sdpa_fp32_forward` as :data:`FP32_SDPA` with transformers (idempotent); returns the name."""
    from transformers import AttentionInterface

    AttentionInterface.register(FP32_SDPA, sdpa_fp32_forward)
    return FP32_SDPA


def use_fp32_attention(model: Any) -> None:
    """Make ``model`` (a transformers ``PreTrainedModel``) run its attention through :func:`sdpa_fp32_forward`.

    Raises:
        ValueError: the model's architecture does not take a registered attention function (transformers'
            own message, naming the model class).
    """
    model.set_attn_implementation(register_fp32_attention())

"""The trunk / head split of a causal LM: final hidden states without the LM head
(:func:`model_forward_hidden`) and the head as plain tensors (:func:`lm_head_params`), so the trainer
runs the head only at completion positions (chunked, ``rlvr.core.logprobs``).

Separate from :mod:`rlvr.models` because it is used on every training forward, on any loaded model
(peft-wrapped included), and changes with transformers' module layout, not with how a model is found
or loaded. Re-exported from :mod:`rlvr.models`.
"""

from __future__ import annotations

from typing import Any

import torch

def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip padding: ``[B, L]`` long, 0 at each row's first real token.

    Works for left, right or mixed padding; padded positions get 0 (their value is irrelevant).
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def decoder_of(model: Any) -> Any:
    """The base (decoder) module of a causal LM: ``model.model`` (llama-like) or ``model.get_decoder()``.

    Raises:
        ValueError: neither is a separate module.
    """
    if type(model).__module__.startswith("peft.") and hasattr(model, "get_base_model"):
        model = model.get_base_model()  # a peft wrapper: its causal LM (LoRA layers inside) has the decoder
    base = getattr(model, "model", None)
    if isinstance(base, torch.nn.Module):
        return base
    get = getattr(model, "get_decoder", None)
    dec = get() if callable(get) else None
    if dec is None or dec is model:
        raise ValueError(f"{type(model).__name__}: cannot find the base (decoder) module of this causal LM")
    return dec


def model_forward_hidden(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Final hidden states of a causal LM without its LM head.

    Runs the base model (``model.model`` for llama-like architectures, else ``model.get_decoder()``;
    through a ``peft`` wrapper, that of its causal LM, adapters active), whose output is already through the final norm, without a KV cache.

    Args:
        model: a ``*ForCausalLM`` whose head is a plain linear map of the last hidden state.
        input_ids: ``[B, L]`` long.
        attention_mask: ``[B, L]`` (1 real, 0 padding); any padding layout.
        position_ids: ``[B, L]`` long; default :func:`positions_from_mask` so that a row's positions
            do not depend on its padding.

    Returns:
        ``[B, L, H]`` hidden states in the model's dtype; ``logits = h @ W.T (+ b)`` with
        :func:`lm_head_params`.

    Raises:
        ValueError: the base module cannot be found.
    """
    if position_ids is None:
        position_ids = positions_from_mask(attention_mask)
    out = decoder_of(model)(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    )
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def lm_head_params(model: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The output head as plain tensors: ``logits = hidden @ weight.T + bias``.

    Returns:
        ``(weight [V, H], bias [V] or None)`` — the live parameters (gradients flow; tied to the
        input embedding when the model ties them).

    Raises:
        ValueError: the model has no linear output embedding, or post-processes its logits
            (``final_logit_softcapping``, ``logit_scale``), which this split would silently drop.
    """
    for attr in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale"):
        if getattr(model.config, attr, None) not in (None, 1, 1.0):
            raise ValueError(f"{type(model).__name__} post-processes logits ({attr}); lm_head_params cannot split it")
    head = model.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise ValueError(f"{type(model).__name__} has no linear output head")
    return head.weight, getattr(head, "bias", None)

"""Loss masks (``docs/grpo.md`` §5.4).

Every mask is a ``[N, T]`` tensor; masks combine by multiplication and never branch:
``W = M ⊙ w ⊙ (1 − is_truncated)^{mask_truncated_completions} ⊙ Π_k variant_mask_k``.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["combine_masks", "loss_weights", "truncation_mask"]


def truncation_mask(is_truncated: torch.Tensor, width: int) -> torch.Tensor:
    """Mask that drops truncated completions from the loss (DAPO overlong filtering).

    Args:
        is_truncated: ``[N]`` bool (or 0/1): True where the completion hit ``max_completion_length``
            without EOS.
        width: ``T``, the padded completion length of the batch (``>= 0``).

    Returns:
        ``[N, T]`` float (default dtype): row ``i`` is all 0 where ``is_truncated[i]``, else all 1.
        It masks the **loss only**; truncated completions keep their rewards and still count in their
        group's mean and std (advantages are computed before masking).

    Raises:
        ValueError: ``is_truncated`` is not 1-D or ``width < 0``.

    Source: DAPO (Yu et al. 2025) §3.4 "overlong filtering"; grpo_core.md §5.4
    (``mask_truncated_completions``).
    """
    is_truncated = torch.as_tensor(is_truncated)
    if is_truncated.dim() != 1:
        raise ValueError(
            f"truncation_mask: is_truncated must be 1-D [N], got shape {tuple(is_truncated.shape)}"
        )
    if width < 0:
        raise ValueError(f"truncation_mask: width must be >= 0, got {width}")
    keep = (~is_truncated.bool()).to(torch.get_default_dtype())
    return keep[:, None].expand(-1, int(width)).contiguous()


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor:
    """Product of masks / token weights; ``None`` entries are skipped.

    Args:
        *masks: tensors of one shape ``[N, T]`` (or broadcastable to it, e.g. ``[N, 1]``), bool or
            float. Values are not restricted to {0, 1}, so token weights ``w`` combine the same way.

    Returns:
        ``[N, T]`` float product (dtype: the promoted floating dtype of the inputs, at least the
        default dtype). No gradient is blocked: a weight that requires grad keeps it.

    Raises:
        ValueError: no non-``None`` mask given, or the shapes do not broadcast.

    Source: grpo_core.md §5.4 ("masks are combined by multiplication").
    """
    present = [torch.as_tensor(m) for m in masks if m is not None]
    if not present:
        raise ValueError("combine_masks: at least one mask must be given (all entries were None)")
    try:
        shape = torch.broadcast_shapes(*(m.shape for m in present))
    except RuntimeError as e:
        shapes = [tuple(m.shape) for m in present]
        raise ValueError(f"combine_masks: mask shapes {shapes} do not broadcast") from e
    dtype = torch.get_default_dtype()
    for m in present:
        if m.is_floating_point():
            dtype = torch.promote_types(dtype, m.dtype)
    out = present[0].to(dtype)
    for m in present[1:]:
        out = out * m.to(dtype)
    return out.expand(shape) if out.shape != shape else out


def loss_weights(batch: Any, *, mask_truncated: bool) -> torch.Tensor:
    """Effective loss weight ``W = M ⊙ w ⊙ truncation mask`` ``[N, T]`` of a batch.

    Args:
        batch: anything with ``completion_mask`` ``[N, T]``, ``token_weights`` ``[N, T] | None`` and
            ``is_truncated`` ``[N]`` (a :class:`rlvr.types.RolloutBatch`). Where it has a ``model_mask``
            (the completion mask times a multi-turn ``loss_mask``), that is ``M``: environment tokens
            weigh 0 in every term and every normaliser.
        mask_truncated: drop truncated rows (``mask_truncated_completions``).

    Source: grpo_core.md §5.4; issue 26 item 3 (the loss mask of environment tokens).
    """
    M = getattr(batch, "model_mask", batch.completion_mask)
    trunc = truncation_mask(batch.is_truncated, M.shape[1]) if mask_truncated else None
    return combine_masks(M, batch.token_weights, trunc)

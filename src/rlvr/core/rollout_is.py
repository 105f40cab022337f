"""Importance-sampling correction of the rollout / training mismatch (truncated or masked IS).

The engine that samples (bf16 weights, a KV cache, another kernel library) and the trainer that computes
the loss (fp32 master weights, bf16 autocast, a full forward) do not give the same probabilities to the
same tokens, so rollouts are slightly off-policy even at ``μ = 1``. The correction weights each token's
policy-gradient term by

    ``w = min(π_train(y_t) / π_rollout(y_t), C)``           (``token_truncate``, TIS)

with ``π_train`` the trainer's log-probs under the weights that generated the rows (``old_logp``; at
``μ = 1`` the current forward, detached) and ``π_rollout`` the engine's behaviour log-probs. The other
modes are TRL's: ``token_mask`` (``w = ρ`` inside ``[C_min, C_max]``, 0 outside), ``sequence_truncate`` /
``sequence_mask`` (one ratio per row, ``exp Σ_t (log π_train − log π_rollout)``). The weight is a
constant (no gradient) and multiplies only the policy-gradient term, not the KL or entropy terms; the
loss normalisers are unchanged.

Source: Yao et al. (2025), "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
(truncated IS, ``C = 2``); TRL ``GRPOConfig.vllm_importance_sampling_{correction,mode,clip_max,clip_min}``
(modes and names; TRL 1.16 ``grpo_trainer.py`` applies ``per_token_loss *= ratio`` before the KL term).
"""

from __future__ import annotations

import math

import torch

__all__ = ["ROLLOUT_IS_MODES", "rollout_is_weights"]

ROLLOUT_IS_MODES: tuple[str, ...] = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def rollout_is_weights(
    train_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str = "token_truncate",
    clip_max: float | None = 3.0,
    clip_min: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token IS weights ``[n, T]`` correcting rollouts drawn from ``π_rollout`` towards ``π_train``.

    Args:
        train_logp: ``[n, T]`` log-probs of the sampled tokens under the training forward (detached here).
        rollout_logp: ``[n, T]`` the engine's log-probs of the same tokens.
        mask: ``[n, T]`` tokens that count (completion mask); outside it the weight is 1 and, for the
            sequence modes, the log-ratio is not summed.
        mode: one of :data:`ROLLOUT_IS_MODES`.
        clip_max: ``C_max`` (``> 0``) or None (no upper bound).
        clip_min: ``C_min`` (``>= 0``) or None (no lower bound).

    Returns:
        ``(weights, changed)``: ``weights`` ``[n, T]`` float (no gradient; a sequence weight repeated over
        its row), ``changed`` ``[n, T]`` bool, True where truncation or masking changed the raw ratio
        (inside ``mask`` only).

    Raises:
        ValueError: unknown ``mode``, shapes that differ, ``clip_max <= 0``, ``clip_min < 0`` or
            ``clip_min > clip_max``.

    Source: see the module docstring (TRL's four modes; ``token_truncate`` is TIS).
    """
    if mode not in ROLLOUT_IS_MODES:
        raise ValueError(f"rollout_is_weights: mode must be one of {ROLLOUT_IS_MODES}, got {mode!r}")
    if train_logp.shape != rollout_logp.shape or train_logp.shape != mask.shape:
        raise ValueError(
            f"rollout_is_weights: train_logp {tuple(train_logp.shape)}, rollout_logp {tuple(rollout_logp.shape)} "
            f"and mask {tuple(mask.shape)} must have one shape [n, T]"
        )
    if clip_max is not None and not clip_max > 0:
        raise ValueError(f"rollout_is_weights: clip_max must be > 0 or None, got {clip_max}")
    if clip_min is not None and not clip_min >= 0:
        raise ValueError(f"rollout_is_weights: clip_min must be >= 0 or None, got {clip_min}")
    if clip_min is not None and clip_max is not None and clip_min > clip_max:
        raise ValueError(f"rollout_is_weights: clip_min={clip_min} > clip_max={clip_max}")
    m = mask > 0
    diff = torch.where(m, train_logp.detach().float() - rollout_logp.detach().float(), 0.0)
    diff = torch.nan_to_num(diff, nan=0.0)  # an unknown rollout log-prob: no correction for that token
    if mode.startswith("sequence"):
        diff = diff.sum(dim=1, keepdim=True).expand_as(diff)
    ratio = diff.clamp(max=80.0).exp()  # e^80 is finite in float32; any cap is far below it
    lo = -math.inf if clip_min is None else clip_min
    hi = math.inf if clip_max is None else clip_max
    outside = (ratio < lo) | (ratio > hi)
    if mode.endswith("truncate"):
        w = ratio.clamp(min=clip_min, max=clip_max) if (clip_min is not None or clip_max is not None) else ratio
    else:
        w = ratio.masked_fill(outside, 0.0)
    w = torch.where(m, w, 1.0)
    return w, outside & m

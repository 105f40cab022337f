"""μ-GRPO's negative-advantage veto (``docs/mu_grpo.md`` §2.3): registers ``MASKS["veto"]``.

The mask hook around the pure math of :mod:`rlvr.core.veto`; it acts on any schedule when ``veto`` is
listed in ``loss_masks`` (the recipe pairs it with ``schedule: staged``, :mod:`rlvr.variants.mu_grpo.schedule`).
"""

from __future__ import annotations

from typing import Any

import torch

from rlvr.core.veto import VETO_SCOPES, VETO_TRIGGERS, neg_veto_mask, veto_metrics
from rlvr.parts import MASKS
from rlvr.types import RolloutBatch
from rlvr.variants.mu_grpo.config import MuGRPOConfig


class VetoMask:
    """Mask hook (``rlvr.trainer.update.MaskFn``) applying :func:`rlvr.core.veto.neg_veto_mask`.

    Called on every micro-batch of every update with the current forward's ``logp`` ``[n, T]``; the
    log-ratio ``logp − old_logp`` is detached, so the mask is recomputed from the current policy and
    carries no gradient. Without stored behaviour log-probs (μ = 1) ``ρ ≡ 1`` and nothing is vetoed.

    Args:
        threshold: ``δ`` (``mu_grpo.veto_ratio_threshold``).
        scope: ``mu_grpo.veto_scope`` (one of :data:`rlvr.core.veto.VETO_SCOPES`).
        denominator: ``mu_grpo.veto_denominator``: ``drop`` (vetoed tokens leave the loss normaliser)
            or ``keep`` (the normaliser counts the masked-in tokens before the veto).
        trigger: ``mu_grpo.veto_trigger`` (one of :data:`rlvr.core.veto.VETO_TRIGGERS`).

    Returns (when called):
        ``(mask [n, T] in {0, 1}, metrics)`` with the ``(numerator, denominator)`` pairs of
        :func:`rlvr.core.veto.veto_metrics` (``mu_grpo/veto_response_rate``, ``veto_token_frac``,
        ``trigger_pos_frac``, ``ratio_neg_mean``, ``ratio_pos_mean``).

    Raises:
        ValueError: unknown scope, trigger or denominator, ``threshold <= 0``; when called, a micro-batch
            without advantages.

    Source: mu_grpo.md §2.3, §3 (switches), §4 (metrics).
    """

    def __init__(self, threshold: float = 1e-4, scope: str = "suffix", denominator: str = "drop",
                 trigger: str = "token") -> None:
        if scope not in VETO_SCOPES:
            raise ValueError(f"VetoMask: unknown veto_scope {scope!r}; expected one of {VETO_SCOPES}")
        if trigger not in VETO_TRIGGERS:
            raise ValueError(f"VetoMask: unknown veto_trigger {trigger!r}; expected one of {VETO_TRIGGERS}")
        if denominator not in ("drop", "keep"):
            raise ValueError(f"VetoMask: veto_denominator must be 'drop' or 'keep', got {denominator!r}")
        if not threshold > 0:
            raise ValueError(f"VetoMask: veto_ratio_threshold must be > 0, got {threshold}")
        self.threshold = float(threshold)
        self.scope = scope
        self.denominator = denominator
        self.trigger = trigger

    def __call__(
        self, micro: RolloutBatch, logp: torch.Tensor, old_logp: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, tuple[float, float]]]:
        if micro.advantages is None:
            raise ValueError("VetoMask: the micro-batch has no advantages")
        logp = logp.detach()
        log_ratio = torch.zeros_like(logp) if old_logp is None else logp - old_logp.detach()
        mask = micro.model_mask  # environment tokens are never vetoed nor counted
        veto = neg_veto_mask(log_ratio, micro.advantages, mask, self.threshold, self.scope, self.trigger)
        return veto, veto_metrics(log_ratio, micro.advantages, mask, veto, self.threshold, self.trigger)


@MASKS.register("veto", config=MuGRPOConfig, section="mu_grpo")
def make_veto_mask(cfg: Any) -> VetoMask:
    """``MASKS["veto"]``: :class:`VetoMask` from ``mu_grpo.veto_ratio_threshold``, ``veto_scope``,
    ``veto_denominator``, ``veto_trigger``."""
    m = cfg.mu_grpo
    return VetoMask(m.veto_ratio_threshold, m.veto_scope, m.veto_denominator, m.veto_trigger)

"""μ-GRPO (``docs/mu_grpo.md``): registers ``MASKS["veto"]`` (``SCHEDULES["staged"]`` is in :mod:`rlvr.schedules.staged`).

μ-GRPO is a schedule and a mask on top of GRPO: the recipe ``mu_grpo.yaml`` sets ``schedule: staged``,
``loss_masks: [veto]``, μ = ``steps_per_generation`` and the relaxed window ``epsilon=1.0,
epsilon_high=4.0``. The math is :mod:`rlvr.core.veto`; the schedule is :mod:`rlvr.schedules.staged`.
"""

from __future__ import annotations

from typing import Any

import torch

from rlvr.core.veto import VETO_SCOPES, VETO_TRIGGERS, neg_veto_mask, veto_metrics
from rlvr.config_sections import MuGRPOConfig
from rlvr.errors import ConfigError
from rlvr.parts import CONFIG_CHECKS, MASKS
from rlvr.types import RolloutBatch


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


@CONFIG_CHECKS.register("mu_grpo")
def check_mu_grpo(cfg: Any) -> None:
    """The staged schedule's fresh shuffle needs the stages drawn in order (no overlap).

    Raises:
        ConfigError: ``schedule: staged`` with ``mu_grpo.stage_prompt_draw=fresh_shuffle`` and
            ``max_async_level > 0``.
    """
    if cfg.max_async_level > 0 and cfg.schedule == "staged" and cfg.mu_grpo.stage_prompt_draw == "fresh_shuffle":
        raise ConfigError(
            "mu_grpo.stage_prompt_draw=fresh_shuffle reshuffles the prompts at a stage's first update, but with "
            f"max_async_level={cfg.max_async_level} later stages are drawn before it: use continue_loader"
        )

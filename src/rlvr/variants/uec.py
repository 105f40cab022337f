"""UEC-RL (``docs/uec_rl.md``): registers its parts; the recipe ``uec_rl`` names them.

* ``SAMPLERS["hard_prompt"]`` — :class:`rlvr.samplers.hard_prompt.HardPromptSampler` (targeted
  exploration on zero-pass prompts, knobs ``uec.explore_*``, ``uec.hard_pass_rate_max``);
* ``BATCH_FILTERS["uec_retention"]`` — the retention rule of §2.4 after advantages: regular rows need
  ``|Â| > uec.regular_adv_floor``, exploration rows pass ``uec.explore_filter`` / ``uec.explore_adv_floor``,
  truncated positive rows are dropped (``uec.drop_truncated_positive``);
* ``CONFIG_CHECKS["uec"]`` — the retention rule needs per-sequence advantages.

The schedule ``SCHEDULES["uec_replay"]`` (accumulation to ``uec.update_size`` rows and the periodic
replay stabiliser) is :class:`rlvr.schedules.uec_replay.UECReplaySchedule`.

The advantage estimator, the loss and the optimizer loop are plain GRPO.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from rlvr.core.uec import retention_mask, truncated_positive_mask
from rlvr.config_sections import UECConfig
from rlvr.errors import ConfigError
from rlvr.parts import ADV_ESTIMATORS, BATCH_FILTERS, CONFIG_CHECKS, SAMPLERS, SamplerContext
from rlvr.samplers.hard_prompt import HardPromptSampler
from rlvr.types import KIND_EXPLORE, RolloutBatch


@SAMPLERS.register("hard_prompt", config=UECConfig, section="uec")
def make_hard_prompt_sampler(ctx: SamplerContext) -> HardPromptSampler:
    """``SAMPLERS["hard_prompt"]``: a :class:`HardPromptSampler` configured from ``ctx.cfg.uec``."""
    u = ctx.cfg.uec
    return HardPromptSampler(
        ctx.engine, ctx.encoder, ctx.scorer, ctx.pad_token_id,
        explore_num_generations=u.explore_num_generations, explore_temperature=u.explore_temperature,
        explore_top_p=u.explore_top_p, explore_logprob_temperature=u.explore_logprob_temperature,
        explore_adv_grouping=u.explore_adv_grouping, hard_pass_rate_max=u.hard_pass_rate_max,
    )


@BATCH_FILTERS.register("uec_retention", config=UECConfig, section="uec")
def make_retention_filter(cfg: Any) -> Callable[[RolloutBatch], RolloutBatch]:
    """``BATCH_FILTERS["uec_retention"]``: keep the rows of :func:`rlvr.core.uec.retention_mask`.

    Exploration rows are those with ``context_kind == "explore"`` (set by the hard-prompt sampler);
    without ``context_kind`` every row counts as regular. Adds ``uec/retained_regular``,
    ``uec/retained_explore`` and ``uec/dropped_truncated_positive`` to ``batch.metrics``.

    Raises:
        ValueError: the batch has no advantages, or per-token ``[N, T]`` ones.

    Source: docs/uec_rl.md §2.4.
    """
    u = cfg.uec

    def retention(batch: RolloutBatch) -> RolloutBatch:
        if batch.advantages is None or batch.advantages.dim() != 1:
            raise ValueError("uec_retention: needs per-sequence advantages [N] (run it after advantages)")
        is_exp = (
            torch.tensor([k == KIND_EXPLORE for k in batch.context_kind], dtype=torch.bool)
            if batch.context_kind is not None else torch.zeros(len(batch), dtype=torch.bool)
        )
        keep = retention_mask(
            batch.advantages, is_exp, batch.is_truncated, regular_floor=u.regular_adv_floor,
            explore_filter=u.explore_filter, explore_floor=u.explore_adv_floor,
            drop_truncated_positive=u.drop_truncated_positive,
        )
        dropped_tp = truncated_positive_mask(batch.advantages, batch.is_truncated) if u.drop_truncated_positive else keep & False
        out = batch.select(keep.nonzero(as_tuple=True)[0])
        metrics = {
            "uec/retained_regular": float((keep & ~is_exp).sum()),
            "uec/retained_explore": float((keep & is_exp).sum()),
            "uec/dropped_truncated_positive": float(dropped_tp.sum()),
        }
        out.metrics = {**batch.metrics, **metrics}
        return out

    return retention


@CONFIG_CHECKS.register("uec")
def check_uec(cfg: Any) -> None:
    """``batch_filters: [uec_retention]`` needs per-sequence advantages ``[N]``.

    Raises:
        ConfigError: the advantage estimator gives per-token advantages (e.g. ``ib_tree``).
    """
    est = ADV_ESTIMATORS.get(cfg.adv_estimator)
    if "uec_retention" in cfg.batch_filters and getattr(est, "per_token", False):
        raise ConfigError(f"batch_filters=[uec_retention] needs per-sequence advantages; adv_estimator="
                          f"{cfg.adv_estimator!r} gives per-token ones")

"""FBOS-RL parts (``specs/fbos_rl.md``): ``SAMPLERS["feedback"]`` (two-round feedback sampler),
``SCHEDULES["fbos"]`` (EPA/ECC views, alternate or joint) and ``POLICY_LOSSES["fbos_epa"]`` (EPA
per-token loss; registered by importing :mod:`rlvr.core.fbos`). Recipe: ``fbos_rl``.
"""

from __future__ import annotations

from typing import Any

import rlvr.core.fbos  # noqa: F401  (registers POLICY_LOSSES["fbos_epa"])
from rlvr.errors import ConfigError
from rlvr.samplers.feedback import FeedbackSampler
from rlvr.trainer.alternate import AlternatingViews
from rlvr.trainer.components import SAMPLERS, SamplerContext
from rlvr.trainer.schedule import SCHEDULES


def make_feedback_sampler(ctx: SamplerContext) -> FeedbackSampler:
    """``SAMPLERS["feedback"]``: a :class:`FeedbackSampler` wired from the run config.

    Raises:
        ConfigError: ``fbos.initial_rollouts`` leaves no feedback slot, or dynamic sampling is on (it
            would split a prompt's two views; the FAP round is FBOS-RL's own remedy for zero-variance
            groups).
    """
    cfg = ctx.cfg
    g1 = cfg.fbos.initial_rollouts if cfg.fbos.initial_rollouts is not None else cfg.num_generations // 2
    if not 1 <= g1 < cfg.num_generations:
        raise ConfigError(
            f"fbos.initial_rollouts={g1} must be in [1, num_generations − 1] = [1, {cfg.num_generations - 1}]"
        )
    if cfg.dynamic_sampling.enable:
        raise ConfigError("sampler=feedback does not support dynamic_sampling.enable=true (it would split the EPA and ECC views)")
    return FeedbackSampler(
        ctx.engine, ctx.encoder, ctx.scorer, ctx.tokenizer, ctx.pad_token_id, cfg.fbos,
        adv_kwargs={"scale_rewards": cfg.scale_rewards, "adv_eps": cfg.adv_eps, "std_unbiased": cfg.adv_std_unbiased},
        max_prompt_length=cfg.max_prompt_length,
    )


def make_fbos_schedule(cfg: Any) -> AlternatingViews:
    """``SCHEDULES["fbos"]``: :class:`AlternatingViews`."""
    return AlternatingViews(cfg)


SAMPLERS["feedback"] = make_feedback_sampler
SCHEDULES["fbos"] = make_fbos_schedule

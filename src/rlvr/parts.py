"""Registries of the replaceable parts a run is built from (besides schedules, :mod:`rlvr.schedules`,
and the core's estimators and losses).

A variant registers its parts with the registries' decorators and ships a recipe that names them; the
trainer never branches on an algorithm name (``design/ARCHITECTURE.md``).

=====================  ===========================  ======================================================
config key             registry                     factory / entry signature
=====================  ===========================  ======================================================
``sampler``            :data:`SAMPLERS`             ``(SamplerContext) -> sampler``
``adv_estimator``      :data:`BATCH_ADV_ESTIMATORS`  ``(RolloutBatch, RLConfig) -> metrics``; sets
                                                    ``batch.advantages`` (``[N]`` or ``[N, T]``)
                       (or core ``ADV_ESTIMATORS``)  ``(rewards [N], group_id [N], ...) -> [N]``
``loss_masks``         :data:`MASKS`                ``(RLConfig) -> MaskFn`` (``rlvr.trainer.update``)
``batch_filters``      :data:`BATCH_FILTERS`        ``(RLConfig) -> (RolloutBatch -> RolloutBatch)``
(every run)            :data:`CONFIG_CHECKS`        ``(RLConfig) -> None``, raises ``ConfigError``
=====================  ===========================  ======================================================

A batch-level advantage estimator needs structure its sampler attached to the batch (a tree index,
context kinds); it runs on the batch exactly as the sampler returned it, after reward shaping and
before any batch filter. A :data:`CONFIG_CHECKS` entry refuses, before any model loads, a combination
of parts that cannot work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from rlvr.registry import Registry
from rlvr.samplers.group import GroupSampler, PromptEncoder
from rlvr.samplers.multiturn import check_env_config, make_multiturn_sampler
from rlvr.types import RolloutBatch


@dataclass
class SamplerContext:
    """What a sampler factory may use: the run config, engine, prompt encoder, scorer, tokenizer."""

    cfg: Any
    engine: Any
    encoder: PromptEncoder
    scorer: Any
    tokenizer: Any
    pad_token_id: int


SAMPLERS: Registry[Callable[[SamplerContext], Any]] = Registry("sampler", "rlvr.parts.SAMPLERS")
"""``cfg.sampler`` → factory ``(SamplerContext) -> sampler`` (``sample(problems, G, params, ...) -> RolloutBatch``)."""
BATCH_ADV_ESTIMATORS: Registry[Callable[[RolloutBatch, Any], dict[str, float]]] = Registry(
    "adv_estimator", "rlvr.parts.BATCH_ADV_ESTIMATORS"
)
"""``cfg.adv_estimator`` → batch-level estimator ``(batch, cfg) -> metrics`` that sets ``batch.advantages``."""
MASKS: Registry[Callable[[Any], Callable[..., Any]]] = Registry("loss_masks", "rlvr.parts.MASKS")
"""``cfg.loss_masks[i]`` → factory ``(RLConfig) -> MaskFn``."""
BATCH_FILTERS: Registry[Callable[[Any], Callable[[RolloutBatch], RolloutBatch]]] = Registry(
    "batch_filters", "rlvr.parts.BATCH_FILTERS"
)
"""``cfg.batch_filters[i]`` → factory ``(RLConfig) -> (RolloutBatch -> RolloutBatch)`` run after advantages."""
CONFIG_CHECKS: Registry[Callable[[Any], None]] = Registry("config check", "rlvr.parts.CONFIG_CHECKS")
"""Name → ``(RLConfig) -> None`` raising :class:`rlvr.errors.ConfigError` for a combination that cannot work."""


@SAMPLERS.register("group")
def make_group_sampler(ctx: SamplerContext) -> Any:
    """``SAMPLERS["group"]``: G completions per prompt (:class:`rlvr.samplers.group.GroupSampler`), or G
    environment episodes per prompt when ``env.type`` is set (:func:`make_multiturn_sampler`)."""
    env = getattr(ctx.cfg, "env", None)
    if env is not None and env.type is not None:
        return make_multiturn_sampler(ctx)
    return GroupSampler(ctx.engine, ctx.encoder, ctx.pad_token_id)


SAMPLERS.register("multiturn")(make_multiturn_sampler)  # environment episodes (rlvr.samplers.multiturn)
CONFIG_CHECKS.register("env")(check_env_config)  # env.type imports; the sampler can run episodes

"""Registries of the replaceable parts a run is built from (besides schedules, :mod:`rlvr.schedules`,
and the core's estimators and losses).

A variant registers its parts with the registries' decorators and ships a recipe that names them; the
trainer never branches on an algorithm name (``docs/architecture.md``).

=====================  ===========================  ======================================================
config key             registry                     factory / entry signature
=====================  ===========================  ======================================================
``sampler``            :data:`SAMPLERS`             ``(SamplerContext) -> sampler``
``adv_estimator``      :data:`ADV_ESTIMATORS`       ``(RolloutBatch, AdvantageContext) -> (advantages, metrics)``,
                                                    advantages ``[N]`` or ``[N, T]``
``loss_masks``         :data:`MASKS`                ``(RLConfig) -> MaskFn`` (``rlvr.trainer.update``)
``batch_filters``      :data:`BATCH_FILTERS`        ``(RLConfig) -> (RolloutBatch -> RolloutBatch)``
(every run)            :data:`CONFIG_CHECKS`        ``(RLConfig) -> None``, raises ``ConfigError``
=====================  ===========================  ======================================================

Every advantage estimator has one signature and runs once per generation batch, after reward shaping
and before any batch filter, on the batch as the sampler returned it (it may read the structure its
sampler attached: a tree index, context kinds). The pure math stays in :mod:`rlvr.core` (GRPO, RLOO,
tree, FBOS views); an entry here adapts it to the batch. Job-wide statistics (``scale_rewards=batch``
under ``torchrun``) come from :meth:`AdvantageContext.job_std` / :meth:`AdvantageContext.sum`, so any
estimator is right on several ranks. A :data:`CONFIG_CHECKS` entry refuses, before any model loads, a combination
of parts that cannot work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from rlvr.core.advantages import check_group_sizes, grpo_advantages, rloo_advantages
from rlvr.distributed.stats import global_std
from rlvr.registry import Registry
from rlvr.samplers.context import SamplerContext
from rlvr.samplers.group import GroupSampler
from rlvr.samplers.multiturn import check_env_config, make_multiturn_sampler
from rlvr.types import RolloutBatch


SAMPLERS: Registry[Callable[[SamplerContext], Any]] = Registry("sampler", "rlvr.parts.SAMPLERS")
"""``cfg.sampler`` → factory ``(SamplerContext) -> sampler`` (``sample(problems, G, params, ...) -> RolloutBatch``)."""
@dataclass
class AdvantageContext:
    """What an advantage estimator may use besides the batch.

    Attributes:
        cfg: the run config (``scale_rewards``, ``adv_eps``, ``adv_std_unbiased``, ``num_generations``, ...).
        config: the estimator's own config section (declared with ``register(name, config=...)``), or ``None``.
        world_size: processes of the job (1 without ``torchrun``).
        reduce_sum: sums a list of floats over every rank (a collective; ``None``: one process, the list
            itself). Call the helpers below on every rank, the same number of times.
    """

    cfg: Any
    config: Any = None
    world_size: int = 1
    reduce_sum: Callable[[Sequence[float]], list[float]] | None = None

    def sum(self, values: Sequence[float]) -> list[float]:
        """``values`` summed elementwise over every rank of the job (one process: ``values``)."""
        return list(values) if self.reduce_sum is None else list(self.reduce_sum(values))

    def job_std(self, values: torch.Tensor, *, unbiased: bool = True) -> float:
        """Standard deviation of every rank's ``values [n]`` together (two-pass formula over the job;
        :func:`rlvr.distributed.stats.global_std`). Source: Lite-PPO / TRL ``scale_rewards="batch"``."""
        return global_std(values, self, unbiased=unbiased)


AdvantageEstimator = Callable[[RolloutBatch, AdvantageContext], "tuple[torch.Tensor, dict[str, float]]"]
"""``(batch, ctx) -> (advantages [N] or [N, T], metrics)``; optional attributes read by checks:
``groupwise`` (reads only each group's rewards, so DAPO dynamic sampling may keep any subset of whole
groups; default false) and ``per_token`` (gives ``[N, T]``)."""

ADV_ESTIMATORS: Registry[AdvantageEstimator] = Registry("adv_estimator", "rlvr.parts.ADV_ESTIMATORS")
"""``cfg.adv_estimator`` → :data:`AdvantageEstimator` (the one advantage seam)."""
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


def compute_advantages(fn: AdvantageEstimator, batch: RolloutBatch, ctx: AdvantageContext) -> dict[str, float]:
    """Run estimator ``fn`` on ``batch`` and store its advantages; returns its metrics.

    An empty batch (a rank without rows under ``torchrun``) is still passed to ``fn`` when the job's
    statistics are needed (``scale_rewards=batch``, several ranks), so every rank joins the collectives;
    its result is then dropped.

    Raises:
        ValueError: the advantages are not ``[N]`` or ``[N, T]`` for the batch's ``N`` rows and ``T``
            completion tokens (the message names the estimator).
    """
    if len(batch) == 0:
        if ctx.world_size > 1 and ctx.cfg.scale_rewards == "batch":
            fn(batch, ctx)
        return {}
    adv, metrics = fn(batch, ctx)
    shapes = ((len(batch),), tuple(batch.completion_mask.shape))
    if not isinstance(adv, torch.Tensor) or tuple(adv.shape) not in shapes:
        got = tuple(adv.shape) if isinstance(adv, torch.Tensor) else type(adv).__name__
        raise ValueError(f"adv_estimator={ctx.cfg.adv_estimator!r} returned advantages of shape {got}; expected "
                         f"{shapes[0]} or {shapes[1]}")
    batch.advantages = adv
    return dict(metrics or {})


def _group_checked(batch: RolloutBatch, ctx: AdvantageContext) -> None:
    if not batch.variable_group_sizes:
        check_group_sizes(batch.group_id, ctx.cfg.num_generations)


@ADV_ESTIMATORS.register("grpo")
def grpo_estimator(batch: RolloutBatch, ctx: AdvantageContext) -> tuple[torch.Tensor, dict[str, float]]:
    """``ADV_ESTIMATORS["grpo"]``: :func:`rlvr.core.advantages.grpo_advantages` of the (shaped) rewards
    with ``scale_rewards``, ``adv_eps``, ``adv_std_unbiased``; ``scale_rewards=batch`` on several ranks
    divides by the job's std (:meth:`AdvantageContext.job_std`), not the rank's.

    Raises:
        ValueError: a group is not ``num_generations`` rows (unless the sampler marked variable sizes).

    Source: grpo_core.md §3 (``scale_rewards``: group, batch, none).
    """
    c = ctx.cfg
    _group_checked(batch, ctx)
    if c.scale_rewards == "batch" and ctx.world_size > 1:
        std = ctx.job_std(batch.rewards, unbiased=c.adv_std_unbiased)
        a = grpo_advantages(batch.rewards, batch.group_id, scale_rewards="none", adv_eps=c.adv_eps,
                            std_unbiased=c.adv_std_unbiased)
        return a / (std + c.adv_eps), {}
    return grpo_advantages(batch.rewards, batch.group_id, scale_rewards=c.scale_rewards, adv_eps=c.adv_eps,
                           std_unbiased=c.adv_std_unbiased), {}


@ADV_ESTIMATORS.register("rloo")
def rloo_estimator(batch: RolloutBatch, ctx: AdvantageContext) -> tuple[torch.Tensor, dict[str, float]]:
    """``ADV_ESTIMATORS["rloo"]``: :func:`rlvr.core.advantages.rloo_advantages` (leave-one-out baseline,
    no scaling).

    Raises:
        ValueError: a group is not ``num_generations`` rows (unless the sampler marked variable sizes).

    Source: Ahmadian et al. 2024 ("Back to Basics") §3; grpo_core.md §3.
    """
    _group_checked(batch, ctx)
    return rloo_advantages(batch.rewards, batch.group_id), {}


grpo_estimator.groupwise = True  # type: ignore[attr-defined]
rloo_estimator.groupwise = True  # type: ignore[attr-defined]


SAMPLERS.register("multiturn")(make_multiturn_sampler)  # environment episodes (rlvr.samplers.multiturn)
CONFIG_CHECKS.register("env")(check_env_config)  # env.type imports; the sampler can run episodes

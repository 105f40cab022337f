"""Which parts a run is built from, and the checks of a run that need no model (:func:`validate_run`).

Importing this module loads every built-in part: the schedules (:mod:`rlvr.schedules`) and the
variants' registrations (:mod:`rlvr.variants`, each module registers on import; no module there
imports the trainer). The registries themselves live in :mod:`rlvr.parts`.
"""

from __future__ import annotations

import os
from typing import Any

import rlvr.schedules  # noqa: F401 (registers on_policy; the variants register theirs, below)
import rlvr.variants.builtin  # noqa: F401 (registers the variants' samplers, estimators, masks, filters, checks)
from rlvr.errors import ConfigError
from rlvr.loggers import check_report_to
from rlvr.parts import ADV_ESTIMATORS, BATCH_FILTERS, CONFIG_CHECKS, MASKS, SAMPLERS, SamplerContext
from rlvr.schedules import SCHEDULES
from rlvr.rewards.combine import check_rewards
from rlvr.trainer.rollout import check_filter_metric

__all__ = ["ADV_ESTIMATORS", "BATCH_FILTERS", "MASKS", "SAMPLERS", "SCHEDULES", "SamplerContext",
           "MASTER_WEIGHTS_DP_ERROR", "validate_components", "validate_run"]

MASTER_WEIGHTS_DP_ERROR = (
    "model.dtype=bf16-master keeps fp32 masters in a one-process optimizer and cannot run under torchrun "
    "(WORLD_SIZE > 1); use model.dtype=bf16, which under FSDP2 keeps sharded fp32 masters with bf16 compute "
    "copies (MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32))"
)
"""The refusal of ``bf16-master`` with data parallelism (:mod:`rlvr.trainer.master_weights`)."""


def _launched_world_size() -> int:
    """:func:`rlvr.distributed.env.launched_world_size` (the reading ``init_distributed`` makes), with a bad
    ``WORLD_SIZE`` as a configuration error.

    Raises:
        ConfigError: ``WORLD_SIZE`` is not an integer.
    """
    from rlvr.distributed.env import launched_world_size

    try:
        return launched_world_size()
    except ValueError:
        raise ConfigError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} (environment): expected an integer, as torchrun sets it") from None


def validate_components(cfg: Any) -> None:
    """Check, before any model loads, that every part the config names is registered and that the
    combination can work (the generic rules below, then every :data:`rlvr.parts.CONFIG_CHECKS` entry).

    Generic rules: an advantage estimator that is not ``groupwise`` (it reads more of a round than each
    group's rewards) refuses dynamic sampling (which keeps only some of a round's groups and merges rounds);
    ``kl_in_reward`` needs ``beta > 0`` (it moves the KL term, weighted by ``beta``, into the reward);
    ``model.dtype=bf16-master`` refuses ``torchrun`` (``RANK`` set and ``WORLD_SIZE > 1``: :data:`MASTER_WEIGHTS_DP_ERROR`).

    Raises:
        ConfigError: naming the key, the registered names (and the nearest one), or the conflict.
    """
    SAMPLERS.check(cfg.sampler)
    SCHEDULES.check(cfg.schedule)
    for m in cfg.loss_masks:
        MASKS.check(m)
    for f in cfg.batch_filters:
        BATCH_FILTERS.check(f)
    est = ADV_ESTIMATORS.lookup(cfg.adv_estimator)
    if not getattr(est, "groupwise", False) and cfg.dynamic_sampling.enable:
        raise ConfigError(
            f"adv_estimator={cfg.adv_estimator!r} is computed from the structure its sampler attaches to a "
            "whole generation round; dynamic_sampling.enable=true would keep only some groups and merge "
            "rounds. Set dynamic_sampling.enable=false"
        )
    if cfg.model.dtype == "bf16-master" and _launched_world_size() > 1:
        raise ConfigError(MASTER_WEIGHTS_DP_ERROR)
    if cfg.kl_in_reward and not cfg.beta > 0:
        raise ConfigError("kl_in_reward=true needs beta > 0 (the KL penalty in the reward is beta · KL); got beta=0")
    for check in CONFIG_CHECKS.keys():
        CONFIG_CHECKS[check](cfg)


def validate_run(cfg: Any, task: Any = None) -> None:
    """Every check of a training run that needs no model, meant to run once per run, before any model
    loads: the parts exist and fit together (:func:`validate_components`), the listed trackers can log
    (:func:`rlvr.loggers.check_report_to`) and, given the ``task``, ``dynamic_sampling.metric`` names a
    component the scored batches carry (:func:`rlvr.trainer.rollout.check_filter_metric`) and the
    ``rewards:`` list fits the task (:func:`rlvr.rewards.combine.check_rewards`).

    ``rlvr train`` runs it in two halves (``task=None`` as soon as the config is read, then the task's
    check once the task is built) and tells the :class:`~rlvr.trainer.trainer.Trainer` so
    (``validated=True``); a ``Trainer`` built from Python runs it itself (interpretation: issue 24,
    item 6, "validate once").

    Args:
        cfg: the run config (:class:`~rlvr.config.RLConfig`).
        task: the run's :class:`~rlvr.tasks.Task`, or None to skip the check that needs it.

    Raises:
        ConfigError: the first failing check's message (a key, the registered names, the conflict,
            or the tracker package to install).
    """
    validate_components(cfg)
    check_report_to(cfg.logging.sinks)  # a missing tracker package fails before any work
    if task is not None:
        check_filter_metric(cfg, task)
        check_rewards(cfg, task)

"""Which parts a run is built from, and the check that they exist and fit together.

Importing this module loads every built-in part: the schedules (:mod:`rlvr.schedules`) and the
variants' registrations (:mod:`rlvr.variants`, each module registers on import; no module there
imports the trainer). The registries themselves live in :mod:`rlvr.parts`.
"""

from __future__ import annotations

import difflib
from typing import Any

import rlvr.schedules  # noqa: F401 (registers the built-in schedules)
import rlvr.variants  # noqa: F401 (registers the variants' samplers, estimators, masks, filters, checks)
from rlvr.core.advantages import ADV_ESTIMATORS
from rlvr.errors import ConfigError
from rlvr.registry import UnknownNameError
from rlvr.parts import BATCH_ADV_ESTIMATORS, BATCH_FILTERS, CONFIG_CHECKS, MASKS, SAMPLERS, SamplerContext
from rlvr.schedules import SCHEDULES

__all__ = ["BATCH_ADV_ESTIMATORS", "BATCH_FILTERS", "MASKS", "SAMPLERS", "SCHEDULES", "SamplerContext",
           "validate_components"]


def validate_components(cfg: Any) -> None:
    """Check, before any model loads, that every part the config names is registered and that the
    combination can work (the generic rules below, then every :data:`rlvr.parts.CONFIG_CHECKS` entry).

    Generic rules: a batch-level advantage estimator runs on the batch as its sampler returned it, so
    it refuses dynamic sampling (which keeps only some of a round's groups and merges rounds);
    ``kl_in_reward`` needs ``beta > 0`` (it moves the KL term, weighted by ``beta``, into the reward).

    Raises:
        ConfigError: naming the key, the registered names (and the nearest one), or the conflict.
    """
    SAMPLERS.check(cfg.sampler)
    SCHEDULES.check(cfg.schedule)
    for m in cfg.loss_masks:
        MASKS.check(m)
    for f in cfg.batch_filters:
        BATCH_FILTERS.check(f)
    if cfg.adv_estimator not in BATCH_ADV_ESTIMATORS and cfg.adv_estimator not in ADV_ESTIMATORS:
        names = sorted(set(ADV_ESTIMATORS) | set(BATCH_ADV_ESTIMATORS))
        close = difflib.get_close_matches(str(cfg.adv_estimator), names, n=1)
        raise UnknownNameError(
            f"adv_estimator: unknown name {cfg.adv_estimator!r} (group estimators in "
            f"rlvr.core.advantages.ADV_ESTIMATORS: {', '.join(map(repr, sorted(ADV_ESTIMATORS)))}; batch-level in "
            f"rlvr.parts.BATCH_ADV_ESTIMATORS: {', '.join(map(repr, sorted(BATCH_ADV_ESTIMATORS)))})"
            + (f"; did you mean {close[0]!r}?" if close else "")
        )
    if cfg.adv_estimator in BATCH_ADV_ESTIMATORS and cfg.dynamic_sampling.enable:
        raise ConfigError(
            f"adv_estimator={cfg.adv_estimator!r} is computed from the structure its sampler attaches to a "
            "whole generation round; dynamic_sampling.enable=true would keep only some groups and merge "
            "rounds. Set dynamic_sampling.enable=false"
        )
    if cfg.kl_in_reward and not cfg.beta > 0:
        raise ConfigError("kl_in_reward=true needs beta > 0 (the KL penalty in the reward is beta · KL); got beta=0")
    for check in CONFIG_CHECKS.keys():
        CONFIG_CHECKS[check](cfg)

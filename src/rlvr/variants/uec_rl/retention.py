"""UEC-RL's retention rule after advantages (``docs/uec_rl.md`` §2.4): registers ``BATCH_FILTERS["uec_retention"]``
and ``CONFIG_CHECKS["uec"]``.

* ``BATCH_FILTERS["uec_retention"]`` — regular rows need ``|Â| > uec.regular_adv_floor``, exploration rows
  pass ``uec.explore_filter`` / ``uec.explore_adv_floor``, truncated positive rows are dropped
  (``uec.drop_truncated_positive``); the row predicates are :mod:`rlvr.core.uec`;
* ``CONFIG_CHECKS["uec"]`` — the retention rule needs per-sequence advantages.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from rlvr.core.uec import retention_mask, truncated_positive_mask
from rlvr.errors import ConfigError
from rlvr.parts import ADV_ESTIMATORS, BATCH_FILTERS, CONFIG_CHECKS
from rlvr.types import KIND_EXPLORE, RolloutBatch
from rlvr.variants.uec_rl.config import UECConfig


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

"""Reducing per-rank step metrics to one row (written once, by rank 0).

Each rank computes its metrics over its own groups; the job's value of a metric is a reduction over
ranks chosen by its name (:func:`reduction_for`). Pure functions: tested without processes.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

__all__ = ["reduction_for", "reduce_metric_dicts", "SUM_KEYS"]

SUM_KEYS = (
    "perf/num_tokens", "perf/tokens_per_s", "perf/generated_tokens_per_s", "actor/num_loss_tokens",
    "reward/verifier_errors", "reward/verifier_timeouts", "dynamic_sampling/shortfall",
    "dynamic_sampling/num_gen_batches_total",
)
"""Metrics that count things done by every rank (tokens, errors, throughput): summed over ranks."""


def reduction_for(name: str, *, loss_is_partial: bool = True) -> str:
    """How metric ``name`` combines over ranks: ``"sum"``, ``"max"``, ``"min"`` or ``"mean"``.

    * ``sum``: counts and throughputs (:data:`SUM_KEYS`, names ending ``_total``), and ``loss/*`` values
      (also phase-prefixed, ``epa/loss/*``) when ``loss_is_partial``: with global normalisers each rank's
      loss is its share of the job's loss (numerator over the all-reduced denominator).
    * ``max``: names ending ``/max`` or ``_max``, ``timing/*`` (a step lasts as long as its slowest rank)
      and ``perf/peak_memory_mb`` (the rank that bounds the machine).
    * ``min``: names ending ``/min`` or ``_min``.
    * ``mean``: everything else (rank means; equal to the job mean when ranks hold equal row counts, as
      they do with whole groups and ``generation_batch_size`` divisible by the world size).

    Interpretation: verl and TRL reduce rank metrics by mean except counts; the per-name rule here is the
    same with max/min kept exact.
    """
    base = name.split("/", 1)[1] if name.count("/") >= 2 and name.split("/", 1)[1].startswith("loss/") else name
    if base.startswith("loss/"):
        return "sum" if loss_is_partial else "mean"
    if name in SUM_KEYS or name.endswith("_total"):
        return "sum"
    if name.endswith(("/max", "_max")) or name.startswith("timing/") or name == "perf/peak_memory_mb":
        return "max"
    if name.endswith(("/min", "_min")):
        return "min"
    return "mean"


def reduce_metric_dicts(rows: Sequence[Mapping[str, float]], *, loss_is_partial: bool = True) -> dict[str, float]:
    """One metric row from one row per rank.

    A key missing on some ranks is reduced over the ranks that have it; NaN values are kept out of
    mean/max/min unless every rank reports NaN. ``perf/tokens_per_s`` and ``perf/generated_tokens_per_s``
    are also reported per rank (``..._per_rank``, the rank mean).

    Args:
        rows: per-rank ``{name: float}``, rank order.
        loss_is_partial: see :func:`reduction_for` (False under ``loss_norm_scope=micro``).

    Returns:
        ``{name: value}`` over the union of keys (sorted).
    """
    keys = sorted({k for r in rows for k in r})
    out: dict[str, float] = {}
    for k in keys:
        vals = [float(r[k]) for r in rows if k in r]
        how = reduction_for(k, loss_is_partial=loss_is_partial)
        finite = [v for v in vals if not math.isnan(v)]
        if how == "sum":
            out[k] = sum(vals)
        elif not finite:
            out[k] = math.nan
        elif how == "max":
            out[k] = max(finite)
        elif how == "min":
            out[k] = min(finite)
        else:
            out[k] = sum(finite) / len(finite)
        if k in ("perf/tokens_per_s", "perf/generated_tokens_per_s") and len(rows) > 1:
            out[k + "_per_rank"] = sum(vals) / len(vals)
    return out

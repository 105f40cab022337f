"""A run's training curve: the :data:`CURVE_KEYS` a comparison keeps of each logged step
(:func:`curve_values`, one ``curve.jsonl`` row) and the run's summary numbers from those rows
(:func:`curve_summary`: final/best reward, final entropy, mean grad norm).

Separate from :mod:`rlvr.compare.harness` because what a curve keeps (and how per-phase keys of a
schedule such as FBOS-RL's are merged) changes with the metrics the trainer logs, not with how runs
are executed; ``docs/results/replication/rederive_curves.py`` rebuilds curves from ``metrics.jsonl``
with it and no model.
"""

from __future__ import annotations

import math
from typing import Any

from rlvr.eval.plot import smooth

CURVE_KEYS = ("reward/mean", "reward/pass_rate", "reward/frac_zero_std_groups", "actor/entropy", "actor/grad_norm",
              "actor/clip_ratio/region", "completions/mean_length", "staleness/mean",
              "mu_grpo/veto_response_rate")


def curve_values(metrics: dict[str, Any], primary_phase: str | None = None) -> dict[str, float]:
    """The :data:`CURVE_KEYS` of one logged step.

    A key a schedule logs only per phase (FBOS-RL's alternate mode logs ``epa/actor/entropy`` on its EPA
    step and ``ecc/actor/entropy`` on its ECC step):

    * ``primary_phase`` given (the schedule's ``primary_phase``, e.g. ``"epa"``): the bare key takes that
      phase's value only, and every other phase's value is kept under its own prefixed name
      (``ecc/actor/entropy``). Interpretation, because averaging mixes unlike quantities: the ECC step's
      entropy is measured on the feedback-augmented prompt, not on the task's prompt, and its gradient is
      exactly 0 when no FAP rollout passes — averaged in, they inflate the entropy and halve the grad
      norm of the run summary (measured on the testbed: entropy 0.88 instead of 0.38, grad norm 0.59
      instead of 1.2; docs/results/replication.md §1.4).
    * no ``primary_phase``: the mean of the finite phase values.
    """
    out: dict[str, float] = {}
    for k in CURVE_KEYS:
        v = metrics.get(k)
        if isinstance(v, (int, float)) and math.isfinite(v):
            out[k] = float(v)
            continue
        phased = {name[: -len(k) - 1]: float(x) for name, x in metrics.items()
                  if name.endswith("/" + k) and isinstance(x, (int, float)) and math.isfinite(x)}
        if not phased:
            continue
        if primary_phase is None:
            out[k] = sum(phased.values()) / len(phased)
            continue
        for phase, x in phased.items():
            out[k if phase == primary_phase else f"{phase}/{k}"] = x
    return out


def curve_summary(curve: list[dict[str, Any]]) -> dict[str, float]:
    """Final/best training reward and final entropy / mean grad norm of one run.

    ``reward/final``: mean ``reward/mean`` over the last ``w`` logged generation rounds, with
    ``w = max(1, min(5, n // 4))``; ``reward/best``: the maximum of the ``w``-point moving average;
    ``entropy/final``: mean ``actor/entropy`` (nats/token) over the last ``w`` steps;
    ``grad_norm/mean``: mean pre-clip gradient norm over the run. NaN where nothing was logged.
    """
    out: dict[str, float] = {}

    def col(k: str) -> list[float]:
        return [float(r[k]) for r in curve if k in r]

    for key, name in (("reward/mean", "reward"), ("reward/pass_rate", "pass_rate")):
        ys = col(key)
        if ys:
            w = max(1, min(5, len(ys) // 4))
            out[f"{name}/final"] = sum(ys[-w:]) / w
            out[f"{name}/best"] = max(smooth(ys, w))
        else:
            out[f"{name}/final"] = out[f"{name}/best"] = math.nan
    ent = col("actor/entropy")
    w = max(1, min(5, len(ent) // 4)) if ent else 1
    out["entropy/final"] = sum(ent[-w:]) / w if ent else math.nan
    g = col("actor/grad_norm")
    out["grad_norm/mean"] = sum(g) / len(g) if g else math.nan
    z = col("reward/frac_zero_std_groups")
    out["zero_std_groups/mean"] = sum(z) / len(z) if z else math.nan
    return out

"""Per-seed values of a claim's metric: read from ``rlvr compare`` run folders, flat result copies or a
``runs.json`` series, plus the derived per-run metrics (:data:`METRICS`) and the Student-t interval
the older result pages quote (:func:`t_interval`).

Separate from :mod:`rlvr.compare.claims` because where per-seed numbers come from (and which derived
metrics exist) changes with what runs log, not with the rules that judge a claim.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

from rlvr.compare.report import read_curve
from rlvr.errors import ConfigError

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 25: 2.060, 30: 2.042}
"""Two-sided 95 % Student-t quantiles ``t_{0.975, df}`` (standard tables; df > 30 uses 1.96, a
df between tabulated values the next smaller df, i.e. the wider interval)."""


def t_interval(values: Sequence[float]) -> tuple[float, float, int]:
    """``(mean, half_width, n)`` of the finite ``values``: the two-sided 95 % Student-t interval is
    ``mean ± half_width`` (``half_width = t_{0.975, n−1} · s / √n``, ``s`` the sample std).
    One value: half-width ``inf``; none: ``(nan, nan, 0)``."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(vals)
    if n == 0:
        return math.nan, math.nan, 0
    m = statistics.fmean(vals)
    if n == 1:
        return m, math.inf, 1
    df = n - 1
    t = 1.959963984540054 if df > 30 else T975[max(d for d in T975 if d <= df)]
    return m, t * statistics.stdev(vals) / math.sqrt(n), n


# ------------------------------------------------------------------------------------------ metrics
def _eval_rows(curve: list[dict[str, Any]], key: str = "eval/pass@1") -> list[dict[str, Any]]:
    return [r for r in curve if key in r]


def _auc_rollouts(result: dict[str, Any], curve: list[dict[str, Any]]) -> float:
    """Mean held-out pass@1 over the evaluation points of the run (the mid-run ones at equal budget
    fractions and the final one): the area under the held-out learning curve, per unit budget."""
    pts = [float(r["eval/pass@1"]) for r in _eval_rows(curve)]
    return sum(pts) / len(pts) if pts else math.nan


def _curve_mean(key: str) -> Callable[[dict[str, Any], list[dict[str, Any]]], float]:
    def f(result: dict[str, Any], curve: list[dict[str, Any]]) -> float:
        ys = [float(r[key]) for r in curve if key in r and math.isfinite(float(r[key]))]
        return sum(ys) / len(ys) if ys else math.nan

    f.__doc__ = f"mean of {key} over the run's logged steps"
    return f


def _level_mean(levels: Sequence[int], k: int) -> Callable[[dict[str, Any], list[dict[str, Any]]], float]:
    def f(result: dict[str, Any], curve: list[dict[str, Any]]) -> float:
        vals = [result.get(f"eval/level{lv}/pass@{k}") for lv in levels]
        vals = [float(v) for v in vals if v is not None]
        return sum(vals) / len(vals) if vals else math.nan

    return f


def _traj_per_token(result: dict[str, Any], curve: list[dict[str, Any]]) -> float:
    return result["rollouts"] / result["tokens"] if result.get("tokens") else math.nan


def _entropy_ratio(result: dict[str, Any], curve: list[dict[str, Any]]) -> float:
    """Final over initial entropy (mean of the last / first 3 logged values)."""
    ys = [float(r["actor/entropy"]) for r in curve if "actor/entropy" in r]
    if len(ys) < 2:
        return math.nan
    w = min(3, len(ys) // 2)
    return (sum(ys[-w:]) / w) / max(sum(ys[:w]) / w, 1e-12)


METRICS: dict[str, Callable[[dict[str, Any], list[dict[str, Any]]], float]] = {
    "auc/pass@1": _auc_rollouts,
    "entropy/run_mean": _curve_mean("actor/entropy"),
    "grad_norm/run_mean": _curve_mean("actor/grad_norm"),
    "entropy/final_over_initial": _entropy_ratio,
    "hard/pass@1": _level_mean((7, 8), 1),
    "hard/pass@8": _level_mean((7, 8), 8),
    "trajectories_per_token": _traj_per_token,
    "veto/response_rate_mean": _curve_mean("mu_grpo/veto_response_rate"),
}
"""Derived per-run metrics (``result.json`` + ``curve.jsonl`` → float). Any other name is read from
``result.json`` directly (``eval/pass@1``, ``eval/level9/pass@8``, ``wall_s``, ``tokens`` …).
``hard/*`` averages testbed v2's hard levels 7 and 8 (pre-trained with letter noise 0.45);
``veto/response_rate_mean`` is μ-GRPO's share of negative-advantage responses the veto cut, averaged over
updates (0 when it never fired: the precondition of the veto claims)."""


def at_x(curve: list[dict[str, Any]], key: str, xkey: str, x: float) -> float:
    """``key`` (e.g. ``eval/pass@1``) linearly interpolated at ``xkey == x`` (``step``, ``rollouts``,
    ``tokens``, ``wall_s``) from the curve rows that hold ``key``; NaN outside the logged range."""
    pts = sorted((float(r[xkey]), float(r[key])) for r in curve if key in r and xkey in r)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[0][1] if pts and pts[0][0] == x else math.nan


def at_level(curve: list[dict[str, Any]], key: str, level_key: str, level: float, xkey: str = "step") -> float:
    """``key`` at the first ``xkey`` where ``level_key`` reaches ``level``: e.g. the entropy of a run when its
    held-out pass@1 first reaches 0.4 (a comparison "at matched pass@1").

    The crossing ``x*`` is linearly interpolated between the two curve rows holding ``level_key`` around it
    (the first row already at or above ``level`` gives its own ``x``); ``key`` is then read at ``x*`` by
    :func:`at_x` from the rows that hold it. NaN when ``level_key`` never reaches ``level`` or ``key`` is not
    logged around ``x*``.

    Source: interpretation (issue 29: FBOS-RL's "higher entropy at matched pass@1"): a run's quantity compared
    at equal task performance instead of equal budget, so that a run that learns faster is not credited or
    blamed for the entropy drop that learning itself brings.
    """
    pts = sorted((float(r[xkey]), float(r[level_key])) for r in curve if level_key in r and xkey in r)
    x_star = math.nan
    for i, (x1, y1) in enumerate(pts):
        if y1 >= level:
            if i == 0 or y1 == pts[i - 1][1]:
                x_star = x1
            else:
                x0, y0 = pts[i - 1]
                x_star = x0 + (level - y0) * (x1 - x0) / (y1 - y0)
            break
    if not math.isfinite(x_star):
        return math.nan
    return at_x(curve, key, xkey, x_star)


def metric_value(result: dict[str, Any], curve: list[dict[str, Any]], metric: str) -> float:
    """One run's value of ``metric`` from its ``result.json`` dict and ``curve.jsonl`` rows (NaN when
    the key is missing, e.g. a curve metric of a run whose curve is not kept). Besides
    :data:`METRICS` and ``result.json`` keys, ``KEY@XKEY=X`` reads a curve key at an x value
    (:func:`at_x`), e.g. ``eval/pass@1@step=32``: held-out pass@1 after 32 optimizer updates, and
    ``KEY@LEVELKEY>=L`` reads ``KEY`` where ``LEVELKEY`` first reaches ``L`` (:func:`at_level`; ``KEY`` has no
    ``@``), e.g. ``actor/entropy@eval/pass@1>=0.4``: the entropy at a matched held-out pass@1 of 0.4."""
    if ">=" in metric:
        head, _, level = metric.rpartition(">=")
        key, _, level_key = head.partition("@")
        return at_level(curve, key, level_key, float(level))
    if "=" in metric:
        head, _, x = metric.rpartition("=")
        key, _, xkey = head.rpartition("@")
        return at_x(curve, key, xkey, float(x))
    if metric in METRICS:
        return float(METRICS[metric](result, curve))
    v = result.get(metric)
    return float(v) if isinstance(v, (int, float)) else math.nan


def run_metric(run_dir: Path, metric: str) -> float:
    """:func:`metric_value` of the run folder ``run_dir`` (NaN when it has no ``result.json``)."""
    p = run_dir / "result.json"
    if not p.exists():
        return math.nan
    return metric_value(json.loads(p.read_text()), read_curve(run_dir), metric)


def _runs_json(source: str) -> list[dict[str, Any]]:
    """The rows of ``RUNS.json#SERIES`` (the per-run result dicts a results page keeps, each with ``arm``
    and ``seed``; e.g. ``docs/results/replication/v2l/runs.json#v2l_main``).

    Raises:
        ConfigError: the file or the series is missing.
    """
    path, _, series = source.partition("#")
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"claims: runs file {path} does not exist")
    data = json.loads(p.read_text())
    if series not in data:
        raise ConfigError(f"claims: {path} has no series {series!r}; it has {sorted(data)}")
    return list(data[series])


def seed_values(source: str | Path, arm: str, metric: str) -> dict[int, float]:
    """``{seed: value}`` of ``metric`` for ``arm`` (finished runs with a finite value only).

    ``source`` is an ``rlvr compare`` folder (``<arm>/seed<k>/result.json`` + ``curve.jsonl``), a folder of
    the flat copies the docs keep (``<arm>.seed<k>.result.json``) or ``RUNS.json#SERIES`` (the last two:
    result rows only, so curve metrics are NaN there and left out).
    """
    src = str(source)
    flat = sorted(Path(src).glob(f"{arm}.seed*.result.json")) if Path(src).is_dir() else []
    if src.endswith(".json") or ".json#" in src:
        vals = {int(r["seed"]): metric_value(r, [], metric) for r in _runs_json(src) if r.get("arm") == arm}
    elif flat and not (Path(src) / arm).is_dir():
        vals = {int(f.name[len(arm) + 5:-12]): metric_value(json.loads(f.read_text()), [], metric) for f in flat
                if f.name[len(arm) + 5:-12].isdigit()}
    else:
        root = Path(src) / arm
        vals = {int(d.name[4:]): run_metric(d, metric) for d in root.glob("seed*") if d.name[4:].isdigit()}
    return {s: v for s, v in sorted(vals.items()) if math.isfinite(v)}


def arm_values(compare_dir: str | Path, arm: str, metric: str) -> list[float]:
    """Per-seed values of ``metric`` for ``arm`` in seed order (missing runs left out)."""
    return list(seed_values(compare_dir, arm, metric).values())

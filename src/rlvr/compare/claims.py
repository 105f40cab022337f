"""Paper claims checked against ``rlvr compare`` runs: 95 % intervals over seeds and a verdict per claim.

A *claims file* (YAML) lists claims and figures::

    title: Replication on testbed v2
    claims:
      - paper: FBOS-RL
        claim: higher final pass@1 than GRPO
        compare: runs/compare/v2_main          # an rlvr compare folder
        arm: fbos_rl
        ref: grpo                               # default grpo
        metric: eval/pass@1                     # see METRICS
        direction: higher                       # higher | lower | match | faster
    figures:
      - paper: FBOS-RL
        compare: runs/compare/v2_main
        arms: [grpo, fbos_rl]
        path: docs/results/replication_fbos.png

``python -m rlvr.compare.claims CLAIMS.yaml --out docs/results/replication_claims.md`` writes the
table (Markdown + JSON next to it) and the figures.

Rules (issue 17 §3):

* per arm, the per-seed values of the metric give a mean and a **two-sided 95 % Student-t
  interval** ``mean ± t_{0.975, n−1} · s / √n`` (:func:`t_interval`);
* ``higher`` / ``lower``: reproduced only when the arm's interval lies entirely above / below the
  reference arm's mean (``higher`` with ``times`` t: above ``t ×`` the reference mean, e.g. "≥ 1.4×");
* ``match`` ("matches GRPO"): reproduced when the reference mean lies inside the arm's interval
  *and* that interval is narrower than ``± tolerance`` (default 0.05), so a claim of equality is not
  "reproduced" merely because the seeds are too noisy to tell;
* ``faster`` (wall clock, ``factor`` f, default 1.5): reproduced when the arm's interval of
  ``wall_s`` lies entirely below ``ref mean / f``;
* ``band`` (``lo``, ``hi``): reproduced when the arm's interval lies inside ``[lo, hi]``.

Source: interpretation of issue 17 §3 ("mean ± 95 % confidence interval (say how computed), a claim
counts as reproduced only when the interval excludes GRPO's mean in the claimed direction").
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
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
}
"""Derived per-run metrics (``result.json`` + ``curve.jsonl`` → float). Any other name is read from
``result.json`` directly (``eval/pass@1``, ``eval/level9/pass@8``, ``wall_s``, ``tokens`` …).
``hard/*`` averages testbed v2's hard levels 7 and 8 (pre-trained with letter noise 0.45)."""


def at_x(curve: list[dict[str, Any]], key: str, xkey: str, x: float) -> float:
    """``key`` (e.g. ``eval/pass@1``) linearly interpolated at ``xkey == x`` (``step``, ``rollouts``,
    ``tokens``, ``wall_s``) from the curve rows that hold ``key``; NaN outside the logged range."""
    pts = sorted((float(r[xkey]), float(r[key])) for r in curve if key in r and xkey in r)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[0][1] if pts and pts[0][0] == x else math.nan


def run_metric(run_dir: Path, metric: str) -> float:
    """One run's value of ``metric`` (NaN when the run or the key is missing). Besides
    :data:`METRICS` and ``result.json`` keys, ``KEY@XKEY=X`` reads a curve key at an x value
    (:func:`at_x`), e.g. ``eval/pass@1@step=32``: held-out pass@1 after 32 optimizer updates."""
    p = run_dir / "result.json"
    if not p.exists():
        return math.nan
    result = json.loads(p.read_text())
    if "=" in metric:
        head, _, x = metric.rpartition("=")
        key, _, xkey = head.rpartition("@")
        return at_x(read_curve(run_dir), key, xkey, float(x))
    if metric in METRICS:
        return float(METRICS[metric](result, read_curve(run_dir)))
    v = result.get(metric)
    return float(v) if isinstance(v, (int, float)) else math.nan


def arm_values(compare_dir: str | Path, arm: str, metric: str) -> list[float]:
    """Per-seed values of ``metric`` for ``arm`` (seed folders in numeric order; missing runs left out)."""
    root = Path(compare_dir) / arm
    dirs = sorted(root.glob("seed*"), key=lambda d: int(d.name[4:]) if d.name[4:].isdigit() else 0)
    vals = [run_metric(d, metric) for d in dirs]
    return [v for v in vals if math.isfinite(v)]


# ------------------------------------------------------------------------------------------ claims
@dataclass
class Claim:
    """One claim of one paper (see the module docstring for the verdict rules)."""

    paper: str
    claim: str
    compare: str
    arm: str
    metric: str
    direction: str = "higher"
    ref: str = "grpo"
    ref_compare: str | None = None
    tolerance: float = 0.05
    factor: float = 1.5
    times: float = 1.0
    lo: float | None = None
    hi: float | None = None
    note: str = ""

    def __post_init__(self) -> None:
        if self.direction not in ("higher", "lower", "match", "faster", "band"):
            raise ConfigError(f"claim {self.claim!r}: direction must be higher, lower, match, faster or band, "
                              f"got {self.direction!r}")
        if self.direction == "band" and (self.lo is None or self.hi is None):
            raise ConfigError(f"claim {self.claim!r}: direction band needs lo and hi")


def verdict(claim: Claim, arm_vals: Sequence[float], ref_vals: Sequence[float]) -> dict[str, Any]:
    """Mean, interval and verdict of ``claim`` from per-seed values.

    Returns:
        ``{arm: [mean, half, n], ref: [mean, half, n], reproduced: bool | None, rule: str}``;
        ``reproduced`` is None when a side has no finished run.
    """
    m, h, n = t_interval(arm_vals)
    rm, rh, rn = t_interval(ref_vals)
    out: dict[str, Any] = {"arm": [m, h, n], "ref": [rm, rh, rn]}
    need_ref = claim.direction != "band"
    if n == 0 or (need_ref and rn == 0):
        out.update(reproduced=None, rule="no finished runs")
        return out
    lo, hi = m - h, m + h
    d = claim.direction
    if d == "higher":
        t = claim.times
        ok = lo > t * rm
        ref = f"ref mean {rm:.3f}" if t == 1 else f"{t:g} × ref mean {rm:.3f}"
        rule = f"CI low {lo:.3f} {'>' if ok else '≤'} {ref}"
    elif d == "lower":
        ok = hi < rm
        rule = f"CI high {hi:.3f} {'<' if ok else '≥'} ref mean {rm:.3f}"
    elif d == "match":
        inside, narrow = lo <= rm <= hi, h <= claim.tolerance
        ok = inside and narrow
        rule = (f"ref mean {rm:.3f} {'in' if inside else 'outside'} [{lo:.3f}, {hi:.3f}], half-width {h:.3f} "
                f"{'≤' if narrow else '>'} {claim.tolerance}")
    elif d == "faster":
        ok = hi < rm / claim.factor
        rule = f"CI high {hi:.2f} s {'<' if ok else '≥'} ref mean / {claim.factor:g} = {rm / claim.factor:.2f} s"
    else:
        ok = claim.lo <= lo and hi <= claim.hi
        rule = f"CI [{lo:.3f}, {hi:.3f}] {'inside' if ok else 'not inside'} [{claim.lo:g}, {claim.hi:g}]"
    out.update(reproduced=bool(ok), rule=rule)
    return out


@dataclass
class ClaimsFile:
    """A parsed claims file: ``title``, ``claims`` and ``figures`` (dicts: paper, compare, arms, path,
    optional metrics as ``[[metric, x], ...]``)."""

    title: str
    claims: list[Claim]
    figures: list[dict[str, Any]] = field(default_factory=list)

    @staticmethod
    def load(path: str | Path) -> "ClaimsFile":
        """Read a claims YAML.

        Raises:
            ConfigError: unknown keys, a claim missing a field, a bad direction (names the claim).
        """
        import yaml

        d = yaml.safe_load(Path(path).read_text()) or {}
        bad = set(d) - {"title", "claims", "figures"}
        if bad:
            raise ConfigError(f"{path}: unknown keys {sorted(bad)}; valid: title, claims, figures")
        claims = []
        for i, c in enumerate(d.get("claims") or []):
            try:
                claims.append(Claim(**c))
            except TypeError as exc:
                raise ConfigError(f"{path}: claim {i} ({c.get('claim', '?')!r}): {exc}") from None
        return ClaimsFile(str(d.get("title", "Claims")), claims, list(d.get("figures") or []))


def _fmt(mhn: Sequence[float], nd: int = 3) -> str:
    m, h, n = mhn
    if n == 0:
        return "–"
    return f"{m:.{nd}f} ± {h:.{nd}f} (n={n})" if math.isfinite(h) else f"{m:.{nd}f} (n=1)"


DEFAULT_FIGURE_METRICS = [("eval/pass@1", "rollouts"), ("eval/pass@1", "step"), ("eval/pass@1", "wall_s"),
                          ("actor/entropy", "step"), ("actor/grad_norm", "step"), ("reward/mean", "rollouts")]


def write_claims(cf: ClaimsFile, out_md: str | Path) -> Path:
    """Evaluate every claim, write the Markdown table to ``out_md`` and JSON next to it (same stem),
    and draw the figures (:func:`rlvr.compare.report.plot_curves`). Returns ``out_md``."""
    from rlvr.compare.report import plot_curves

    out_md = Path(out_md)
    rows, js = [], []
    for c in cf.claims:
        v = verdict(c, arm_values(c.compare, c.arm, c.metric), arm_values(c.ref_compare or c.compare, c.ref, c.metric))
        nd = 1 if c.metric in ("wall_s", "tokens", "rollouts") else 3
        word = {True: "**reproduced**", False: "not reproduced", None: "not run"}[v["reproduced"]]
        ref = "–" if c.direction == "band" else f"{c.ref}: {_fmt(v['ref'], nd)}"
        rows.append(f"| {c.paper} | {c.claim} | `{c.metric}` | {c.arm}: {_fmt(v['arm'], nd)} | {ref} | {word} "
                    f"({v['rule']}) |")
        js.append({**c.__dict__, **v})
    lines = [f"### {cf.title}", "",
             "| paper | claim | metric | arm: mean ± 95 % CI | GRPO (reference): mean ± 95 % CI | verdict |",
             "|---|---|---|---|---|---|", *rows, ""]
    for f in cf.figures:
        metrics = [tuple(m) for m in f.get("metrics", DEFAULT_FIGURE_METRICS)]
        seeds = sorted({int(d.name[4:]) for a in f["arms"] for d in (Path(f["compare"]) / a).glob("seed*")
                        if d.name[4:].isdigit()})
        p = plot_curves(Path(f["compare"]), f["arms"], seeds, metrics=metrics, path=Path(f["path"]),
                        title=f"{f['paper']}: mean over seeds, band = min–max", window=int(f.get("window", 1)))
        if p is not None:
            lines += [f"![{f['paper']}]({Path(f['path']).name})", ""]
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text("\n".join(lines))
    out_md.with_suffix(".json").write_text(json.dumps(js, indent=2, default=str) + "\n")
    return out_md


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m rlvr.compare.claims CLAIMS.yaml --out docs/results/replication_claims.md``."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("claims")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    print(f"wrote {write_claims(ClaimsFile.load(args.claims), args.out)}")


if __name__ == "__main__":
    main()

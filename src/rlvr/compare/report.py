"""The comparison report: a Markdown table (mean ± std over seeds) and PNG curves.

Reads ``OUT/<arm>/seed<k>/result.json`` and ``curve.jsonl`` written by
:func:`rlvr.compare.harness.run_one`; needs no model, so ``rlvr compare --report-only`` can
re-render a report at any time (also for a partly finished comparison: missing runs are listed).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from rlvr.eval.plot import read_jsonl_rows, smooth

if TYPE_CHECKING:  # the spec and harness import this module, not the other way round
    from rlvr.compare.budget import Budget

BASELINE = "initial"
"""The report row (and folder) of the untrained policy (``eval.baseline``)."""


def read_curve(run_dir: str | Path) -> list[dict[str, Any]]:
    """Rows of a run's ``curve.jsonl`` (a torn last line is skipped; no file gives ``[]``)."""
    return read_jsonl_rows(Path(run_dir) / "curve.jsonl")

COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("reward/final", "final reward", 3),
    ("reward/best", "best reward", 3),
    ("eval/pass@1", "held-out pass@1", 3),
    ("eval/pass@k", "held-out pass@k", 3),
    ("entropy/final", "entropy (nats/tok)", 3),
    ("grad_norm/mean", "grad norm", 3),
    ("zero_std_groups/mean", "zero-std groups", 2),
    ("wall_s", "wall time (s)", 0),
    ("tokens", "generated tokens", 0),
    ("rollouts", "rollouts", 0),
    ("steps", "optimizer steps", 0),
)


def mean_spread(values: Sequence[float]) -> tuple[float, float]:
    """``(mean, sample std)`` of the finite values (std 0 for one value; ``(nan, nan)`` for none)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def _fmt(m: float, s: float, nd: int) -> str:
    if math.isnan(m):
        return "–"
    return f"{m:.{nd}f} ± {s:.{nd}f}"


def load_results(out: Path, arms: Sequence[str], seeds: Sequence[int]) -> dict[str, list[dict[str, Any]]]:
    """``arm → [result dicts of finished seeds]``; ``eval/pass@k`` is filled from the largest k present."""
    res: dict[str, list[dict[str, Any]]] = {}
    for a in arms:
        rows = []
        for s in seeds:
            p = out / a / f"seed{s}" / "result.json"
            if p.exists():
                r = json.loads(p.read_text())
                ks = sorted(int(k.split("@")[1]) for k in r if k.startswith("eval/pass@"))
                if ks:
                    r["eval/pass@k"] = r[f"eval/pass@{ks[-1]}"]
                    r["_k"] = ks[-1]
                rows.append(r)
        res[a] = rows
    return res


def arm_precisions(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The distinct precisions an arm's finished seeds ran at (``result.json``'s ``precision``; sorted)."""
    return sorted({str(r["precision"]) for r in rows if r.get("precision")})


def precision_notes(summary: dict[str, Any]) -> list[str]:
    """Report lines that flag mixed precision: an arm whose seeds ran at different precisions (its mean ±
    std mixes them), and arms that differ in precision (their differences include the precision's)."""
    notes = [f"**Mixed precision within arm {a}**: its seeds ran at {', '.join(s['precision'])}, so its cells "
             "average over precisions." for a, s in summary.items() if len(s.get("precision", [])) > 1]
    by = {}
    for a, s in summary.items():
        if len(s.get("precision", [])) == 1:
            by.setdefault(s["precision"][0], []).append(a)
    if len(by) > 1:
        notes.append("**Arms of different precisions**: " + "; ".join(f"{p}: {', '.join(v)}" for p, v in sorted(by.items()))
                     + ". Differences between them include the precision's (see docs/precision.md).")
    return notes


def summary_table(out: Path, arms: Sequence[str], seeds: Sequence[int]) -> tuple[str, dict[str, Any]]:
    """The Markdown table and a JSON-ready summary ``{arm: {column: [mean, std], "regimes": {...}}}``.

    Beside the means, the column *pass@1: collapsed / took off* counts the seeds whose held-out pass@1
    collapsed or took off (:func:`rlvr.compare.stats_rules.regime_counts`, default thresholds, relative
    to the mean of the untrained row when the comparison has one), so a mean over a bimodal set of
    seeds is not read alone (issue 29)."""
    from rlvr.compare.stats_rules import regime_counts

    res = load_results(out, arms, seeds)
    ks = {r.get("_k") for rows in res.values() for r in rows if r.get("_k")}
    k_label = f"held-out pass@{ks.pop()}" if len(ks) == 1 else "held-out pass@k"
    head = ["arm", "seeds", "precision"] + [k_label if key == "eval/pass@k" else label for key, label, _ in COLUMNS]
    head.append("pass@1: collapsed / took off")
    base = [r["eval/pass@1"] for r in res.get(BASELINE, []) if isinstance(r.get("eval/pass@1"), (int, float))]
    start = sum(base) / len(base) if base else None
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    summary: dict[str, Any] = {}
    for a in arms:
        rows = res[a]
        precisions = arm_precisions(rows)
        cells = [a, str(len(rows)), " + ".join(precisions) if precisions else "–"]
        summary[a] = {"n": len(rows), "precision": precisions}
        for key, _, nd in COLUMNS:
            m, s = mean_spread([r.get(key, math.nan) for r in rows])
            cells.append(_fmt(m, s, nd) if len(rows) > 1 or math.isnan(m) else f"{m:.{nd}f}")  # no spread of 1 seed
            summary[a][key] = [m, s]
        reg = regime_counts([r.get("eval/pass@1", math.nan) for r in rows], start)
        cells.append(f"{reg['collapsed']}/{reg['n']} / {reg['took_off']}/{reg['n']}" if reg["n"] and a != BASELINE else "–")
        summary[a]["regimes"] = reg
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), summary


def _band(curves: list[list[tuple[float, float]]], grid: list[float]) -> tuple[list[float], list[float], list[float]]:
    """Interpolate each seed's ``(x, y)`` curve onto ``grid``; return mean, min and max per grid point."""
    import numpy as np

    ys = []
    for c in curves:
        if len(c) < 1:
            continue
        xs, vs = zip(*c)
        ys.append(np.interp(grid, xs, vs, left=np.nan, right=np.nan))
    if not ys:
        return [], [], []
    arr = np.array(ys)
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return list(np.nanmean(arr, 0)), list(np.nanmin(arr, 0)), list(np.nanmax(arr, 0))


def plot_curves(out: Path, arms: Sequence[str], seeds: Sequence[int], *, metrics: Sequence[tuple[str, str]],
                path: Path, title: str, window: int = 5) -> Path | None:
    """One PNG: a panel per ``(metric, x-axis)``; per arm the mean over seeds (line) and min–max (band).

    Curves are smoothed per seed with a ``window``-point trailing moving average, then put on a
    common grid of 60 x-values up to the smallest final x among seeds (so every point averages all
    seeds). Returns the PNG path, or None when no run has curves yet.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = {a: [read_curve(out / a / f"seed{s}") for s in seeds] for a in arms}
    data = {a: [c for c in cs if c] for a, cs in data.items()}
    if not any(data.values()):
        return None
    xlabels = {"step": "optimizer step", "rollouts": "rollouts (completions generated)", "wall_s": "wall time (s)",
               "tokens": "generated tokens"}
    n = len(metrics)
    cols = min(3, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.4 * rows), squeeze=False)
    for ax, (metric, xkey) in zip(axes.flat, metrics):
        for i, a in enumerate(arms):
            curves = []
            for c in data[a]:
                pts = [(float(r[xkey]), float(r[metric])) for r in c if metric in r]
                if pts:
                    ys = smooth([p[1] for p in pts], window)
                    curves.append([(p[0], y) for p, y in zip(pts, ys)])
            if not curves:
                continue
            lo, hi = max(c[0][0] for c in curves), min(c[-1][0] for c in curves)
            if hi <= lo:
                hi = max(c[-1][0] for c in curves)
            grid = [lo + (hi - lo) * j / 59 for j in range(60)] if hi > lo else [lo]
            m, mn, mx = _band(curves, grid)
            color = f"C{i % 10}"
            ax.plot(grid, m, color=color, lw=1.8, label=f"{a} (n={len(curves)})")
            if len(curves) > 1:
                ax.fill_between(grid, mn, mx, color=color, alpha=0.15)
        ax.set_xlabel(xlabels.get(xkey, xkey))
        ax.set_title(metric, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(out: str | Path, *, arms: Sequence[str], seeds: Sequence[int], budget: Budget | None = None,
                 title: str | None = None) -> Path:
    """Write ``report.md``, ``summary.json``, ``reward_curves.png`` and ``diagnostics.png`` into ``out``.

    Returns:
        the path of ``report.md``.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table, summary = summary_table(out, arms, seeds)
    missing = [f"{a}/seed{s}" for a in arms for s in seeds if not (out / a / f"seed{s}" / "result.json").exists()]
    rc = plot_curves(out, arms, seeds, metrics=[("reward/mean", "step"), ("reward/mean", "rollouts"),
                                                ("reward/mean", "wall_s")],
                     path=out / "reward_curves.png", title="training reward (mean over seeds, band = min–max)")
    dg = plot_curves(out, arms, seeds, metrics=[("actor/entropy", "step"), ("actor/grad_norm", "step"),
                                                ("reward/frac_zero_std_groups", "step")],
                     path=out / "diagnostics.png", title="diagnostics (mean over seeds, band = min–max)")
    b = f"{budget.amount} {budget.kind}" if budget else "see compare.yaml"
    lines = [
        f"# {title or 'rlvr compare: ' + out.name}",
        "",
        f"Budget per run: **{b}** (equal for every arm). Seeds: {', '.join(map(str, seeds))}. "
        "Cells are mean ± sample std over seeds (a single seed's value alone).",
        "",
        table,
        "",
        *[line for note in precision_notes(summary) for line in (note, "")],
        "- *final reward*: mean training reward over the last rounds (≤ 5); *best*: max of its moving average.",
        "- *held-out pass@k*: unbiased estimator on the task's eval split after training"
        + ("; the row *initial* is the untrained policy, evaluated the same way." if BASELINE in arms else "."),
        "- *precision*: the precision each arm's runs resolved (`model.dtype`, docs/precision.md).",
        "- *entropy*: mean per-token policy entropy over the last steps; *grad norm*: mean pre-clip norm.",
        "- *zero-std groups*: fraction of groups whose rewards were all equal (no GRPO signal).",
        "- *collapsed / took off*: seeds whose held-out pass@1 ended below 0.05 or more than 0.10 below the "
        "untrained row / more than 0.25 above it (`rlvr.compare.stats_rules.Regimes`).",
        "",
    ]
    if rc:
        lines += [f"![reward curves]({rc.name})", ""]
    if dg:
        lines += [f"![diagnostics]({dg.name})", ""]
    failed = [m for m in missing if (out / m / "error.txt").exists()]
    if failed:
        lines += [f"Failed (see error.txt in the run folder): {', '.join(failed)}.", ""]
    missing = [m for m in missing if m not in failed]
    if missing:
        lines += [f"Not finished yet: {', '.join(missing)}.", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    (out / "summary.json").write_text(json.dumps({"budget": b, "seeds": list(seeds), "arms": summary}, indent=2))
    return path

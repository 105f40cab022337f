"""Tables of the streaming-vs-synchronous study (issue 39 item 3) from the committed per-run files.

    python docs/results/streaming/summarise.py            # prints the Markdown tables, writes summary.json

Reads ``streaming_tost/<arm>/seed<k>/{result.json,curve.jsonl}`` (24 paired seeds, ``--jobs 2``) and
``streaming_wall/...`` (seeds 0–5, ``--jobs 1``): held-out pass@1 at each curve point (mean and 95 % t-interval
over seeds), each arm's share of one-update-stale rows (``staleness/mean`` per update: with ``max_staleness: 1``
it is the fraction of rows sampled one version back), and seconds per update with the paired ratio to ``sync``
(geometric mean of the per-seed ratios, 95 % t-interval on their logs). The verdicts are in ``claims.md``
(``python -m rlvr.compare.claims``).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from scipy import stats

HERE = Path(__file__).parent
ARMS = ("sync", "streaming", "partial")


def _runs(study: str, arm: str) -> dict[int, tuple[dict, list[dict]]]:
    out = {}
    for res in sorted((HERE / study / arm).glob("seed*/result.json")):
        curve = [json.loads(line) for line in (res.parent / "curve.jsonl").read_text().splitlines() if line.strip()]
        out[int(res.parent.name[4:])] = (json.loads(res.read_text()), curve)
    return out


def _ci(xs: list[float]) -> tuple[float, float, float]:
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, math.nan, math.nan
    h = stats.t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - h, m + h


def main(out: Path | None = HERE / "summary.json") -> dict:
    """Print the tables; write the summary to ``out`` (None: do not write); return it."""
    summary: dict = {}
    studies = {study: {a: _runs(study, a) for a in ARMS} for study in ("streaming_tost", "streaming_wall")}
    runs = studies["streaming_tost"]
    print("| arm | held-out pass@1 at update 8 | 16 | 24 | 32 (final) | one-update-stale rows | s / update (`--jobs 2`) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for arm in ARMS:
        pts: dict[int, list[float]] = {}
        stale, spu = [], []
        for res, curve in runs[arm].values():
            for row in curve:
                if "eval/pass@1" in row:
                    pts.setdefault(row["step"], []).append(row["eval/pass@1"])
            steps = [r for r in curve if "staleness/mean" in r]
            stale.append(statistics.fmean(r["staleness/mean"] for r in steps))
            spu.append(res["wall_s"] / res["steps"])
        cells = [f"{m:.3f} [{lo:.3f}, {hi:.3f}]" for m, lo, hi in (_ci(pts[s]) for s in sorted(pts))]
        summary[arm] = {"n": len(runs[arm]), "pass@1_by_step": {s: _ci(pts[s]) for s in sorted(pts)},
                        "stale_frac": _ci(stale), "s_per_update_jobs2": _ci(spu)}
        print(f"| `{arm}` | " + " | ".join(cells) + f" | {statistics.fmean(stale):.2f} | {statistics.fmean(spu):.3f} |")
    for study, rs in studies.items():
        if not rs["sync"]:
            continue
        print(f"\n{study}: seconds per update (wall_s / updates), paired ratio to sync over seeds")
        print("| arm | seeds | s / update | × sync (geometric mean [95 %]) |")
        print("|---|---:|---:|---:|")
        for arm in ARMS:
            seeds = sorted(set(rs[arm]) & set(rs["sync"]))
            if not seeds:
                continue
            spu = [rs[arm][s][0]["wall_s"] / rs[arm][s][0]["steps"] for s in seeds]
            logs = [math.log(rs[arm][s][0]["wall_s"] / rs["sync"][s][0]["wall_s"]) for s in seeds]
            m, lo, hi = _ci(logs)
            summary.setdefault("ratio", {}).setdefault(study, {})[arm] = {
                "seeds": len(seeds), "s_per_update": statistics.fmean(spu),
                "ratio": [math.exp(m), math.exp(lo) if len(seeds) > 1 else None, math.exp(hi) if len(seeds) > 1 else None]}
            iv = f" [{math.exp(lo):.2f}, {math.exp(hi):.2f}]" if len(seeds) > 1 else ""
            print(f"| `{arm}` | {len(seeds)} | {statistics.fmean(spu):.3f} | {math.exp(m):.2f}{iv} |")
    if out is not None:
        Path(out).write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return summary


if __name__ == "__main__":
    main()

"""Learning curves and ratio statistics of the fp32 / bf16 comparison (``docs/results/precision_compare.yaml``).

Reads ``<compare dir>/<arm>/seed<k>/metrics.jsonl`` and writes:

* ``docs/precision_curves.png``: training reward (5-step moving average) against optimizer steps, mean over
  seeds with a min–max band, one line per arm;
* ``benchmarks/results/precision_compare.json`` and a Markdown table on stdout: per arm, over seeds (mean ±
  sample std): final reward (mean of the last 10 % of steps), held-out pass@1 (``result.json``), and over
  every update of every seed: ``actor/ratio`` min / max (PPO ratio against the trainer's old log-probs),
  ``actor/rollout_logp_diff`` (mean |log π_train − log π_rollout|), ``actor/rollout_is_ratio`` mean / min /
  max and ``actor/rollout_is_changed`` (tokens a TIS cap changed), wall time per run.

Run: ``python benchmarks/plot_precision.py runs/compare/precision``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _ms(xs: list[float]) -> str:
    if not xs:
        return "–"
    if len(xs) == 1:
        return f"{xs[0]:.3g}"
    return f"{statistics.mean(xs):.3g} ± {statistics.stdev(xs):.2g}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cmp_dir = Path(argv[0] if argv else "runs/compare/precision")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    arms = sorted(p.name for p in cmp_dir.iterdir() if p.is_dir() and any(p.glob("seed*/metrics.jsonl")))
    summary: dict = {"compare_dir": str(cmp_dir), "arms": {}}
    fig, ax = plt.subplots(figsize=(7, 4))
    for arm in arms:
        curves, finals, evals, walls = [], [], [], []
        agg = {k: [] for k in ("actor/ratio/min", "actor/ratio/max", "actor/rollout_logp_diff",
                               "actor/rollout_logp_diff/max", "actor/rollout_is_ratio", "actor/rollout_is_ratio/min",
                               "actor/rollout_is_ratio/max", "actor/rollout_is_changed")}
        for seed_dir in sorted((cmp_dir / arm).glob("seed*")):
            mpath = seed_dir / "metrics.jsonl"
            if not mpath.exists():
                continue
            rows = _rows(mpath)
            r = [row["reward/mean"] for row in rows if "reward/mean" in row]
            if not r:
                continue
            curves.append(np.convolve(r, np.ones(5) / 5, mode="valid"))
            finals.append(float(np.mean(r[-max(1, len(r) // 10):])))
            for row in rows:
                for k in agg:
                    if k in row and row[k] == row[k]:
                        agg[k].append(float(row[k]))
            res = seed_dir / "result.json"
            if res.exists():
                rj = json.loads(res.read_text())
                walls.append(float(rj.get("wall_s", 0.0)))
                if "eval/pass@1" in rj:
                    evals.append(float(rj["eval/pass@1"]))
        if not curves:
            continue
        n = min(len(c) for c in curves)
        c = np.stack([x[:n] for x in curves])
        steps = np.arange(1, n + 1) + 2  # centre of the 5-step window
        line, = ax.plot(steps, c.mean(0), label=f"{arm} ({len(curves)} seeds)")
        ax.fill_between(steps, c.min(0), c.max(0), alpha=0.15, color=line.get_color())
        s = {
            "seeds": len(curves), "final_reward": finals, "eval_pass@1": evals, "wall_s": walls,
            "ratio_min": min(agg["actor/ratio/min"], default=None), "ratio_max": max(agg["actor/ratio/max"], default=None),
            "rollout_logp_diff_mean": statistics.mean(agg["actor/rollout_logp_diff"]) if agg["actor/rollout_logp_diff"] else None,
            "rollout_logp_diff_max": max(agg["actor/rollout_logp_diff/max"], default=None),
            "rollout_is_ratio_mean": statistics.mean(agg["actor/rollout_is_ratio"]) if agg["actor/rollout_is_ratio"] else None,
            "rollout_is_ratio_min": min(agg["actor/rollout_is_ratio/min"], default=None),
            "rollout_is_ratio_max": max(agg["actor/rollout_is_ratio/max"], default=None),
            "rollout_is_changed_mean": statistics.mean(agg["actor/rollout_is_changed"]) if agg["actor/rollout_is_changed"] else None,
        }
        summary["arms"][arm] = s
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training reward (5-step mean)")
    ax.set_title("testbed GRPO: fp32 vs bf16 (mean over seeds, min-max band)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = ROOT / "docs" / "precision_curves.png"
    fig.savefig(png, dpi=120)
    out = ROOT / "benchmarks" / "results" / "precision_compare.json"
    out.write_text(json.dumps(summary, indent=2) + "\n")

    def f(x, fmt="{:.3g}"):
        return "–" if x is None else fmt.format(x)

    print("| arm | seeds | final reward | eval pass@1 | PPO ratio [min, max] | mean \\|Δ log p\\| (max) | "
          "π_train/π_rollout mean [min, max] | TIS-changed tokens | wall s/run |")
    print("|---|---:|---|---|---|---|---|---|---|")
    for arm, s in summary["arms"].items():
        print(f"| {arm} | {s['seeds']} | {_ms(s['final_reward'])} | {_ms(s['eval_pass@1'])} | "
              f"[{f(s['ratio_min'])}, {f(s['ratio_max'])}] | {f(s['rollout_logp_diff_mean'], '{:.2e}')} "
              f"({f(s['rollout_logp_diff_max'], '{:.2g}')}) | {f(s['rollout_is_ratio_mean'], '{:.4f}')} "
              f"[{f(s['rollout_is_ratio_min'])}, {f(s['rollout_is_ratio_max'])}] | "
              f"{f(s['rollout_is_changed_mean'], '{:.2%}')} | {_ms(s['wall_s'])} |")
    print(f"wrote {png} and {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

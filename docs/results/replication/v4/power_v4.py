"""Power computation of the v4 registration (issue 38; preregistration_v4.md §Power), from the v3 per-run files.

    PYTHONPATH=src python docs/results/replication/v4/power_v4.py   # writes power_v4.json and prints the table

For every v4 primary / co-primary with a v3 analogue: the sd of the v3 per-seed paired differences (8 seeds, at
the tuned and at the common lr 1e-4; the larger is used), then the number of evaluation seeds n for which the
one-sided paired t-test has MDE (80 % power) <= 0.06, at alpha = 0.05 and at the Holm worst case alpha / m
(m = 9 v4 testbed primaries). For the μ-GRPO equivalence claim: the n at which TOST (margin 0.05, 90 % interval) shows
equivalence with 80 % power when the true difference is 0. CPU cost: mean wall_s of the v3 runs of the arms
involved plus the held-out evaluation (200 x 8 samples, ~25 s measured per run on this machine, an estimate).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from rlvr.compare.claim_values import seed_values
from rlvr.compare.stats_rules import min_detectable_effect, paired_t_power

ROOT = Path(__file__).resolve().parents[4]
PRE = ROOT / "docs/results/replication/prereg"
M = 9  # v4 testbed primaries (preregistration_v4.md §Holm)
EVAL_S = 25.0
ROWS = [  # (id, paper folder, arm, ref, metric, kind)
    ("FBOS-RL vs GRPO", "prereg_fbos_rl", "fbos_rl", "grpo", "hard/pass@1", "higher"),
    ("FBOS-RL vs GRPO(spg=2)", "prereg_fbos_rl", "fbos_rl", "grpo_spg2", "hard/pass@1", "higher"),
    ("FBOS-RL vs GRPO(spg=2), held-out", "prereg_fbos_rl", "fbos_rl", "grpo_spg2", "eval/pass@1", "higher"),
    ("μ-GRPO μ=32 veto vs GRPO μ=4", "prereg_mu_grpo", "veto_1e-4", "grpo_mu4", "eval/pass@1", "match"),
    ("UEC-RL vs GRPO (equal updates)", "prereg_uec_rl", "uec_rl", "grpo", "eval/level7/pass@8", "higher"),
    ("UEC-RL vs GRPO 2x prompts (rollout-matched)", "prereg_uec_rl", "uec_rl", "grpo_2x", "eval/level7/pass@8", "higher"),
    ("IB-TPO vs GRPO (equal tokens)", "prereg_ib_tpo", "ib_tpo", "grpo", "eval/pass@1", "higher"),
    ("IB-TPO vs GRPO, default model", "prereg_default_ib_tpo", "ib_tpo", "grpo", "eval/pass@1", "higher"),
]


def _sd(folder: str, arm: str, ref: str, metric: str) -> tuple[float, int]:
    a, r = seed_values(PRE / folder, arm, metric), seed_values(PRE / folder, ref, metric)
    d = [a[s] - r[s] for s in sorted(set(a) & set(r))]
    return statistics.stdev(d), len(d)


def _wall(folder: str, arms: tuple[str, ...]) -> float:
    ws = [json.loads(p.read_text())["wall_s"] for a in arms for p in (PRE / folder / a).glob("seed*/result.json")]
    return statistics.fmean(ws) if ws else math.nan


def n_for_mde(sd: float, alpha: float, target: float = 0.06, cap: int = 200) -> int:
    """Smallest n (>= 2) whose one-sided paired-t MDE at 80 % power is <= target (cap + 1 when none)."""
    for n in range(2, cap + 1):
        if min_detectable_effect(sd, n, alpha=alpha) <= target:
            return n
    return cap + 1


def n_for_tost(sd: float, margin: float, alpha: float, cap: int = 200) -> int:
    """Smallest n with TOST power >= 0.8 at a true difference 0 (lower bound 2 * one-sided power - 1)."""
    for n in range(2, cap + 1):
        if 2 * paired_t_power(margin, sd, n, alpha=alpha) - 1 >= 0.8:
            return n
    return cap + 1


def main() -> list[dict]:
    out = []
    for name, folder, arm, ref, metric, kind in ROWS:
        sds = {}
        for tag, suffix in (("tuned", "_tuned"), ("common", "")):
            if (PRE / (folder + suffix)).is_dir():
                sds[tag] = _sd(folder + suffix, arm, ref, metric)
        sd = max(v[0] for v in sds.values())
        n1 = n_for_tost(sd, 0.05, 0.05) if kind == "match" else n_for_mde(sd, 0.05)
        nh = n_for_tost(sd, 0.05, 0.05 / M) if kind == "match" else n_for_mde(sd, 0.05 / M)
        n_by = {k: (n_for_tost(v[0], 0.05, 0.05) if kind == "match" else n_for_mde(v[0], 0.05)) for k, v in sds.items()}
        src = folder + ("_tuned" if "tuned" in sds else "")
        per_pair = _wall(src, (arm, ref)) * 2 + 2 * EVAL_S
        out.append({"claim": name, "metric": metric, "sd": {k: round(v[0], 4) for k, v in sds.items()},
                    "n_pairs_v3": {k: v[1] for k, v in sds.items()}, "sd_used": round(sd, 4),
                    "mde_at_24_by_lr": {k: round(min_detectable_effect(v[0], 24), 4) for k, v in sds.items()},
                    "mde_at_8": round(min_detectable_effect(sd, 8), 4), "mde_at_24": round(min_detectable_effect(sd, 24), 4),
                    "n_alpha_0.05": n1, "n_alpha_0.05_by_lr": n_by, f"n_holm_alpha_0.05/{M}": nh,
                    "cpu_s_per_seed_pair": round(per_pair, 1)})
    (Path(__file__).parent / "power_v4.json").write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    return out


if __name__ == "__main__":
    print(f"| claim | metric | sd of d (tuned / common) | MDE at 24 seeds (tuned / common) | n for MDE ≤ 0.06 at α 0.05 "
          f"(tuned / common) | n, larger sd, α 0.05 / Holm α/{M} | CPU s per seed pair |")
    print("|---|---|---|---|---|---|---|")
    for r in main():
        sd = " / ".join(f"{v:.3f}" for v in r["sd"].values())
        print(f"| {r['claim']} | `{r['metric']}` | {sd} | {' / '.join(f'{v:.3f}' for v in r['mde_at_24_by_lr'].values())} | "
              f"{' / '.join(str(v) for v in r['n_alpha_0.05_by_lr'].values())} | "
              f"{r['n_alpha_0.05']} / {r[f'n_holm_alpha_0.05/{M}']} | {r['cpu_s_per_seed_pair']:.0f} |")

"""Pick each arm's learning rate from a sweep and write the replication specs of that series.

    python docs/results/replication/pick_lr.py   # reads runs/compare/v2_lr_sweep, writes v2_main.yaml, v2_tokens.yaml
    python docs/results/replication/pick_lr.py --series v2l --common testbed_v2l --rollouts 2048 --seed 100
        # reads runs/compare/v2l_lr_sweep, writes v2l_main.yaml, v2l_tokens.yaml (testbed:v2l policy)

Rule: per arm family (the sweep arm name before ``_``), the rate with the highest held-out pass@1 on
the tuning seed (100); a tie goes to the smaller rate. The token budget of v2_tokens.yaml is GRPO's
generated tokens at its chosen rate (so GRPO gets ≈ the 1024 rollouts of the main comparison).
"""

import argparse
import json
from pathlib import Path

import yaml

HERE = Path(__file__).parent
ARMS = {  # family -> (main arm name, recipe + geometry overrides)
    "grpo": ("grpo", "grpo"),
    "mu16": ("mu_grpo", "mu_grpo_small generation_batch_size=512"),
    "uec": ("uec_rl", "uec_rl"),
    "uecrel": ("uec_rl_release", "uec_rl_release uec.pending_capacity=64"),
    "ib": ("ib_tpo", "ib_tpo steps_per_generation=1"),
    "fbos": ("fbos_rl", "fbos_rl"),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--series", default="v2")
    ap.add_argument("--common", default="testbed_v2")
    ap.add_argument("--rollouts", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=100, help="the sweep's tuning seed")
    a = ap.parse_args()
    series, common, rollouts = a.series, a.common, a.rollouts
    sweep = Path(f"runs/compare/{series}_lr_sweep")
    table, best = [], {}
    for d in sorted(sweep.glob(f"*_*/seed{a.seed}/result.json")):
        fam, lr = d.parent.parent.name.split("_", 1)
        r = json.loads(d.read_text())
        table.append((fam, float(lr), r["eval/pass@1"], r["eval/pass@8"], r["steps"], r["rollouts"], r["tokens"]))
    for fam in ARMS:
        rows = sorted((t for t in table if t[0] == fam), key=lambda t: (-t[2], t[1]))
        if not rows:
            raise SystemExit(f"sweep incomplete: no finished run for {fam}")
        best[fam] = rows[0]
    lines = [f"# sweep (seed {a.seed}, {rollouts} rollouts): family, lr, pass@1, pass@8, steps, rollouts, tokens"]
    lines += [f"#   {f:7s} {lr:.0e}  {p1:.3f}  {p8:.3f}  {s:3d}  {ro:5d}  {tk:6d}" + ("  <- chosen" if best[f] == t else "")
              for t in sorted(table) for f, lr, p1, p8, s, ro, tk in [t]]
    lr = {f: best[f][1] for f in ARMS}
    arms = [f"{ARMS[f][0]}={ARMS[f][1]} learning_rate={lr[f]:g}" for f in ARMS]
    arms.insert(2, f"mu_grpo_mu4=mu_grpo_small generation_batch_size=128 steps_per_generation=4 learning_rate={lr['mu16']:g}")
    n = rollouts // 32
    head = [f"# Testbed replication ({series}, recipe {common}), main comparison (docs/results/replication.md; issue 17 §3). "
            "Written by pick_lr.py.",
            f"#   flock /tmp/rlvr-heavy.lock rlvr compare --spec docs/results/replication/{series}_main.yaml --jobs 2",
            f"# Equal budget: {rollouts} rollouts per run (GRPO: {n} rounds = {n} updates; mu_grpo: {n // 16} stages x 16 "
            "updates,",
            f"# mu_grpo_mu4: {n // 4} stages x 4 updates, all updates of 32 rows). Learning rates from {series}_lr_sweep.yaml.",
            *lines]
    main_spec = {"output_dir": f"runs/compare/{series}_main", "seeds": [0, 1, 2, 3, 4], "budget": {"rollouts": rollouts},
                 "common_configs": [common], "common": ["logging.progress=false"],
                 "eval": {"num_samples": 8, "ks": [1, 8], "limit": 100, "baseline": True, "curve_points": 4},
                 "arms": arms}
    (HERE / f"{series}_main.yaml").write_text("\n".join(head) + "\n" + yaml.safe_dump(main_spec, sort_keys=False, width=200))
    tokens = int(best["grpo"][6])
    tok_spec = {"output_dir": f"runs/compare/{series}_tokens", "seeds": [0, 1, 2, 3, 4], "budget": {"tokens": tokens},
                "common_configs": [common], "common": ["logging.progress=false"],
                "eval": {"num_samples": 8, "ks": [1, 8], "limit": 100, "curve_points": 4},
                "arms": [arms[0], [a for a in arms if a.startswith("ib_tpo=")][0]]}
    (HERE / f"{series}_tokens.yaml").write_text(
        f"# Testbed replication ({series}), IB-TPO at equal generated tokens (written by pick_lr.py): the budget is GRPO's\n"
        f"# tokens in its {rollouts}-rollout sweep run; IB-TPO is charged each decoded token once (shared prefixes too).\n"
        f"#   flock /tmp/rlvr-heavy.lock rlvr compare --spec docs/results/replication/{series}_tokens.yaml --jobs 2\n"
        + yaml.safe_dump(tok_spec, sort_keys=False, width=200))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

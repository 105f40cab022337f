"""Pick each arm's learning rate from the v2 sweep and write the v2 replication specs.

    python docs/results/replication/pick_lr.py   # reads runs/compare/v2_lr_sweep, writes v2_main.yaml, v2_tokens.yaml

Rule: per arm family (the sweep arm name before ``_``), the rate with the highest held-out pass@1 on
the tuning seed (100); a tie goes to the smaller rate. The token budget of v2_tokens.yaml is GRPO's
generated tokens at its chosen rate (so GRPO gets ≈ the 1024 rollouts of the main comparison).
"""

import json
from pathlib import Path

import yaml

HERE = Path(__file__).parent
SWEEP = Path("runs/compare/v2_lr_sweep")
ARMS = {  # family -> (main arm name, recipe + geometry overrides)
    "grpo": ("grpo", "grpo"),
    "mu16": ("mu_grpo", "mu_grpo_small generation_batch_size=512"),
    "uec": ("uec_rl", "uec_rl"),
    "uecrel": ("uec_rl_release", "uec_rl_release uec.pending_capacity=64"),
    "ib": ("ib_tpo", "ib_tpo steps_per_generation=1"),
    "fbos": ("fbos_rl", "fbos_rl"),
}


def main() -> None:
    table, best = [], {}
    for d in sorted(SWEEP.glob("*_*/seed100/result.json")):
        fam, lr = d.parent.parent.name.split("_", 1)
        r = json.loads(d.read_text())
        table.append((fam, float(lr), r["eval/pass@1"], r["eval/pass@8"], r["steps"], r["rollouts"], r["tokens"]))
    for fam in ARMS:
        rows = sorted((t for t in table if t[0] == fam), key=lambda t: (-t[2], t[1]))
        if not rows:
            raise SystemExit(f"sweep incomplete: no finished run for {fam}")
        best[fam] = rows[0]
    lines = ["# sweep (seed 100, 1024 rollouts): family, lr, pass@1, pass@8, steps, rollouts, tokens"]
    lines += [f"#   {f:7s} {lr:.0e}  {p1:.3f}  {p8:.3f}  {s:3d}  {ro:5d}  {tk:6d}" + ("  <- chosen" if best[f] == t else "")
              for t in sorted(table) for f, lr, p1, p8, s, ro, tk in [t]]
    lr = {f: best[f][1] for f in ARMS}
    arms = [f"{ARMS[f][0]}={ARMS[f][1]} learning_rate={lr[f]:g}" for f in ARMS]
    arms.insert(2, f"mu_grpo_mu4=mu_grpo_small generation_batch_size=128 steps_per_generation=4 learning_rate={lr['mu16']:g}")
    head = ["# Testbed-v2 replication, main comparison (docs/results/replication.md; issue 17 §3). Written by pick_lr.py.",
            "#   flock /tmp/rlvr-heavy.lock rlvr compare --spec docs/results/replication/v2_main.yaml --jobs 2",
            "# Equal budget: 1024 rollouts per run (GRPO: 32 rounds = 32 updates; mu_grpo: 2 stages x 16 updates,",
            "# mu_grpo_mu4: 8 stages x 4 updates, both 32 updates of 32 rows). Learning rates from v2_lr_sweep.yaml.",
            *lines]
    main_spec = {"output_dir": "runs/compare/v2_main", "seeds": [0, 1, 2, 3, 4], "budget": {"rollouts": 1024},
                 "common_configs": ["testbed_v2"], "common": ["logging.progress=false"],
                 "eval": {"num_samples": 8, "ks": [1, 8], "limit": 100, "baseline": True, "curve_points": 4},
                 "arms": arms}
    (HERE / "v2_main.yaml").write_text("\n".join(head) + "\n" + yaml.safe_dump(main_spec, sort_keys=False, width=200))
    tokens = int(best["grpo"][6])
    tok_spec = {"output_dir": "runs/compare/v2_tokens", "seeds": [0, 1, 2, 3, 4], "budget": {"tokens": tokens},
                "common_configs": ["testbed_v2"], "common": ["logging.progress=false"],
                "eval": {"num_samples": 8, "ks": [1, 8], "limit": 100, "curve_points": 4},
                "arms": [arms[0], [a for a in arms if a.startswith("ib_tpo=")][0]]}
    (HERE / "v2_tokens.yaml").write_text(
        "# Testbed-v2 replication, IB-TPO at equal generated tokens (written by pick_lr.py): the budget is GRPO's\n"
        "# tokens in its 1024-rollout sweep run; IB-TPO is charged each decoded token once (shared prefixes too).\n"
        "#   flock /tmp/rlvr-heavy.lock rlvr compare --spec docs/results/replication/v2_tokens.yaml --jobs 2\n"
        + yaml.safe_dump(tok_spec, sort_keys=False, width=200))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

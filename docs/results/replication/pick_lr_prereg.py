"""Learning-rate tuning of the pre-registered study (issue 29 item 3; preregistration.md §Learning rate).

    python docs/results/replication/pick_lr_prereg.py tuning   # writes prereg_<paper>_lr.yaml from prereg_<paper>.yaml
    python docs/results/replication/pick_lr_prereg.py pick     # reads runs/compare/prereg_<paper>_lr, writes prereg_<paper>_tuned.yaml
    python docs/results/replication/pick_lr_prereg.py pick --paper uec_rl   # one paper only (the others' tunings need not exist)

``tuning``: every arm of the paper's main spec at each rate of :data:`GRID`, on the tuning seeds
:data:`TUNING_SEEDS` (disjoint from the evaluation seeds 0-7), same budget and evaluation; arm names
``<arm>_lr<rate>``. ``pick``: per arm, the largest rate with no collapsed tuning seed
(:func:`rlvr.compare.stats_rules.largest_stable_rate` on held-out pass@1, collapse = below 0.05 or more
than 0.10 below the pre-trained policy), written into a copy of the main spec as ``learning_rate=<rate>``
(after the common lr 1e-4, so it wins), output folder ``..._tuned``; the chosen rates and every tuning
value go into the file's header.
"""

import argparse
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).parent
PAPERS = ("fbos_rl", "mu_grpo", "uec_rl", "ib_tpo")
GRID = ("3e-5", "1e-4", "3e-4", "1e-3")
TUNING_SEEDS = [100, 101, 102]


def tuning_spec(main: dict) -> dict:
    """The tuning comparison of a main spec: each arm at each rate of GRID, on TUNING_SEEDS."""
    arms = [f"{a.split('=', 1)[0]}_lr{lr}={a.split('=', 1)[1]} learning_rate={lr}" for a in main["arms"] for lr in GRID]
    return {**main, "output_dir": main["output_dir"] + "_lr", "seeds": TUNING_SEEDS, "arms": arms,
            "eval": {**main["eval"], "curve_points": 0}}


def write_tuning(papers: tuple[str, ...] = PAPERS) -> None:
    """Write ``prereg_<paper>_lr.yaml`` for each of ``papers`` (see :func:`tuning_spec`)."""
    for p in papers:
        main = yaml.safe_load((HERE / f"prereg_{p}.yaml").read_text())
        head = (f"# PRE-REGISTERED lr tuning of prereg_{p}.yaml (written by pick_lr_prereg.py tuning; do not edit).\n"
                f"#   flock /tmp/rlvr-heavy.lock python -m rlvr compare --spec docs/results/replication/prereg_{p}_lr.yaml"
                " --jobs 2\n")
        (HERE / f"prereg_{p}_lr.yaml").write_text(head + yaml.safe_dump(tuning_spec(main), sort_keys=False,
                                                                          allow_unicode=True, width=200))


def write_tuned(papers: tuple[str, ...] = PAPERS) -> None:
    """Write ``prereg_<paper>_tuned.yaml`` for each of ``papers``; exits if a tuning run is missing."""
    from rlvr.compare.claim_values import seed_values
    from rlvr.compare.stats_rules import largest_stable_rate

    for p in papers:
        main = yaml.safe_load((HERE / f"prereg_{p}.yaml").read_text())
        runs = Path(main["output_dir"] + "_lr")
        start = list(seed_values(runs, "initial", "eval/pass@1").values())
        start = sum(start) / len(start) if start else None
        arms, notes = [], []
        for a in main["arms"]:
            name = a.split("=", 1)[0]
            finals = {float(lr): list(seed_values(runs, f"{name}_lr{lr}", "eval/pass@1").values()) for lr in GRID}
            if any(len(v) != len(TUNING_SEEDS) for v in finals.values()):
                sys.exit(f"{runs}: arm {name} has unfinished tuning runs: { {k: len(v) for k, v in finals.items()} }")
            lr, stable = largest_stable_rate(finals, start)
            arms.append(f"{a} learning_rate={lr:g}")
            notes.append(f"#   {name}: {lr:g}{'' if stable else ' (every rate collapsed somewhere: smallest taken)'}; "
                         + ", ".join(f"{k:g}: {[round(x, 3) for x in v]}" for k, v in finals.items()))
        out = {**main, "output_dir": main["output_dir"] + "_tuned", "arms": arms}
        head = f"# prereg_{p}.yaml at the tuned rates (pick_lr_prereg.py pick; start {start}):\n" + "\n".join(notes) + "\n"
        (HERE / f"prereg_{p}_tuned.yaml").write_text(head + yaml.safe_dump(out, sort_keys=False, allow_unicode=True,
                                                                            width=200))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["tuning", "pick"])
    ap.add_argument("--paper", choices=PAPERS, default=None, help="only this paper (default: all four)")
    args = ap.parse_args()
    chosen = (args.paper,) if args.paper else PAPERS
    write_tuning(chosen) if args.what == "tuning" else write_tuned(chosen)

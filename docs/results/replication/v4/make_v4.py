"""The v4 study's compare specs (issue 38; docs/results/preregistration_v4.md), written from one table so the
grid, the seeds and the arms cannot drift apart between files.

    python docs/results/replication/v4/make_v4.py write   # (re)writes v4_<study>.yaml and v4_<study>_tune.yaml here
    python docs/results/replication/v4/make_v4.py pick --study fbos_rl   # reads the tuning runs (committed copy
                                                                          # v4/v4_fbos_rl_tune/), prints best rates
    python docs/results/replication/v4/make_v4.py claims  # (re)writes v4_rates_claims.yaml and v4_claims.yaml
                                                          # from the committed per-run files under v4/

Every arm runs at every rate of :data:`GRID` (arm names ``<arm>_lr<rate>``), on the evaluation seeds
:data:`EVAL_SEEDS` (``v4_<study>.yaml``) and on the tuning seeds :data:`TUNING_SEEDS` (``v4_<study>_tune.yaml``,
disjoint). An arm's best rate is the one with the highest **mean held-out pass@1 over the tuning seeds**
(:func:`best_rate`; ties to the smaller rate), not a collapse rule. ``default_ib_tpo_steps`` runs at the one rate
2e-5 (a stated deviation: one default-model run costs ~9 minutes on this machine), so it has no tuning spec.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Mapping, Sequence

import yaml

HERE = Path(__file__).parent
GRID = ("3e-5", "1e-4", "3e-4")
EVAL_SEEDS = list(range(24))
TUNING_SEEDS = [100, 101, 102, 103]
TESTBED = {"common_configs": ["testbed_v2l"],
           "eval": {"num_samples": 8, "ks": [1, 8], "limit": 200, "baseline": True, "curve_points": 4}}
TB_COMMON = ["logging.progress=false", "task.eval_size=200"]
STUDIES: dict[str, dict] = {
    # FBOS-RL at equal rollouts with its two update-count controls (issue 38 item 2)
    "fbos_rl": {"budget": {"rollouts": 1024}, "arms": [
        "grpo=grpo",
        "grpo_spg2=grpo steps_per_generation=2",   # FBOS-RL's update count (64 updates of 16 rows)
        "grpo_it2=grpo num_iterations=2",          # two plain updates per round in place of the feedback update
        "fbos_rl=fbos_rl"]},
    # μ-GRPO at equal updates (128 = 4 stages x μ 32). The wall-clock claim (max_async_level) needs engine=vllm,
    # so it is not in this CPU spec (preregistration_v4.md §Wall clock)
    "mu_grpo": {"budget": {"steps": 128}, "arms": [
        "grpo_mu4=grpo generation_batch_size=128 steps_per_generation=4",
        "veto_1e-4=mu_grpo_small generation_batch_size=1024 steps_per_generation=32 mu_grpo.veto_ratio_threshold=1e-4"]},
    # UEC-RL at equal updates (32) against GRPO with its rollouts (≈ 14 prompts per update: 3 510 / 32 / 8)
    "uec_rl": {"budget": {"steps": 32}, "arms": [
        "grpo=grpo",
        "grpo_14p=grpo generation_batch_size=112",
        "uec_rl=uec_rl num_generations=5 generation_batch_size=40"]},
    # UEC-RL at equal rollouts (1024)
    "uec_rl_rollouts": {"budget": {"rollouts": 1024}, "arms": [
        "grpo=grpo",
        "uec_rl=uec_rl num_generations=5 generation_batch_size=40"]},
    # IB-TPO at equal generated tokens and at equal updates (the update-matched control)
    "ib_tpo": {"budget": {"tokens": 14298}, "arms": ["grpo=grpo", "ib_tpo=ib_tpo steps_per_generation=1"]},
    "ib_tpo_steps": {"budget": {"steps": 32}, "arms": ["grpo=grpo", "ib_tpo=ib_tpo steps_per_generation=1"]},
    # the default model at equal updates (16: the middle of GRPO's 6-16 and IB-TPO's 12-28 at equal tokens)
    "default_ib_tpo_steps": {"budget": {"steps": 16}, "grid": ("2e-5",), "base_configs": ["demo"],
                             "common": ["logging.progress=false", "max_completion_length=64", "task.eval_size=200"],
                             "eval": {"num_samples": 8, "ks": [1, 8], "limit": 200, "baseline": True},
                             "arms": ["grpo=grpo generation_batch_size=32",
                                      "ib_tpo=ib_tpo ib_tpo.step_split=fixed ib_tpo.fixed_step_tokens=16 "
                                      "ib_tpo.step_min_tokens=8 ib_tpo.min_remaining_tokens=16"]},
}
"""``study: {budget, arms [, grid, base_configs, common, eval]}``; testbed studies take :data:`TESTBED`."""


def spec(study: str, *, tuning: bool = False) -> dict:
    """The compare spec (a dict, as the YAML holds it) of ``study`` on the evaluation or the tuning seeds."""
    s = STUDIES[study]
    grid = s.get("grid", GRID)
    arms = [f"{a.split('=', 1)[0]}_lr{lr}={a.split('=', 1)[1]} learning_rate={lr}" for a in s["arms"] for lr in grid]
    out = {"output_dir": f"runs/compare/v4_{study}" + ("_tune" if tuning else ""),
           "seeds": TUNING_SEEDS if tuning else EVAL_SEEDS, "budget": s["budget"]}
    if "base_configs" in s:
        out.update(base_configs=s["base_configs"], common=s["common"], eval=s["eval"])
    else:
        out.update(common_configs=TESTBED["common_configs"], common=TB_COMMON, eval=TESTBED["eval"])
    if tuning:
        out["eval"] = {**out["eval"], "curve_points": 0}
    out["arms"] = arms
    return out


def best_rate(means: Mapping[str, Sequence[float]]) -> str:
    """The rate (a key of ``means``: ``{rate: [held-out pass@1 of each tuning seed]}``) with the highest mean;
    ties go to the smaller rate.

    Raises:
        ValueError: no rates, or a rate with no value.
    """
    if not means:
        raise ValueError("best_rate: no rates")
    for lr, v in means.items():
        if not v:
            raise ValueError(f"best_rate: rate {lr} has no finished tuning seed")
    return max(sorted(means, key=float), key=lambda lr: (statistics.fmean(means[lr]), -float(lr)))


def write() -> None:
    """Write ``v4_<study>.yaml`` and ``v4_<study>_tune.yaml`` for every study of :data:`STUDIES`."""
    for study in STUDIES:
        for tuning in (False, True) if len(STUDIES[study].get("grid", GRID)) > 1 else (False,):
            name = f"v4_{study}" + ("_tune" if tuning else "")
            head = (f"# PRE-REGISTERED v4 (issue 38; docs/results/preregistration_v4.md). Written by v4/make_v4.py; do not edit.\n"
                    f"#   flock /tmp/rlvr-heavy.lock python -m rlvr compare --spec docs/results/replication/{name}.yaml "
                    f"--jobs 1 [--seeds ...]\n")
            (HERE.parent / f"{name}.yaml").write_text(head + yaml.safe_dump(spec(study, tuning=tuning), sort_keys=False,
                                                                            width=1000))

# The registered primaries (preregistration_v4.md §Primaries; testbed Holm family m = 9) and secondaries:
# (number, paper, claim text, study, arm, reference, metric, direction)
PRIMARIES = [
    ("1", "FBOS-RL", "FBOS-RL > GRPO, hard levels 7–8 pass@1 (equal rollouts)", "fbos_rl", "fbos_rl", "grpo",
     "hard/pass@1", "higher"),
    ("2", "FBOS-RL", "FBOS-RL > GRPO with FBOS-RL's update count (steps_per_generation=2), hard pass@1", "fbos_rl",
     "fbos_rl", "grpo_spg2", "hard/pass@1", "higher"),
    ("3", "FBOS-RL", "FBOS-RL > GRPO with two plain updates per round (num_iterations=2), hard pass@1", "fbos_rl",
     "fbos_rl", "grpo_it2", "hard/pass@1", "higher"),
    ("4", "μ-GRPO", "μ = 32 relaxed window + veto δ 1e-4 matches GRPO μ = 4 (± 0.05), held-out pass@1 (equal updates)",
     "mu_grpo", "veto_1e-4", "grpo_mu4", "eval/pass@1", "match"),
    ("5", "UEC-RL", "UEC-RL > GRPO, level-7 pass@8 (equal updates)", "uec_rl", "uec_rl", "grpo", "eval/level7/pass@8",
     "higher"),
    ("6", "UEC-RL", "UEC-RL > GRPO with UEC-RL's rollouts (14 prompts per update), level-7 pass@8", "uec_rl", "uec_rl",
     "grpo_14p", "eval/level7/pass@8", "higher"),
    ("7", "UEC-RL", "UEC-RL > GRPO at equal rollouts (1024), level-7 pass@8", "uec_rl_rollouts", "uec_rl", "grpo",
     "eval/level7/pass@8", "higher"),
    ("8", "IB-TPO", "IB-TPO > GRPO, held-out pass@1 (equal generated tokens)", "ib_tpo", "ib_tpo", "grpo",
     "eval/pass@1", "higher"),
    ("9", "IB-TPO", "IB-TPO > GRPO at equal updates (32), held-out pass@1", "ib_tpo_steps", "ib_tpo", "grpo",
     "eval/pass@1", "higher"),
]
SECONDARIES = [
    ("FBOS-RL", "FBOS-RL > GRPO, held-out pass@1", "fbos_rl", "fbos_rl", "grpo", "eval/pass@1", "higher"),
    ("FBOS-RL", "FBOS-RL > GRPO(spg=2), held-out pass@1", "fbos_rl", "fbos_rl", "grpo_spg2", "eval/pass@1", "higher"),
    ("FBOS-RL", "FBOS-RL > GRPO(it=2), held-out pass@1", "fbos_rl", "fbos_rl", "grpo_it2", "eval/pass@1", "higher"),
    ("GRPO", "GRPO(spg=2) > GRPO, hard pass@1 (the update count alone)", "fbos_rl", "grpo_spg2", "grpo", "hard/pass@1",
     "higher"),
    ("GRPO", "GRPO(it=2) > GRPO, hard pass@1 (the update count alone)", "fbos_rl", "grpo_it2", "grpo", "hard/pass@1",
     "higher"),
]
EFFECT = 0.05
RUNS = "docs/results/replication/v4"
"""The committed per-run files (``<study>[_tune]/<arm>_lr<rate>/seed<k>/{result.json,curve.jsonl}``)."""


def committed_seeds(study: str, arm: str, *, tuning: bool = False) -> list[int]:
    """The seeds with a committed ``result.json`` for ``arm`` (``<name>_lr<rate>``) of ``study``."""
    folder = HERE / (f"v4_{study}" + ("_tune" if tuning else "")) / arm
    return sorted(int(d.name[4:]) for d in folder.glob("seed*") if (d / "result.json").exists())


def _claim(paper: str, text: str, study: str, arm: str, ref: str, metric: str, direction: str, *,
           primary: bool, family: str = "") -> dict:
    """One claims-file entry; its ``seeds`` are those both arms finished (the registered 0–23, plus the seed
    rule's extension where both arms of the cell have it), so a half-finished cell is never unpaired."""
    both = sorted(set(committed_seeds(study, arm)) & set(committed_seeds(study, ref)))
    out = {"paper": paper, "claim": text, "compare": f"{RUNS}/v4_{study}", "arm": arm, "ref": ref, "metric": metric,
           "direction": direction}
    out.update({"margin": EFFECT} if direction == "match" else {"effect": EFFECT})
    if primary:
        out["primary"] = True
    if family:
        out["family"] = family
    if len(both) >= 2:
        out["seeds"] = both
    else:
        out["untestable"] = "not run yet (fewer than 2 paired seeds committed)"
    return out


def tuning_means(study: str, name: str) -> dict[str, list[float]]:
    """``{rate: [held-out pass@1 of each committed tuning seed]}`` of arm ``name`` of ``study``."""
    sys.path.insert(0, str(HERE.parents[3] / "src"))
    from rlvr.compare.claim_values import seed_values

    folder = HERE / f"v4_{study}_tune"
    return {lr: list(seed_values(folder, f"{name}_lr{lr}", "eval/pass@1").values())
            for lr in STUDIES[study].get("grid", GRID)}


def best_rates(study: str) -> dict[str, str] | None:
    """Each arm's best rate (:func:`best_rate`) of ``study``, or None until every arm has all 4 tuning seeds at
    every rate committed."""
    out = {}
    for a in STUDIES[study]["arms"]:
        name = a.split("=", 1)[0]
        means = tuning_means(study, name)
        if any(len(v) < len(TUNING_SEEDS) for v in means.values()):
            return None
        out[name] = best_rate(means)
    return out


def claims(write_files: bool = True) -> dict[str, str]:
    """``{file name: text}`` of ``v4_rates_claims.yaml`` (reading (a): every primary at each shared rate, Holm over the 3 rates of a
    claim; the secondaries unadjusted) and ``v4_claims.yaml`` (reading (b), the primary one: each arm at its best
    rate, Holm over the testbed primaries whose study has finished tuning), written beside the specs unless
    ``write_files`` is false."""
    head = ("# Written by v4/make_v4.py claims from the committed per-run files; do not edit. The v4 rule and design:\n"
            "# docs/results/preregistration_v4.md. Regenerate the tables: PYTHONPATH=src python -m rlvr.compare.results_page\n")
    rates = []
    for num, paper, text, study, arm, ref, metric, direction in PRIMARIES:
        for lr in GRID:
            rates.append(_claim(paper, f"#{num} {text} (shared lr {lr})", study, f"{arm}_lr{lr}", f"{ref}_lr{lr}",
                                metric, direction, primary=True, family=f"#{num}"))
    for paper, text, study, arm, ref, metric, direction in SECONDARIES:
        for lr in GRID:
            rates.append(_claim(paper, f"{text} (shared lr {lr})", study, f"{arm}_lr{lr}", f"{ref}_lr{lr}", metric,
                                direction, primary=False))
    doc = {"rule": "v4", "title": "v4 reading (a): every primary at each shared learning rate (Holm over the 3 rates "
                                  "of a claim; secondaries unadjusted), testbed v2l", "claims": rates, "figures": []}
    texts = {"v4_rates_claims.yaml": head + yaml.safe_dump(doc, sort_keys=False, width=1000, default_flow_style=None,
                                                           allow_unicode=True)}
    best = []
    for num, paper, text, study, arm, ref, metric, direction in PRIMARIES:
        picked = best_rates(study)
        if picked is None:
            best.append({"paper": paper, "claim": f"#{num} {text} (each arm at its best rate)",
                         "compare": f"{RUNS}/v4_{study}", "arm": f"{arm}_lr?", "ref": f"{ref}_lr?", "metric": metric,
                         "direction": direction, **({"margin": EFFECT} if direction == "match" else {"effect": EFFECT}),
                         "primary": True, "untestable": "tuning runs not finished: no best rate yet"})
            continue
        a, r = picked[arm], picked[ref]
        best.append(_claim(paper, f"#{num} {text} (best rates: {arm} {a}, {ref} {r})", study, f"{arm}_lr{a}",
                           f"{ref}_lr{r}", metric, direction, primary=True))
    doc = {"rule": "v4", "title": "v4 reading (b), the primary one: each arm at its best rate (mean held-out pass@1 "
                                  "over tuning seeds 100–103), Holm over the testbed primaries (m = 9 once all have "
                                  "run), testbed v2l", "claims": best, "figures": []}
    texts["v4_claims.yaml"] = head + yaml.safe_dump(doc, sort_keys=False, width=1000, default_flow_style=None,
                                                    allow_unicode=True)
    if write_files:
        for name, text in texts.items():
            (HERE.parent / name).write_text(text)
    return texts


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", choices=["write", "pick", "claims"])
    ap.add_argument("--study", choices=sorted(STUDIES))
    args = ap.parse_args(argv)
    if args.cmd == "write":
        write()
        return
    if args.cmd == "claims":
        claims()
        return
    if args.study is None:
        ap.error("pick needs --study")
    for a in STUDIES[args.study]["arms"]:
        name = a.split("=", 1)[0]
        means = tuning_means(args.study, name)
        if any(not v for v in means.values()):
            print(f"{name}: not all rates have tuning runs committed ({ {k: len(v) for k, v in means.items()} })")
            continue
        print(f"{name}: best rate {best_rate(means)} ({ {k: round(statistics.fmean(v), 3) for k, v in means.items()} })")

if __name__ == "__main__":
    main()

"""The v4 registration's specs (docs/results/replication/v4_*.yaml; docs/results/preregistration_v4.md) are what
v4/make_v4.py writes, build a validated run config for every arm without a model, and keep the registered design:
every arm at every rate of the grid, >= 24 evaluation seeds, >= 4 disjoint tuning seeds, each budget axis, and
controls that switch what their names say. The best-rate rule is checked on hand-made tuning values."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from rlvr.compare.spec import CompareSpec

HERE = Path(__file__).resolve().parents[2] / "docs" / "results" / "replication"


def _make():
    spec = importlib.util.spec_from_file_location("make_v4", HERE / "v4" / "make_v4.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MAKE = _make()
AXIS = {"fbos_rl": "rollouts", "mu_grpo": "steps", "uec_rl": "steps", "uec_rl_rollouts": "rollouts",
        "ib_tpo": "tokens", "ib_tpo_steps": "steps", "default_ib_tpo_steps": "steps"}


def _algo(cfg):  # what makes a run GRPO or a variant: its schedule, its sampler and its advantage estimator
    return cfg.schedule, cfg.sampler, cfg.adv_estimator


def test_every_study_has_its_budget_axis():
    assert set(MAKE.STUDIES) == set(AXIS)


@pytest.mark.parametrize("study", sorted(AXIS))
def test_v4_spec_is_the_generated_one_and_keeps_the_design(study, tmp_path):
    raw = yaml.safe_load((HERE / f"v4_{study}.yaml").read_text())
    assert raw == MAKE.spec(study), "regenerate: python docs/results/replication/v4/make_v4.py write"
    spec = CompareSpec.from_dict(raw)
    assert spec.budget.kind == AXIS[study] and len(spec.seeds) >= 24
    assert spec.eval_limit >= 200 and spec.eval_num_samples >= 8 and spec.eval_baseline
    grid = MAKE.STUDIES[study].get("grid", MAKE.GRID)
    assert len(spec.arms) == len(MAKE.STUDIES[study]["arms"]) * len(grid)
    if study != "default_ib_tpo_steps":
        assert {"3e-5", "1e-4", "3e-4"} <= set(grid)
        tune = yaml.safe_load((HERE / f"v4_{study}_tune.yaml").read_text())
        assert tune == MAKE.spec(study, tuning=True)
        assert len(tune["seeds"]) >= 4 and not set(tune["seeds"]) & set(spec.seeds)
        assert [a for a in tune["arms"]] == raw["arms"]
    lr_arms = [a for a in spec.arms if a.name.endswith("_lr1e-4") or len(grid) == 1]
    cfgs = {a.name.rsplit("_lr", 1)[0]: spec.run_config(a, spec.seeds[0], tmp_path / a.name) for a in lr_arms}
    for a in spec.arms[::3]:  # the rate each arm name promises
        assert spec.run_config(a, 0, tmp_path / a.name).learning_rate == pytest.approx(float(a.name.rsplit("_lr", 1)[1]))
    if study == "fbos_rl":
        assert cfgs["grpo_spg2"].steps_per_generation == 2 and cfgs["grpo"].steps_per_generation == 1
        assert cfgs["grpo_it2"].num_iterations == 2 and cfgs["grpo_it2"].steps_per_generation == 1
        assert _algo(cfgs["grpo_it2"]) == _algo(cfgs["grpo"]) != _algo(cfgs["fbos_rl"])
    if study == "mu_grpo":
        assert cfgs["veto_1e-4"].mu_grpo.veto_ratio_threshold == 1e-4 and "veto" in cfgs["veto_1e-4"].loss_masks
        assert cfgs["grpo_mu4"].steps_per_generation == 4 and cfgs["veto_1e-4"].steps_per_generation == 32
    if study == "uec_rl":
        assert cfgs["grpo_14p"].generation_batch_size == 14 * cfgs["grpo_14p"].num_generations
    if study in ("ib_tpo", "ib_tpo_steps", "default_ib_tpo_steps"):
        assert _algo(cfgs["grpo"]) != _algo(cfgs["ib_tpo"])


def test_best_rate_is_the_highest_tuning_mean_not_a_collapse_rule():
    # 3e-4 has one collapsed seed (0.0) but the highest mean (0.55 vs 0.45): the v4 rule picks it
    assert MAKE.best_rate({"3e-5": [0.40, 0.41, 0.42, 0.43], "1e-4": [0.44, 0.45, 0.46, 0.45],
                           "3e-4": [0.0, 0.73, 0.74, 0.73]}) == "3e-4"
    assert MAKE.best_rate({"1e-4": [0.5, 0.5], "3e-4": [0.6, 0.4]}) == "1e-4"  # a tie goes to the smaller rate
    with pytest.raises(ValueError, match="3e-4 has no finished"):
        MAKE.best_rate({"1e-4": [0.5], "3e-4": []})


def test_v4_claims_files_are_the_generated_ones():
    """The claims files the results page reads are what ``make_v4.py claims`` writes from the committed per-run
    files: every primary at every rate of the grid in its own Holm family of 3, paired on the seeds both arms have (a cell still running is read on what has finished, and says so)."""
    for name, text in MAKE.claims(write_files=False).items():
        assert (HERE / name).read_text() == text, "regenerate: python docs/results/replication/v4/make_v4.py claims"
    rates = yaml.safe_load((HERE / "v4_rates_claims.yaml").read_text())["claims"]
    prim = [c for c in rates if c.get("primary")]
    assert len(prim) == len(MAKE.PRIMARIES) * len(MAKE.GRID)
    for num, *_ in MAKE.PRIMARIES:
        assert sum(c["family"] == f"#{num}" for c in prim) == len(MAKE.GRID)
    for c in rates:
        if "seeds" in c:
            arm = set(MAKE.committed_seeds(c["compare"].rsplit("/v4_", 1)[1], c["arm"]))
            assert set(c["seeds"]) <= arm and len(c["seeds"]) >= 2

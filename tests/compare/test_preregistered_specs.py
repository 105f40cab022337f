"""The pre-registered study's specs (docs/results/replication/prereg_*.yaml) load, build a validated run
config for every arm without a model, and keep the design preregistration.md promises: >= 8 paired
evaluation seeds disjoint from the tuning seeds, >= 200 held-out problems x 8 samples, each paper's
budget axis, and arms that switch what their names say. The claims file names only arms the specs run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from rlvr.compare.claims import ClaimsFile
from rlvr.compare.spec import CompareSpec

HERE = Path(__file__).resolve().parents[2] / "docs" / "results" / "replication"
AXIS = {"fbos_rl": "rollouts", "mu_grpo": "steps", "uec_rl": "steps", "ib_tpo": "tokens"}


def _pick():
    spec = importlib.util.spec_from_file_location("pick_lr_prereg", HERE / "pick_lr_prereg.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _load(name: str) -> tuple[dict, CompareSpec]:
    raw = yaml.safe_load((HERE / name).read_text())
    return raw, CompareSpec.from_dict(raw)


@pytest.mark.parametrize("paper", sorted(AXIS))
def test_main_spec_builds_every_arm_and_keeps_the_design(paper, tmp_path):
    raw, spec = _load(f"prereg_{paper}.yaml")
    assert spec.budget.kind == AXIS[paper]
    assert len(spec.seeds) >= 8 and not set(spec.seeds) & set(_pick().TUNING_SEEDS)
    assert spec.eval_limit >= 200 and spec.eval_num_samples >= 8 and spec.eval_baseline
    cfgs = {a.name: spec.run_config(a, spec.seeds[0], tmp_path / a.name) for a in spec.arms}
    for name, cfg in cfgs.items():
        assert cfg.task.eval_size >= 200 and cfg.learning_rate == pytest.approx(1e-4), name
        assert cfg.model.name_or_path == "testbed:v2l", name
    if paper == "fbos_rl":
        assert cfgs["grpo_spg2"].steps_per_generation == 2 and cfgs["grpo"].steps_per_generation == 1
        assert cfgs["fbos_nopos"].fbos.feedback_level == "none" and cfgs["fbos_noecc"].fbos.ecc_weight == 0
    if paper == "mu_grpo":
        for name in ("naive_mu32", "relaxed_noveto", "veto_1e-4", "veto_1e-3", "veto_prefix_1e-4"):
            c = cfgs[name]
            assert c.steps_per_generation == 32 and c.generation_batch_size == 32 * c.per_device_train_batch_size
            assert spec.budget.amount // c.steps_per_generation == 4, "4 stages"
        assert cfgs["naive_mu32"].epsilon == 0.2 and "veto" not in cfgs["naive_mu32"].loss_masks
        assert cfgs["relaxed_noveto"].epsilon == 1.0 and "veto" not in cfgs["relaxed_noveto"].loss_masks
        assert cfgs["veto_1e-3"].mu_grpo.veto_ratio_threshold == 1e-3 and "veto" in cfgs["veto_1e-3"].loss_masks
        assert cfgs["grpo_mu4"].steps_per_generation == 4 and cfgs["grpo_mu4"].epsilon == 0.2
        assert cfgs["veto_prefix_1e-4"].mu_grpo.veto_trigger == "prefix" and "veto" in cfgs["veto_prefix_1e-4"].loss_masks
        assert cfgs["veto_1e-4"].mu_grpo.veto_trigger == "token"
    if paper == "uec_rl":
        assert (cfgs["uec_rl"].num_generations, cfgs["uec_rl"].generation_batch_size) == (5, 40)  # its own G, B
        assert cfgs["uec_rl"].uec.explore_temperature == 1.1 and cfgs["uec_rl_t1"].uec.explore_temperature == 1.0
        assert cfgs["grpo_2x"].generation_batch_size == 2 * cfgs["grpo"].generation_batch_size
    if paper == "ib_tpo":
        assert cfgs["ib_random"].ib_tpo.branch_score == "random" and cfgs["ib_tpo"].ib_tpo.branch_score == "ib"
        assert cfgs["ib_value_only"].ib_tpo.ib_local == "value_only"
        assert cfgs["ib_noroot"].ib_tpo.allow_root_branch is False


@pytest.mark.parametrize("paper", sorted(AXIS))
def test_tuning_spec_is_the_grid_of_the_main_spec(paper, tmp_path):
    pick = _pick()
    main, _ = _load(f"prereg_{paper}.yaml")
    raw, spec = _load(f"prereg_{paper}_lr.yaml")
    assert raw == pick.tuning_spec(main), "regenerate: python docs/results/replication/pick_lr_prereg.py tuning"
    assert spec.seeds == pick.TUNING_SEEDS and len(spec.arms) == len(main["arms"]) * len(pick.GRID)
    for a in spec.arms[:: len(pick.GRID) * 2]:  # a sample of arms (every config path is covered above)
        lr = float(a.name.rsplit("_lr", 1)[1])
        assert spec.run_config(a, spec.seeds[0], tmp_path / a.name).learning_rate == pytest.approx(lr)


def test_default_model_spec_builds_without_loading_the_model(tmp_path):
    _, spec = _load("prereg_default_ib_tpo.yaml")
    assert spec.budget.kind == "tokens" and len(spec.seeds) >= 8
    assert spec.eval_limit >= 200 and spec.eval_num_samples >= 8
    cfgs = [spec.run_config(a, 0, tmp_path / a.name) for a in spec.arms]
    assert [c.sampler for c in cfgs] != [cfgs[0].sampler] * 2 and all(c.task.eval_size >= 200 for c in cfgs)


def test_preregistered_claims_name_arms_the_specs_run():
    cf = ClaimsFile.load(HERE / "prereg_claims.yaml")
    arms = {}
    for paper in AXIS:
        raw, spec = _load(f"prereg_{paper}.yaml")
        # the claims read the committed copies of the compare folders (docs/results/replication/prereg/)
        arms["docs/results/replication/prereg/" + Path(spec.output_dir).name + "_tuned"] = {a.name for a in spec.arms}
    primary = [c for c in cf.claims if c.primary]
    assert sorted(c.paper for c in primary) == ["FBOS-RL", "IB-TPO", "UEC-RL", "μ-GRPO"]  # one per paper
    for c in cf.claims:
        assert c.compare in arms, c.claim
        assert c.arm in arms[c.compare] and (c.direction == "band" or c.ref in arms[c.compare]), c.claim
    for f in cf.figures:
        assert set(f["arms"]) <= arms[f["compare"]], f["paper"]


def test_compare_pre_run_check_knows_the_testbed_model_in_a_fresh_interpreter():
    """``rlvr compare``'s arm check ran before anything imported :mod:`rlvr.testbed`, so every testbed spec
    failed with exit 2 ("testbed:v2l is no existing path, registered model source ()")."""
    import os
    import subprocess
    import sys

    code = ("import sys, yaml; from rlvr.cli.compare import _check_arms; from rlvr.compare.spec import CompareSpec; "
            f"_check_arms(CompareSpec.from_dict(yaml.safe_load(open({str(HERE / 'prereg_fbos_rl.yaml')!r})))); print('ok')")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"), "HF_HUB_OFFLINE": "1"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]


def test_pick_one_paper_needs_only_its_own_tuning(tmp_path, monkeypatch):
    """``pick --paper uec_rl`` writes that paper's tuned spec from planted tuning results (largest rate with
    no collapsed seed per arm) while the other papers' tunings do not exist; without ``--paper`` it stops
    at the first paper with missing runs."""
    pick = _pick()
    for paper in pick.PAPERS:
        spec = yaml.safe_load((HERE / f"prereg_{paper}.yaml").read_text())
        spec["output_dir"] = str(tmp_path / "runs" / f"prereg_{paper}")
        (tmp_path / f"prereg_{paper}.yaml").write_text(yaml.safe_dump(spec))
    main = yaml.safe_load((tmp_path / "prereg_uec_rl.yaml").read_text())
    runs = Path(main["output_dir"] + "_lr")
    # planted finals: every arm collapses at 1e-3 on one seed; grpo also at 3e-4, so grpo -> 1e-4, others -> 3e-4
    for arm in [a.split("=", 1)[0] for a in main["arms"]] + ["initial"]:
        for lr in pick.GRID if arm != "initial" else [None]:
            for seed in pick.TUNING_SEEDS:
                bad = lr == "1e-3" and seed == 101 or (arm == "grpo" and lr == "3e-4" and seed == 102)
                d = runs / (arm if lr is None else f"{arm}_lr{lr}") / f"seed{seed}"
                d.mkdir(parents=True)
                (d / "result.json").write_text(json.dumps({"eval/pass@1": 0.0 if bad else (0.33 if lr is None else 0.5)}))
    monkeypatch.setattr(pick, "HERE", tmp_path)
    pick.write_tuned(("uec_rl",))
    tuned = yaml.safe_load((tmp_path / "prereg_uec_rl_tuned.yaml").read_text())
    rates = {a.split("=", 1)[0]: a.rsplit("learning_rate=", 1)[1] for a in tuned["arms"]}
    assert rates == {"grpo": "0.0001", "grpo_2x": "0.0003", "uec_rl": "0.0003", "uec_rl_t1": "0.0003"}
    assert tuned["output_dir"] == main["output_dir"] + "_tuned"
    with pytest.raises(SystemExit, match="prereg_fbos_rl_lr: arm grpo has unfinished tuning runs"):
        pick.write_tuned()  # all four papers: fbos_rl has no tuning runs
    assert not (tmp_path / "prereg_fbos_rl_tuned.yaml").exists()

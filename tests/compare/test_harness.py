"""rlvr compare: two arms × two seeds on the tiny model, equal budgets, resume, report, CLI parsing."""

from __future__ import annotations

import json
import time

import pytest

from rlvr.testing import ToyTask
from rlvr.compare.harness import run_compare
from rlvr.compare.spec import Arm, CompareSpec
from rlvr.compare.budget import Budget, BudgetExhausted, BudgetMeter
from rlvr.compare.curves import curve_summary
from rlvr.compare.report import mean_spread
from rlvr.errors import ConfigError

COMMON = [
    "num_generations=4", "generation_batch_size=8", "per_device_train_batch_size=8", "max_completion_length=5",
    "max_prompt_length=64", "learning_rate=1e-3", "logging.progress=false", "logging.tensorboard=false",
    "logging.log_completions_steps=0", "dynamic_sampling.max_num_gen_batches=2", "reward_timeout_s=0",
]


def _factories(tiny):
    factory, tok = tiny
    return (lambda cfg: (factory(0), tok)), (lambda cfg: ToyTask())


def _spec(tmp_path, budget, arms=("grpo", "drgrpo=dr_grpo"), seeds=(0, 1)):
    return CompareSpec(arms=[Arm.parse(a) for a in arms], seeds=list(seeds), budget=Budget.parse(budget),
                       output_dir=str(tmp_path / "cmp"), common=list(COMMON), eval_num_samples=2, eval_ks=[1, 2],
                       eval_limit=4)


def test_two_arms_two_seeds_table_plots_and_resume(tmp_path, tiny):
    mf, tf = _factories(tiny)
    t0 = time.perf_counter()
    spec = _spec(tmp_path, "rollouts=16")
    results = run_compare(spec, model_factory=mf, task_factory=tf, log=lambda m: None)
    assert time.perf_counter() - t0 < 120
    assert [(r["arm"], r["seed"]) for r in results] == [("grpo", 0), ("grpo", 1), ("drgrpo", 0), ("drgrpo", 1)]
    for r in results:
        assert r["rollouts"] == 16 and r["steps"] == 2  # 2 rounds of 8; equal budget for both arms
        assert 0.0 <= r["eval/pass@1"] <= r["eval/pass@2"] <= 1.0
    out = tmp_path / "cmp"
    report = (out / "report.md").read_text()
    assert "| grpo | 2 |" in report and "| drgrpo | 2 |" in report and "±" in report
    assert "held-out pass@2" in report
    for png in ("reward_curves.png", "diagnostics.png"):
        assert (out / png).stat().st_size > 1000
    summary = json.loads((out / "summary.json").read_text())
    m, s = summary["arms"]["grpo"]["steps"]
    assert (m, s) == (2.0, 0.0)
    # the two seeds of one arm differ (different rollouts)
    c0 = (out / "grpo/seed0/curve.jsonl").read_text()
    c1 = (out / "grpo/seed1/curve.jsonl").read_text()
    assert c0 != c1

    # resume: finished runs are skipped; a removed result is re-run, the others are untouched
    (out / "drgrpo/seed1/result.json").unlink()
    before = (out / "grpo/seed0/result.json").stat().st_mtime_ns
    logs = []
    run_compare(spec, model_factory=mf, task_factory=tf, log=logs.append)
    assert sum("skipped" in m for m in logs) == 3
    assert any(m.startswith("compare: drgrpo seed 1:") and "skipped" not in m for m in logs)
    assert (out / "grpo/seed0/result.json").stat().st_mtime_ns == before
    assert (out / "drgrpo/seed1/result.json").exists()

    # the untrained policy added later as a baseline row: no finished run is redone
    spec.eval_baseline = True
    logs = []
    run_compare(spec, model_factory=mf, task_factory=tf, log=logs.append)
    assert sum("skipped" in m for m in logs) == 4
    base = json.loads((out / "initial/seed0/result.json").read_text())
    assert base["steps"] == 0 and 0.0 <= base["eval/pass@1"] <= base["eval/pass@2"] <= 1.0
    report = (out / "report.md").read_text()
    assert "| initial | 2 |" in report and "untrained policy" in report
    with pytest.raises(ConfigError, match="reserved"):
        CompareSpec(arms=[Arm.parse("initial=grpo")], seeds=[0], budget=Budget.parse("steps=1"), eval_baseline=True)


@pytest.mark.parametrize("budget,check", [
    ("steps=3", lambda r: r["steps"] == 3),
    # DAPO's dynamic sampling may spend two draws on one step: both count, so steps may differ
    ("rollouts=20", lambda r: 12 < r["rollouts"] <= 20 and r["rollouts"] % 8 == 0 and r["stop"].startswith("budget")),
    ("tokens=60", lambda r: 0 < r["tokens"] <= 60 and r["stop"].startswith("budget")),
])
def test_budget_is_enforced_for_every_arm(tmp_path, tiny, budget, check):
    mf, tf = _factories(tiny)
    spec = _spec(tmp_path, budget, arms=("grpo", "dapo overlong_buffer_len=4"), seeds=(0,))
    results = run_compare(spec, model_factory=mf, task_factory=tf, log=lambda m: None, report=False)
    for r in results:
        assert check(r), r


def test_meter_refuses_a_draw_that_would_exceed_the_budget():
    class Fake:
        calls = 0

        def sample(self, problems, g, params, **kw):
            import torch

            from rlvr.types import RolloutBatch

            Fake.calls += 1
            n = len(problems) * g
            z = torch.zeros(n, dtype=torch.long)
            return RolloutBatch([[1]] * n, torch.zeros(n, 3, dtype=torch.long), torch.ones(n, 3), z, z,
                                z.bool(), z.float(), z.float(), z)

    meter = BudgetMeter(Fake(), Budget("rollouts", 10))
    meter.sample([0, 1], 4, None)
    assert (meter.rollouts, meter.tokens) == (8, 24)
    with pytest.raises(BudgetExhausted):
        meter.sample([0], 4, None)
    assert Fake.calls == 1  # refused before generating
    tok = BudgetMeter(Fake(), Budget("tokens", 30))
    tok.sample([0], 4, None)
    tok.sample([0], 4, None)  # 12 tokens per draw: 24 ≤ 30
    with pytest.raises(BudgetExhausted):
        tok.sample([0], 4, None)  # 36 > 30: generated, then discarded
    assert tok.tokens == 24


def test_parsing_and_validation(tmp_path):
    a = Arm.parse("hi=dapo+grpo epsilon_high=0.3 beta=0.01")
    assert (a.name, a.configs, a.overrides) == ("hi", ["dapo", "grpo"], ["epsilon_high=0.3", "beta=0.01"])
    assert Arm.parse("grpo").configs == ["grpo"]
    assert Budget.parse("tokens=1e4") == Budget("tokens", 10000)
    for bad in ("steps", "walltime=3", "steps=0"):
        with pytest.raises(ConfigError):
            Budget.parse(bad)
    with pytest.raises(ConfigError, match="distinct"):
        CompareSpec(arms=[Arm.parse("grpo"), Arm.parse("grpo")], seeds=[0], budget=Budget("steps", 1))
    spec = CompareSpec.from_dict({"arms": ["grpo", {"name": "x", "config": "dapo", "overrides": ["beta=0.1"]}],
                                  "seeds": [0, 1], "budget": {"steps": 5}, "common": COMMON})
    assert CompareSpec.from_dict(spec.to_dict()).to_dict() == spec.to_dict()
    with pytest.raises(ConfigError, match="arm 'bad'"):
        CompareSpec(arms=[Arm.parse("bad=grpo learning_rte=1")], seeds=[0], budget=Budget("steps", 1),
                    output_dir=str(tmp_path)).run_config(Arm.parse("bad=grpo learning_rte=1"), 0, tmp_path)
    # the spec's own structure: typos and wrong shapes are errors, not silent defaults
    base = {"arms": ["grpo"], "budget": {"steps": 1}}
    for extra, match in (({"eval": {"num_sample": 4}}, "eval must be a mapping"),
                         ({"arms": [{"name": "g", "confg": ["grpo"]}]}, "unknown \\['confg'\\]"),
                         ({"common": "testbed"}, "common must be a list.*common_configs"),
                         ({"seeds": "0,1"}, "seeds must be a list of integers")):
        with pytest.raises(ConfigError, match=match):
            CompareSpec.from_dict({**base, **extra})
    assert CompareSpec.from_dict({**base, "seeds": 3}).seeds == [3]


def test_summary_statistics_by_hand():
    assert mean_spread([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert mean_spread([4.0]) == (4.0, 0.0)
    curve = [{"reward/mean": v, "actor/entropy": 1.0, "actor/grad_norm": 2.0} for v in (0.0, 0.2, 0.4, 0.6, 0.2, 0.2, 0.2, 0.2)]
    s = curve_summary(curve)
    # n = 8 → window w = 2: final = mean(0.2, 0.2); best = max of 2-point moving average = (0.4 + 0.6) / 2
    assert s["reward/final"] == pytest.approx(0.2)
    assert s["reward/best"] == pytest.approx(0.5)
    assert s["entropy/final"] == 1.0 and s["grad_norm/mean"] == 2.0


def test_cli_compare_requires_budget_and_reports(tmp_path, capsys):
    from rlvr.cli import main

    assert main(["compare", "--arm", "grpo", "--out", str(tmp_path / "c")]) == 2
    assert main(["compare", "--spec", str(tmp_path / "missing.yaml")]) == 2
    assert main(["compare", "--arm", "grpo", "--budget", "steps=1", "--seeds", "0,a", "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "missing.yaml: no such file" in err and "expected comma-separated integers" in err
    assert main(["compare", "--arm", "grpo", "--budget", "steps=2", "--out", str(tmp_path / "c"), "--report-only"]) == 0
    assert (tmp_path / "c" / "report.md").exists()


def test_stalled_arm_ends_instead_of_looping(tmp_path, tiny):
    """Every group constant (no trainable group) under a step budget: the stall guard ends the run."""
    factory, tok = tiny

    class Constant(ToyTask):
        def verify(self, problem, completion):
            from rlvr.tasks.base import Verdict

            return Verdict(score=0.0, correct=False)

    spec = _spec(tmp_path, "steps=5", arms=("dapo overlong_buffer_len=2",), seeds=(0,))
    spec.max_idle_draws = 3
    (r,) = run_compare(spec, model_factory=lambda c: (factory(0), tok), task_factory=lambda c: Constant(),
                       log=lambda m: None, report=False)
    assert r["steps"] == 0 and r["stop"].startswith("budget: stalled")


def test_arm_stopped_by_max_idle_rounds_is_recorded_as_stalled(tmp_path, tiny):
    """The trainer's own guard (issue 12 item 3) ends the arm; the comparison records it and goes on."""
    factory, tok = tiny

    class Constant(ToyTask):
        def verify(self, problem, completion):
            from rlvr.tasks.base import Verdict

            return Verdict(score=0.0, correct=False)

    spec = _spec(tmp_path, "steps=5", arms=("dapo overlong_buffer_len=2 max_idle_rounds=2",), seeds=(0,))
    (r,) = run_compare(spec, model_factory=lambda c: (factory(0), tok), task_factory=lambda c: Constant(),
                       log=lambda m: None, report=False)
    assert r["steps"] == 0 and r["stop"].startswith("stalled: no trainable group in 2 generation rounds")


def test_meter_counts_generated_sequences_not_second_views():
    """FBOS-RL's feedback rows repeat the tokens of their original_offpolicy twins: not charged twice."""
    import torch

    from rlvr.types import RolloutBatch

    class Views:
        view_only_kinds = ("feedback",)

        def sample(self, problems, g, params, **kw):
            kinds = ["original"] * 4 + ["original_offpolicy"] * 4 + ["feedback"] * 4
            n = len(kinds)
            z = torch.zeros(n, dtype=torch.long)
            b = RolloutBatch([[1]] * n, torch.zeros(n, 3, dtype=torch.long), torch.ones(n, 3), z, z,
                             z.bool(), z.float(), z.float(), z)
            b.context_kind = kinds
            return b

    meter = BudgetMeter(Views(), Budget("rollouts", 16))
    meter.sample([0], 8, None)
    assert (meter.rollouts, meter.tokens) == (8, 24)
    meter.sample([0], 8, None)  # 16 generated sequences: exactly the budget
    with pytest.raises(BudgetExhausted):
        meter.sample([0], 8, None)


def test_curve_values_fall_back_to_per_phase_metrics():
    from rlvr.compare.curves import curve_values

    m = {"reward/mean": 0.5, "epa/actor/entropy": 1.0, "ecc/actor/entropy": 2.0, "epa/actor/grad_norm": float("nan"),
         "actor/clip_ratio/region": 0.1, "epa/actor/clip_ratio/region": 9.0}
    v = curve_values(m)
    assert v["reward/mean"] == 0.5 and v["actor/entropy"] == 1.5
    assert "actor/grad_norm" not in v  # only non-finite phase values
    assert v["actor/clip_ratio/region"] == 0.1  # the unprefixed key wins


def test_curve_values_take_the_primary_phase_and_keep_the_others():
    """FBOS-RL's alternate mode logs its EPA and ECC steps as separate rows; with the schedule's primary
    phase the bare keys (and so the run summary) come from EPA only, ECC's values stay under ``ecc/``.
    Averaged, the FAP-context entropy inflated the summary entropy and ECC's zero gradient halved the
    grad norm (docs/results/replication.md §1.4)."""
    from rlvr.compare.curves import curve_values

    epa = {"reward/mean": 0.25, "epa/actor/entropy": 0.4, "epa/actor/grad_norm": 1.2}
    ecc = {"ecc/actor/entropy": 1.1, "ecc/actor/grad_norm": 0.0}
    a, b = curve_values(epa, "epa"), curve_values(ecc, "epa")
    assert a == {"reward/mean": 0.25, "actor/entropy": 0.4, "actor/grad_norm": 1.2}
    assert b == {"ecc/actor/entropy": 1.1, "ecc/actor/grad_norm": 0.0}
    s = curve_summary([a, b])
    assert s["entropy/final"] == pytest.approx(0.4) and s["grad_norm/mean"] == pytest.approx(1.2)
    # without a primary phase (schedules that do not name one) the phases are averaged, as before
    assert curve_values({**epa, **ecc})["actor/entropy"] == pytest.approx(0.75)


def test_fbos_arm_summary_uses_the_epa_phase(tmp_path, tiny):
    """End to end: an FBOS-RL arm's curve and summary entropy / grad norm are its EPA steps' values."""
    mf, tf = _factories(tiny)
    arm = "fb=grpo sampler=feedback schedule=fbos adv_estimator=fbos"
    spec = _spec(tmp_path, "steps=4", arms=(arm,), seeds=(0,))
    (r,) = run_compare(spec, model_factory=mf, task_factory=tf, log=lambda m: None, report=False)
    run = tmp_path / "cmp" / "fb" / "seed0"
    logged = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    epa_g = [m["epa/actor/grad_norm"] for m in logged if "epa/actor/grad_norm" in m]
    epa_h = [m["epa/actor/entropy"] for m in logged if "epa/actor/entropy" in m]
    # 4 steps: an EPA step per round, an ECC step only in rounds whose ECC phase has signal (ToyTask's
    # G2 = 2 FAP rollouts often score alike; variants/fbos_rl/schedule.py skips those), so 2 or more EPA steps
    assert len(epa_g) >= 2 and any("ecc/actor/grad_norm" in m for m in logged)
    curve = [json.loads(x) for x in (run / "curve.jsonl").read_text().splitlines()]
    assert [c["actor/entropy"] for c in curve if "actor/entropy" in c] == pytest.approx(epa_h)
    assert any("ecc/actor/entropy" in c for c in curve)
    assert r["grad_norm/mean"] == pytest.approx(sum(epa_g) / len(epa_g))


def test_run_ended_by_its_rollout_budget_is_reported_stopped_not_failed(tmp_path, tiny, capsys):
    """Hitting the rollout budget is how a rollouts= comparison ends every run: the trainer's summary
    must say so (``run stopped (rollout budget ...)``), not ``run failed``."""
    mf, tf = _factories(tiny)
    spec = _spec(tmp_path, "rollouts=8", arms=("grpo",), seeds=(0,))
    (r,) = run_compare(spec, model_factory=mf, task_factory=tf, log=lambda m: None, report=False)
    assert r["rollouts"] == 8 and r["steps"] == 1 and r["stop"].startswith("budget: rollout budget 8 reached")
    err = capsys.readouterr().err
    assert "rlvr: run failed" not in err
    assert "rlvr: run stopped (rollout budget 8 reached (8 used)): 1 step (1 -> 1)" in err


def test_baseline_is_evaluated_once_when_it_cannot_depend_on_the_seed(tmp_path, monkeypatch):
    """Without factories the untrained policy's held-out evaluation is the same for every seed: one
    evaluation, copies for the other seeds (marked ``reused_from_seed``); a factory may read the seed, so
    then every seed is evaluated."""
    import rlvr.compare.harness as harness

    calls: list[int] = []

    def fake_baseline(spec, seed, *, model_factory=None, task_factory=None):
        calls.append(seed)
        result = {"arm": "initial", "seed": seed, "steps": 0, "eval/pass@1": 0.25 + seed}
        path = tmp_path / "cmp" / "initial" / f"seed{seed}" / "result.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result))
        return result

    monkeypatch.setattr(harness, "run_baseline", fake_baseline)
    spec = _spec(tmp_path, "steps=1", arms=("grpo",), seeds=(0, 1, 2))
    out = tmp_path / "cmp"
    harness._run_baselines(spec, out, lambda m: None, None, None)
    assert calls == [0]
    for s in (1, 2):
        r = json.loads((out / f"initial/seed{s}/result.json").read_text())
        assert r["seed"] == s and r["reused_from_seed"] == 0 and r["eval/pass@1"] == 0.25  # seed 0's numbers
    # seed 0 finished earlier, seed 3 added: reused from the file on disk, no new evaluation
    spec.seeds = [0, 1, 2, 3]
    harness._run_baselines(spec, out, lambda m: None, None, None)
    assert calls == [0] and json.loads((out / "initial/seed3/result.json").read_text())["reused_from_seed"] == 0
    # with a model factory every missing seed is evaluated
    spec.seeds = [4, 5]
    harness._run_baselines(spec, out, lambda m: None, lambda cfg: None, None)
    assert calls == [0, 4, 5]
    assert "reused_from_seed" not in json.loads((out / "initial/seed5/result.json").read_text())
    # the key leaves out the run seed and the output folder, and keeps what the evaluation reads
    assert harness._baseline_inputs(spec, 0) == harness._baseline_inputs(spec, 7)
    other = _spec(tmp_path, "steps=1", arms=("grpo",), seeds=(0,))
    other.common = other.common + ["max_completion_length=6"]
    assert harness._baseline_inputs(other, 0) != harness._baseline_inputs(spec, 0)


def test_runs_left_to_do_are_ordered_seed_major_and_skip_finished_ones(tmp_path):
    """The claims pair arms by seed, so the work list goes seed by seed (every arm of seed 0, then seed 1):
    a comparison cut off early leaves whole pairs. Finished runs (``result.json``) are read, not re-run."""
    import rlvr.compare.harness as harness

    spec = _spec(tmp_path, "steps=1", arms=("grpo", "drgrpo=dr_grpo"), seeds=(0, 1, 2))
    out = tmp_path / "cmp"
    done = out / "drgrpo" / "seed1" / "result.json"
    done.parent.mkdir(parents=True)
    done.write_text(json.dumps({"arm": "drgrpo", "seed": 1, "eval/pass@1": 0.5}))
    results, todo = harness._finished_and_todo(spec, out, lambda m: None)
    assert [(a.name, s) for a, s in todo] == [("grpo", 0), ("drgrpo", 0), ("grpo", 1), ("grpo", 2), ("drgrpo", 2)]
    assert results == {("drgrpo", 1): {"arm": "drgrpo", "seed": 1, "eval/pass@1": 0.5}}

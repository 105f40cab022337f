"""rlvr compare --stop-after: a run cut into time-limited pieces (checkpoint + piece.json, resumed by the
next call) ends exactly where the same run done in one go ends (tiny in-process model)."""

from __future__ import annotations

import json

import pytest

from rlvr.compare.harness import run_compare
from rlvr.compare.spec import Arm, CompareSpec
from rlvr.compare.budget import Budget
from rlvr.compare.pieces import Deadline, PieceState
from rlvr.testing import ToyTask

COMMON = [
    "num_generations=4", "generation_batch_size=8", "per_device_train_batch_size=8", "max_completion_length=5",
    "max_prompt_length=64", "learning_rate=1e-3", "logging.progress=false", "logging.tensorboard=false",
    "logging.log_completions_steps=0", "reward_timeout_s=0",
]


def _spec(out, arms):
    return CompareSpec(arms=[Arm.parse(a) for a in arms], seeds=[0], budget=Budget.parse("rollouts=24"),
                       output_dir=str(out), common=list(COMMON), eval_num_samples=2, eval_ks=[1, 2], eval_limit=4)


def _same(a: dict, b: dict) -> None:
    for k in ("steps", "rollouts", "tokens", "eval/pass@1", "eval/pass@2", "reward/final", "grad_norm/mean"):
        assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-9), k


@pytest.mark.parametrize("arm", ["grpo", "mu=grpo steps_per_generation=2 generation_batch_size=16"])
def test_pieces_resume_to_the_same_result_as_one_go(tmp_path, tiny, arm):
    factory, tok = tiny
    mf, tf = (lambda cfg: (factory(0), tok)), (lambda cfg: ToyTask())
    name = arm.split("=")[0].split()[0]
    whole = run_compare(_spec(tmp_path / "whole", [arm]), model_factory=mf, task_factory=tf, log=lambda m: None)
    assert len(whole) == 1 and whole[0]["steps"] >= 2

    out = tmp_path / "cut"
    logs: list[str] = []
    # stop_after_s=0: each call stops at its run's first step boundary (μ > 1: inside a generation batch)
    first = run_compare(_spec(out, [arm]), model_factory=mf, task_factory=tf, log=logs.append, stop_after_s=0)
    assert first == [] and any("time limit reached at step 1" in m for m in logs)
    run_dir = out / name / "seed0"
    state = PieceState.load(run_dir)
    assert state is not None and state.step == 1 and state.pieces == 1 and not (run_dir / "result.json").exists()
    # a later piece killed before its checkpoint (e.g. by a slot's timeout) leaves rows past step 1
    with open(run_dir / "curve.jsonl", "a") as f:
        f.write(json.dumps({"step": 2, "rollouts": 16, "tokens": 0, "wall_s": 1.0}) + "\n")
    run_compare(_spec(out, [arm]), model_factory=mf, task_factory=tf, log=logs.append, stop_after_s=0)
    assert PieceState.load(run_dir).step == 2 and any("resumed at step 1" in m for m in logs)
    done = run_compare(_spec(out, [arm]), model_factory=mf, task_factory=tf, log=logs.append)
    _same(done[0], whole[0])
    # the pieces' state is gone; metrics and curve hold each step once, as in the one-go run
    assert not (run_dir / "piece.json").exists() and not list(run_dir.glob("checkpoint-*"))
    steps = [json.loads(line)["step"] for line in (run_dir / "curve.jsonl").read_text().splitlines()]
    assert steps == list(range(1, whole[0]["steps"] + 1))
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == whole[0]["steps"]


def test_no_new_run_starts_after_the_limit_and_bad_values_are_refused(tmp_path, tiny):
    factory, tok = tiny
    mf, tf = (lambda cfg: (factory(0), tok)), (lambda cfg: ToyTask())
    spec = _spec(tmp_path / "cmp", ["grpo", "drgrpo=dr_grpo"])
    spec.budget = Budget.parse("rollouts=8")  # one step; the budget ends the run at its next draw
    logs: list[str] = []
    assert run_compare(spec, model_factory=mf, task_factory=tf, log=logs.append, stop_after_s=0) == []
    # the resumed grpo run ends on its budget at once; the limit has passed, so drgrpo does not start
    res = run_compare(spec, model_factory=mf, task_factory=tf, log=logs.append, stop_after_s=0)
    assert [(r["arm"], r["steps"], r["rollouts"]) for r in res] == [("grpo", 1, 8)]
    assert any("1 run(s) left" in m for m in logs)
    assert not (tmp_path / "cmp" / "drgrpo").exists()
    with pytest.raises(ValueError, match="stop_after_s"):
        run_compare(spec, jobs=2, stop_after_s=10)
    with pytest.raises(ValueError, match=">= 0"):
        Deadline(-1)


def test_cli_stop_after_is_checked(tmp_path, capsys):
    from rlvr.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["compare", "--arm", "grpo", "--budget", "steps=1", "--out", str(tmp_path / "c"), "--stop-after", "-1"])
    assert exc.value.code == 2 and "expected a number of seconds >= 0" in capsys.readouterr().err
    assert main(["compare", "--arm", "grpo", "--budget", "steps=1", "--out", str(tmp_path / "c"),
                 "--stop-after", "5", "--jobs", "2"]) == 2
    assert "--stop-after needs --jobs 1" in capsys.readouterr().err

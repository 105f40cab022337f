"""Issue 12 item 3: a run in which no group ever has signal stops after ``max_idle_rounds`` rounds
(checkpoint written, exit code 3, a message with the pass rate, the zero-variance share and what to try)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from rlvr.config import build_config
from rlvr.errors import ConfigError, IdleRunError
from rlvr.tasks.base import Verdict
from rlvr.testing import ToyTask, small_config
from rlvr.trainer.checkpoint import latest_checkpoint
from rlvr.trainer.trainer import Trainer


@dataclass
class NeverRight(ToyTask):
    """A task the policy cannot solve: every completion scores 0 (module level: picklable)."""

    def verify(self, problem, completion):
        return Verdict(score=0.0, correct=False, feedback="wrong")


class _DrawGuard:
    """Fails the test (instead of hanging it) if the trainer keeps drawing past ``limit`` rounds."""

    def __init__(self, sampler, limit):
        self.inner, self.limit, self.draws = sampler, limit, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def sample(self, *a, **kw):
        self.draws += 1
        if self.draws > self.limit:
            raise AssertionError(f"still generating after {self.limit} draws: the idle run never ends")
        return self.inner.sample(*a, **kw)


def _train_until_idle(tr, limit=30):
    tr.sampler = _DrawGuard(tr.sampler, limit)
    with pytest.raises(IdleRunError) as info:
        tr.train()
    return str(info.value)


def test_dynamic_sampling_proceed_on_an_unsolvable_task_stops(tmp_path, tiny):
    factory, tok = tiny
    cfg = small_config(tmp_path, "dynamic_sampling.enable=true", "dynamic_sampling.max_num_gen_batches=2",
                       "dynamic_sampling.on_exhausted=proceed", "max_idle_rounds=3", "max_steps=100",
                       "reward_timeout_s=0")
    tr = Trainer(cfg, factory(0), tok, NeverRight())
    with pytest.warns(UserWarning, match="informative group"):
        msg = _train_until_idle(tr)
    assert tr.global_step == 0 and tr.generation_round == 3  # 3 rounds of 2 draws each, then stop
    assert "no trainable group and no optimizer update in 3 generation rounds" in msg
    assert "pass rate 0.0% over 48 verified completions" in msg  # 3 rounds × 2 draws × 8 completions
    assert "100% of 12 groups with zero reward variance" in msg
    assert "dynamic_sampling.max_num_gen_batches" in msg and "max_idle_rounds" in msg
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.name == "checkpoint-0" and str(ckpt) in msg
    assert json.loads((ckpt / "trainer_state.json").read_text())["generation_round"] == 3


def test_uec_rl_on_an_unsolvable_task_stops(tmp_path, tiny):
    factory, tok = tiny
    cfg = build_config(["uec_rl"], [
        "generation_batch_size=10", "per_device_train_batch_size=10", "uec.explore_num_generations=4",
        "max_completion_length=6", "max_prompt_length=64", "max_steps=100", "max_idle_rounds=2",
        "reward_timeout_s=0", f"logging.output_dir={tmp_path}", "logging.progress=false",
        "logging.log_completions_steps=0", "logging.tensorboard=false",
    ])
    tr = Trainer(cfg, factory(0), tok, NeverRight())
    msg = _train_until_idle(tr)
    assert tr.global_step == 0 and tr.generation_round == 2
    assert "pass rate 0.0%" in msg and "uec_retention" in msg
    assert latest_checkpoint(tmp_path) is not None


def test_an_update_resets_the_idle_count(tmp_path, tiny, toy_task):
    # ToyTask gives signal every round: many rounds, never idle, even with max_idle_rounds=1
    factory, tok = tiny
    tr = Trainer(small_config(tmp_path, "max_idle_rounds=1", "max_steps=3", "reward_timeout_s=0"), factory(0),
                 tok, toy_task)
    tr.train()
    assert tr.global_step == 3 and tr.idle.rounds == 0


class _AccumulateThree:
    """A schedule that keeps rows for three rounds before its first update (as UEC-RL's pending buffer)."""

    needs_old_logp = False

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def plan(self, batch, ctx):
        self.calls += 1
        return self.inner.plan(batch, ctx) if self.calls > 3 else []

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def test_rows_kept_for_a_later_update_are_not_idle(tmp_path, tiny, toy_task):
    from rlvr.schedules import OnPolicySchedule

    factory, tok = tiny
    cfg = small_config(tmp_path, "max_idle_rounds=1", "max_steps=1", "reward_timeout_s=0")
    tr = Trainer(cfg, factory(0), tok, toy_task, schedule=_AccumulateThree(OnPolicySchedule()))
    tr.train()
    assert tr.global_step == 1 and tr.generation_round == 4


def test_max_idle_rounds_is_validated_and_ignored_on_resume():
    assert build_config().max_idle_rounds == 10
    with pytest.raises(ConfigError, match="max_idle_rounds"):
        build_config(overrides=["max_idle_rounds=0"])
    from rlvr.trainer.checkpoint import IGNORED_ON_RESUME

    assert "max_idle_rounds" in IGNORED_ON_RESUME  # the message suggests raising it, then --resume


def test_cli_exits_3_with_the_message(tmp_path, tiny, monkeypatch, capsys):
    import rlvr.models
    from rlvr import cli

    factory, tok = tiny
    monkeypatch.setattr(rlvr.models, "load_policy", lambda cfg, **k: (factory(0), tok))  # k: the run's precision
    data = tmp_path / "d.jsonl"  # answers a random tiny model never produces
    data.write_text("".join(json.dumps({"question": f"q{i}", "answer": f"#### {987654321 + i}"}) + "\n"
                            for i in range(8)))
    out = tmp_path / "run"
    rc = cli.main(["train", "task.type=jsonl", f"task.path={data}", "task.eval_size=1", "num_generations=4",
                   "generation_batch_size=8", "per_device_train_batch_size=8", "max_completion_length=6",
                   "max_prompt_length=256", "dynamic_sampling.enable=true", "dynamic_sampling.max_num_gen_batches=1",
                   "max_idle_rounds=2", "max_steps=50", "reward_timeout_s=0", f"logging.output_dir={out}",
                   "logging.progress=false", "logging.tensorboard=false"])
    assert rc == 3
    err = capsys.readouterr().err
    assert "max_idle_rounds=2" in err and "pass rate 0.0%" in err and "--resume" in err
    assert (out / "checkpoint-0" / ".complete").exists()

"""Faults of user environments end one episode, never the run (issue 26 "Bad input and faults")."""

from __future__ import annotations

import time
import warnings

import pytest
from conftest import EOS, CountingEnv, ScriptedEngine

from rlvr.envs import Step
from rlvr.envs.runner import FaultLog, EnvFault, call_many
from rlvr.tasks.base import Problem
from rlvr.types import SamplingParams

PROBLEMS = [Problem(uid=f"p{i}", question=f"{i} + 1 =", answer=str(i + 1)) for i in range(2)]
PARAMS = SamplingParams(max_new_tokens=4)


class Flaky(CountingEnv):
    """Problem p1's episodes fail in ``where`` (``reset``/``step``/``hang``/``type``/``close``); p0's run normally."""

    def __init__(self, where: str) -> None:
        super().__init__(2)
        self.where, self.bad = where, False

    def reset(self, problem):
        self.bad = problem.uid == "p1"
        if self.bad and self.where == "reset":
            raise RuntimeError("reset boom")
        if self.bad and self.where == "reset_type":
            return "not messages"
        return super().reset(problem)

    def step(self, action):
        if self.bad and self.where == "step":
            raise KeyError("step boom")
        if self.bad and self.where == "hang":
            time.sleep(30)
        if self.bad and self.where == "type":
            return {"observation": [], "reward": 1.0}
        return super().step(action)

    def close(self):
        if self.bad and self.where == "close":
            raise OSError("close boom")


@pytest.mark.parametrize("where, finish, method, expected", [
    ("reset", "error", "reset", "RuntimeError: reset boom"),
    ("reset_type", "error", "reset", "expected a list of chat messages"),
    ("step", "error", "step", "KeyError"),
    ("type", "error", "step", "expected rlvr.envs.Step"),
    ("hang", "timeout", "step", "still running at its deadline"),
])
def test_a_failing_episode_ends_with_reward_zero_and_one_warning(make_sampler, where, finish, method, expected):
    t0 = time.monotonic()
    s = make_sampler(ScriptedEngine(lambda ctx: [7, EOS]), lambda: Flaky(where), timeout_s=1.5 if where == "hang" else 0.0)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        b = s.sample(PROBLEMS, 3, PARAMS)
        b2 = s.sample(PROBLEMS, 3, PARAMS)  # the same fault again: counted, not warned again
    assert time.monotonic() - t0 < 10  # a hung step is abandoned at its deadline
    assert b.rewards.tolist() == [0.5] * 3 + [0.0] * 3 and not b.correct[3:].any()
    assert b.metrics[f"env/finish/{finish}"] == 0.5 and b2.metrics[f"env/finish/{finish}"] == 0.5
    assert b.metrics["env/errors" if finish == "error" else "env/timeouts"] == 3
    msgs = [str(x.message) for x in w if "environment" in str(x.message)]
    assert len(msgs) == 1, msgs
    assert f"Flaky.{method} failed ({finish})" in msgs[0] and expected in msgs[0]
    if where.startswith("reset"):  # the failed reset's rows are empty (nothing to train) with the task prompt
        assert b.completion_mask[3:].sum() == 0 and all(len(c) > 0 for c in b.context_ids)
    assert s.faults.errors + s.faults.timeouts == 6


def test_a_failing_close_is_counted_and_changes_nothing(make_sampler):
    s = make_sampler(ScriptedEngine(lambda ctx: [7, EOS]), lambda: Flaky("close"))
    with pytest.warns(UserWarning, match="Flaky.close failed"):
        b = s.sample(PROBLEMS, 2, PARAMS)
    assert b.rewards.tolist() == [0.5] * 4 and s.faults.by_kind == {"Flaky.close/error": 2}


def test_call_many_runs_concurrently_and_cuts_at_the_deadline():
    t0 = time.monotonic()
    out = call_many([(time.sleep, (0.3,), t0 + 5), (time.sleep, (0.3,), t0 + 5), (time.sleep, (5,), t0 + 0.5),
                     (lambda: 1 / 0, (), t0 + 5)])
    assert time.monotonic() - t0 < 1.5
    assert out[:2] == [None, None] and isinstance(out[2], EnvFault) and out[2].kind == "timeout"
    assert out[3].kind == "error" and "ZeroDivisionError" in out[3].text
    log = FaultLog()
    with pytest.warns(UserWarning, match="int.step failed"):
        log.record(1, "step", out[3])
    log.record(1, "step", out[3])
    assert log.errors == 2 and log.by_kind == {"int.step/error": 2}


def test_a_non_finite_reward_is_the_wrong_type(make_sampler):
    class NanEnv(CountingEnv):
        def step(self, action):
            return Step([], float("nan"), True)

    with pytest.warns(UserWarning, match="expected a finite Step.reward"):
        b = make_sampler(ScriptedEngine(lambda ctx: [7, EOS]), NanEnv).sample(PROBLEMS[:1], 2, PARAMS)
    assert b.rewards.tolist() == [0.0, 0.0] and b.metrics["env/finish/error"] == 1.0

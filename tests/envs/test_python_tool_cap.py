"""The python tool's concurrency cap (issue 37): a step with many calls never starts more sandboxes
than ``max_concurrent`` at once; a call that finds no slot within ``wait_s`` is a clear tool error."""

from __future__ import annotations

import threading
import time

import pytest

import rlvr.sandbox
from rlvr.envs import ToolEnv
from rlvr.envs.python_tool import make_python_tool
from rlvr.sandbox import RunResult


class SlowSandbox:
    """Stands in for ``rlvr.sandbox.run``: sleeps ``delay`` s and records the peak concurrency."""

    def __init__(self, delay: float) -> None:
        self.delay, self.now, self.peak, self.calls = delay, 0, 0, 0
        self.lock = threading.Lock()

    def __call__(self, code, **kw):
        with self.lock:
            self.now += 1
            self.calls += 1
            self.peak = max(self.peak, self.now)
        time.sleep(self.delay)
        with self.lock:
            self.now -= 1
        return RunResult("ok", 0, f"ran {code}\n", "", self.delay, "local")


def call_all(tool, n: int) -> list[str]:
    out = [None] * n
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, tool(f"print({i})"))) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_calls_beyond_the_cap_wait_for_a_slot(monkeypatch):
    fake = SlowSandbox(0.1)
    monkeypatch.setattr(rlvr.sandbox, "run", fake)
    out = call_all(make_python_tool(max_concurrent=3, wait_s=10), 12)
    assert fake.peak == 3 and fake.calls == 12
    assert out == [f"ran print({i})\n" for i in range(12)]


def test_a_call_that_finds_no_slot_in_time_is_a_tool_error(monkeypatch):
    fake = SlowSandbox(0.6)
    monkeypatch.setattr(rlvr.sandbox, "run", fake)
    out = call_all(make_python_tool(max_concurrent=2, wait_s=0.05), 6)
    ran = [o for o in out if o.startswith("ran")]
    refused = [o for o in out if o.startswith("Error: too many programs at once")]
    assert len(ran) == 2 and len(refused) == 4 and fake.peak == 2, out
    assert "max_concurrent=2" in refused[0]


def test_a_step_of_40_calls_runs_at_most_the_cap_at_once(monkeypatch):
    fake = SlowSandbox(0.05)
    monkeypatch.setattr(rlvr.sandbox, "run", fake)
    env = ToolEnv(None, tools=[make_python_tool(max_concurrent=4, wait_s=5)], tool_timeout_s=10, max_tool_calls=None)
    calls = "".join(f'<tool_call>{{"name": "python", "arguments": {{"code": "print({i})"}}}}</tool_call>'
                    for i in range(40))
    step = env.step(calls)
    assert fake.calls == 40 and fake.peak == 4
    assert step.info["tool_errors"] == 0 and [m["content"] for m in step.observation][-1] == "ran print(39)\n"


def test_a_slot_is_given_back_when_the_sandbox_raises(monkeypatch):
    def broken(code, **kw):
        raise RuntimeError("no sandbox")

    monkeypatch.setattr(rlvr.sandbox, "run", broken)
    tool = make_python_tool(max_concurrent=1, wait_s=0)
    for _ in range(3):  # a leaked slot would make the second call "too many programs"
        assert tool("print(1)").startswith("Error: the sandbox could not run the program: RuntimeError")


@pytest.mark.parametrize("bad", [{"max_concurrent": 0}, {"max_concurrent": 1.5}, {"wait_s": -1}])
def test_bad_cap_settings_name_the_key(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        make_python_tool(**bad)


class CountingTask:
    """Correct when the answer says 42."""

    name = "answer"

    def verify(self, problem, completion):
        from rlvr.tasks.base import Verdict

        return Verdict(score=float("42" in completion), correct="42" in completion)


def calls(n: int, name: str = "python") -> str:
    from rlvr.envs.tools import format_hermes

    return "".join(format_hermes(name, {"code": f"print({i})"} if name == "python" else {"expression": "1+1"})
                   for i in range(n))


def test_tool_calls_past_max_tool_calls_start_no_sandbox_and_say_so(monkeypatch):
    from rlvr.tasks.base import Problem

    fake = SlowSandbox(0.0)
    monkeypatch.setattr(rlvr.sandbox, "run", fake)
    env = ToolEnv(CountingTask(), tools=["python", "calculator"], max_tool_calls=3)
    env.reset(Problem(uid="p", question="q", answer="42"))
    step = env.step(calls(2))
    assert fake.calls == 2 and step.info == {"tool_calls": 2, "tool_errors": 0}
    step = env.step(calls(1, "calculator") + calls(2))  # the calculator takes the last slot
    assert fake.calls == 2 and step.info == {"tool_calls": 3, "tool_errors": 2}
    assert step.observation[0]["content"] == "2"
    refused = step.observation[2]["content"]
    assert refused.startswith("Error: tool call limit reached") and "env.max_tool_calls=3" in refused
    assert "'python' call was not run" in refused
    assert not step.done
    step = env.step(calls(5))
    assert fake.calls == 2 and step.info["tool_errors"] == 5
    final = env.step("The answer is 42.")  # answering still works past the cap
    assert final.done and final.reward == 1.0
    env.reset(Problem(uid="p2", question="q", answer="42"))  # a new episode gets a fresh budget
    assert env.step(calls(3)).info == {"tool_calls": 3, "tool_errors": 0} and fake.calls == 5


def test_unparseable_and_unknown_calls_do_not_use_the_budget(monkeypatch):
    from rlvr.tasks.base import Problem

    fake = SlowSandbox(0.0)
    monkeypatch.setattr(rlvr.sandbox, "run", fake)
    env = ToolEnv(CountingTask(), tools=["python"], max_tool_calls=1)
    env.reset(Problem(uid="p", question="q", answer="42"))
    step = env.step("<tool_call>{not json</tool_call>" + calls(1, "nope") + calls(1))
    assert fake.calls == 1 and step.info == {"tool_calls": 3, "tool_errors": 2}


def test_max_tool_calls_default_and_bad_values():
    assert ToolEnv(CountingTask(), tools=["python"]).max_tool_calls == 16
    assert ToolEnv(CountingTask(), tools=["python"], max_tool_calls=None).max_tool_calls is None
    for bad in (0, -1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="env.max_tool_calls must be an integer >= 1"):
            ToolEnv(CountingTask(), tools=["python"], max_tool_calls=bad)

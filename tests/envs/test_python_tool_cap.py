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
    env = ToolEnv(None, tools=[make_python_tool(max_concurrent=4, wait_s=5)], tool_timeout_s=10)
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

"""The built-in ``python`` tool of the ``tools`` environment (issue 26 item 6): model code in the sandbox."""

from __future__ import annotations

import json
import time

from conftest import EOS, ScriptedEngine

from rlvr.envs import ToolEnv
from rlvr.envs.python_tool import describe_result, make_python_tool, python
from rlvr.sandbox import RunResult
from rlvr.tasks.base import Problem, Verdict
from rlvr.types import SamplingParams

PROBLEM = Problem(uid="f", question="What is 20 factorial?", answer="2432902008176640000")
CODE = "import math\nprint(math.factorial(20))"


class AnswerTask:
    """Correct when the text contains the reference answer."""

    name = "answer"

    def verify(self, problem, completion):
        ok = problem.answer in completion
        return Verdict(score=float(ok), correct=ok)


def test_schema_and_a_computation():
    env = ToolEnv(AnswerTask(), tools=["python", "calculator"])
    schema = env.tools[0]["function"]
    assert schema["name"] == "python" and schema["parameters"]["required"] == ["code"]
    assert schema["parameters"]["properties"]["code"]["type"] == "string"
    assert python(CODE) == "2432902008176640000\n"
    assert "no output" in python("x = 1")


def test_an_infinite_loop_times_out_quickly():
    tool = make_python_tool(timeout_s=1)
    t0 = time.monotonic()
    out = tool("print('started', flush=True)\nwhile True:\n    pass")
    assert time.monotonic() - t0 < 3
    assert out.startswith("Error: the program timed out after 1 s") and "stdout:\nstarted" in out


def test_an_exception_returns_its_traceback():
    out = python("def f(x):\n    return 1 / x\nprint('before')\nf(0)")
    assert out.startswith("Error: the program failed (exit status 1)")
    assert "ZeroDivisionError: division by zero" in out and "return 1 / x" in out and "stdout:\nbefore" in out
    assert 'File "<string>"' not in out  # the sandbox launcher's own frame is not shown


def test_sandbox_faults_and_bad_limits_become_messages():
    assert python(42) == 'Error: "code" must be a string (the program\'s text), got int'
    out = make_python_tool(backend="nope")("print(1)")
    assert out.startswith("Error: the sandbox could not run the program: SandboxUnavailable") and "nope" in out
    assert "timeout_s" in make_python_tool(timeout_s=0)("print(1)")
    broken = RunResult("sandbox_error", None, "", "", 0.0, "bwrap", "bwrap: setting up uid map: Permission denied")
    assert describe_result(broken, 3, 512, 100) == ("Error: the sandbox (bwrap) could not run the program: "
                                                   "bwrap: setting up uid map: Permission denied")
    big = RunResult("output_limit", -9, "x" * 100, "", 0.1, "bwrap", "stdout past 100 bytes")
    assert describe_result(big, 3, 512, 100).startswith("Error: the program printed more than 100 bytes\nstdout:\nxxx")


def test_output_is_cut_to_the_environments_limit():
    env = ToolEnv(AnswerTask(), tools=["python"], max_output_chars=40)
    env.reset(PROBLEM)
    call = json.dumps({"name": "python", "arguments": {"code": "print('ab' * 5000)"}})
    step = env.step(f"<tool_call>{call}</tool_call>")
    out = step.observation[0]["content"]
    assert out.startswith("ab" * 20) and "[output truncated: 9961 more characters]" in out
    assert step.info == {"tool_calls": 1, "tool_errors": 0}


def test_a_python_tool_episode_through_the_sampler(make_sampler, tiny):
    """Turn 1 runs code, turn 2 answers with what it printed; the answer is scored by the task."""
    _, tok = tiny
    call = tok("<tool_call>" + json.dumps({"name": "python", "arguments": {"code": CODE}}) + "</tool_call>",
               add_special_tokens=False)["input_ids"] + [EOS]
    answer = tok(PROBLEM.answer, add_special_tokens=False)["input_ids"] + [EOS]
    eng = ScriptedEngine(lambda ctx: answer if f"<|im_start|>tool\n{PROBLEM.answer}" in tok.decode(ctx) else call)
    s = make_sampler(eng, lambda: ToolEnv(AnswerTask(), tools=["python"]), max_tokens=1000, max_prompt_length=1024)
    b = s.sample([PROBLEM], 2, SamplingParams(max_new_tokens=128))
    assert len(call) < 128
    m = b.metrics
    assert m["env/tool_calls"] == 1 and m["env/tool_errors"] == 0 and m["env/turns_mean"] == 2
    assert b.rewards.tolist() == [1.0, 1.0] and m["env/finish/env_done"] == 1.0
    assert '"name": "python"' in tok.decode(b.context_ids[0])  # the schema is in the prompt

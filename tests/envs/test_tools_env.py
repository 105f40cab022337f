"""The ``tools`` environment (issue 26 item 5) and the ``feedback`` environment (item 6)."""

from __future__ import annotations

import time

import pytest
from conftest import EOS, ScriptedEngine

from rlvr.envs import FeedbackEnv, ToolEnv, calculator
from rlvr.envs.tools import parse_hermes
from rlvr.tasks.base import Problem, Verdict
from rlvr.types import SamplingParams

PROBLEM = Problem(uid="q", question="What is 6 * 7?", answer="42")


class AnswerTask:
    """Correct when the text contains the reference answer; feedback says so."""

    name = "answer"

    def verify(self, problem, completion):
        ok = problem.answer in completion
        return Verdict(score=float(ok), correct=ok, feedback=None if ok else f"{completion!r} is wrong")


def slow(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: how long to sleep.
    """
    time.sleep(seconds)
    return "slept"


def shout(text: str) -> str:
    """Repeat a text many times.

    Args:
        text: what to repeat.
    """
    return text * 10_000


def test_hermes_parser():
    calls = parse_hermes('a <tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call> b '
                         '<tool_call>{"name": "x", "arguments": "{\\"k\\": 1}"}</tool_call><tool_call>not json</tool_call>'
                         '<tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "y"')
    assert [(c.name, c.arguments, c.error is None) for c in calls[:2]] == [
        ("calculator", {"expression": "1+2"}, True), ("x", {"k": 1}, True)]
    assert "not valid JSON" in calls[2].error and 'string "name"' in calls[3].error and "unclosed" in calls[4].error
    assert parse_hermes("The answer is 42.") == []


def test_calculator():
    assert calculator("(3 + 4) * 12") == "84" and calculator("7 / 2") == "3.5" and calculator("2 ** 10") == "1024"
    for bad in ("__import__('os')", "2 ** 1000", "x + 1"):
        with pytest.raises(ValueError):
            calculator(bad)


def test_tool_calls_errors_timeouts_and_truncation():
    env = ToolEnv(AnswerTask(), tools=["calculator", slow, shout], tool_timeout_s=0.3, max_output_chars=50)
    assert [t["function"]["name"] for t in env.tools] == ["calculator", "slow", "shout"]
    assert env.tools[0]["function"]["parameters"]["required"] == ["expression"]
    env.reset(PROBLEM)
    step = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
                    '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>'
                    '<tool_call>{"name": "slow", "arguments": {"seconds": 5}}</tool_call>'
                    '<tool_call>{"name": "shout", "arguments": {"text": "ab"}}</tool_call>'
                    '<tool_call>{"name": "nope", "arguments": {}}</tool_call><tool_call>{bad</tool_call>')
    out = [m["content"] for m in step.observation]
    assert not step.done and step.reward == 0 and [m["role"] for m in step.observation] == ["tool"] * 6
    assert out[0] == "42" and "ZeroDivisionError" in out[1] and "timed out after 0.3 s" in out[2]
    assert out[3].startswith("ab" * 25) and "[output truncated: 19950 more characters]" in out[3]
    assert "unknown tool 'nope'" in out[4] and "not valid JSON" in out[5]
    assert step.info == {"tool_calls": 6, "tool_errors": 4}
    final = env.step("It is 42.")
    assert final.done and final.reward == 1.0 and final.info["correct"] is True


def test_a_tool_episode_through_the_sampler(make_sampler, tiny):
    """Turn 1 calls the calculator, turn 2 answers: the tool's output is an environment span, the
    final answer is scored by the task."""
    _, tok = tiny
    call = tok('<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>',
               add_special_tokens=False)["input_ids"] + [EOS]
    answer = tok("42", add_special_tokens=False)["input_ids"] + [EOS]
    eng = ScriptedEngine(lambda ctx: answer if "<|im_start|>tool\n42" in tok.decode(ctx) else call)
    s = make_sampler(eng, lambda: ToolEnv(AnswerTask()), max_tokens=1000, max_prompt_length=1024)
    b = s.sample([PROBLEM], 2, SamplingParams(max_new_tokens=128))
    assert len(call) < 128
    m = b.metrics
    assert m["env/tool_calls"] == 1 and m["env/tool_errors"] == 0 and m["env/turns_mean"] == 2
    assert b.rewards.tolist() == [1.0, 1.0] and m["env/finish/env_done"] == 1.0
    text = tok.decode(b.context_ids[0] + b.completion_ids[0].tolist())
    assert "<|im_start|>tool\n42<|im_end|>" in text and "calculator" in tok.decode(b.context_ids[0])  # tools shown
    assert b.model_lengths.tolist() == [len(call) + len(answer)] * 2


def test_feedback_env_retries_with_the_verifiers_feedback():
    env = FeedbackEnv(AnswerTask(), system_prompt="Be brief.", max_retries=2)
    assert env.reset(PROBLEM)[0] == {"role": "system", "content": "Be brief."}
    s1 = env.step("41")
    assert not s1.done and s1.reward == 0 and s1.observation == [{"role": "user", "content": "'41' is wrong Try again."}]
    s2 = env.step("42")
    assert s2.done and s2.reward == 1.0 and s2.info == {"correct": True}
    env2 = FeedbackEnv(AnswerTask(), max_retries=1)
    env2.reset(PROBLEM)
    assert not env2.step("1").done and env2.step("2").done  # out of retries

"""The ``tools`` environment: the model calls plain Python functions, reads their output, then answers.

* Schemas come from each function's signature and docstring through transformers'
  ``get_json_schema`` and reach the prompt through the chat template's ``tools=`` (the sampler reads
  :attr:`ToolEnv.tools`).
* Tool calls are parsed from the model's turn by a parser of :data:`TOOL_PARSERS` (``hermes``: the
  Hermes / Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` format).
* Each call runs in its own daemon thread with ``tool_timeout_s``; an exception, a timeout, an
  unknown tool or an unparseable call becomes a ``tool`` message saying so (counted in
  ``info["tool_errors"]``), never a crash. Output longer than ``max_output_chars`` is cut, with a note.
* At most ``max_tool_calls`` calls run per episode (every tool; a ``python`` call starts a sandbox): a
  call past it is not run and gets a ``tool`` message saying the limit was reached (a tool error).
* The episode ends when the model answers without a tool call (the task's verifier scores that
  answer) or at ``env.max_turns`` (reward 0: no answer was given).

Source: issue 26 item 5; the format is Hermes-2-Pro's / Qwen2.5's function calling
(``<tool_call>`` tags, as vLLM's ``hermes`` tool parser reads them).
"""

from __future__ import annotations

import ast
import json
import math
import operator
from typing import Any, Callable, Sequence

from rlvr.envs.base import ENVS, Step
from rlvr.envs.builtin import TaskEnv
from rlvr.envs.runner import EnvFault, call_many
from rlvr.registry import Registry

__all__ = ["TOOL_PARSERS", "TOOLS", "ToolCall", "ToolEnv", "calculator", "format_hermes", "parse_hermes"]


class ToolCall:
    """One parsed call: ``name`` and ``arguments`` (dict), or ``error`` (why it could not be parsed)."""

    def __init__(self, name: str | None, arguments: dict[str, Any] | None = None, error: str | None = None) -> None:
        self.name, self.arguments, self.error = name, arguments or {}, error

    def __repr__(self) -> str:
        return f"ToolCall({self.name!r}, {self.arguments!r}, error={self.error!r})"


TOOL_PARSERS: Registry[Callable[[str], list[ToolCall]]] = Registry("env.parser", "rlvr.envs.tools.TOOL_PARSERS")
"""``env.parser`` → ``(action text) -> [ToolCall]`` (empty: the turn is a final answer)."""

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_DECODER = json.JSONDecoder()
_SPACE = " \t\n\r"


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in _SPACE:
        i += 1
    return i


def format_hermes(name: str, arguments: dict[str, Any]) -> str:
    """One call in the format :func:`parse_hermes` reads: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``
    (JSON with non-ASCII characters kept as they are, as the chat templates of Hermes / Qwen write it)."""
    return _OPEN + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + _CLOSE


def _read_call(obj: Any) -> ToolCall:
    """The :class:`ToolCall` of one decoded ``<tool_call>`` body."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(None, error='a tool call must be a JSON object with a string "name"')
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (json.JSONDecodeError, RecursionError):
            pass
    if not isinstance(args, dict):
        return ToolCall(obj["name"], error='"arguments" must be a JSON object')
    return ToolCall(obj["name"], args)


@TOOL_PARSERS.register("hermes")
def parse_hermes(text: str) -> list[ToolCall]:
    """Calls in Hermes / Qwen format: each ``<tool_call>{"name": str, "arguments": object}</tool_call>``.

    Read by scanning, not by a regular expression: after each ``<tool_call>`` (and whitespace) one JSON
    value is decoded (``json.JSONDecoder.raw_decode``), then whitespace and ``</tool_call>`` must follow.
    So a ``</tool_call>`` inside a JSON string (``{"code": "print('</tool_call>')"}``) is part of the
    argument, not the end of the call (the non-greedy pattern used before cut such a call there and
    reported it as invalid JSON; vLLM's ``hermes`` parser had the same bug). A block whose JSON does not
    parse (or is followed by anything but ``</tool_call>``) is skipped to the next ``</tool_call>``.

    A block whose JSON does not parse, lacks a string ``name`` or has non-object ``arguments`` (a JSON
    string holding an object is accepted, as some models write it), or an unclosed ``<tool_call>``,
    gives a :class:`ToolCall` with ``error`` set. Text outside the tags is ignored.
    """
    calls: list[ToolCall] = []
    pos = 0
    while (start := text.find(_OPEN, pos)) != -1:
        body = _skip_space(text, start + len(_OPEN))
        try:
            obj, end = _DECODER.raw_decode(text, body)
        except json.JSONDecodeError as exc:
            error = f"the tool call is not valid JSON ({exc.msg}, char {exc.pos - body})"
        except RecursionError:
            error = "the tool call is not valid JSON (nested too deep)"
        else:
            after = _skip_space(text, end)
            if text.startswith(_CLOSE, after):
                calls.append(_read_call(obj))
                pos = after + len(_CLOSE)
                continue
            error = f"the tool call is not valid JSON (Extra data, char {end - body})"
        close = text.find(_CLOSE, body)
        if close == -1:
            calls.append(ToolCall(None, error=f"unclosed {_OPEN} (no {_CLOSE})"))
            break
        calls.append(ToolCall(None, error=error))
        pos = close + len(_CLOSE)
    return calls


_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
    ast.USub: operator.neg, ast.UAdd: operator.pos,
}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large (|exponent| <= 64)")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError(f"unsupported expression element {type(node).__name__} (numbers and + - * / // % ** only)")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: an arithmetic expression of numbers, parentheses and + - * / // % **, e.g. "(3 + 4) * 12".
    """
    value = _eval(ast.parse(str(expression), mode="eval"))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("the result is not finite")
        if value.is_integer():
            value = int(value)
    return str(value)


TOOLS: Registry[Callable[..., Any]] = Registry("env.tools", "rlvr.envs.tools.TOOLS")
"""Built-in tools by name (``calculator``; ``python`` from :mod:`rlvr.envs.python_tool`); any other entry of ``env.tools`` is ``"module:function"``."""
TOOLS.register("calculator")(calculator)


def _resolve_tool(spec: Any) -> Callable[..., Any]:
    if callable(spec):
        return spec
    if isinstance(spec, str) and ":" in spec:
        from rlvr.tasks.custom import load_attribute

        fn = load_attribute(spec, "env.tools", what="function")
        if callable(fn):
            return fn
        raise ValueError(f"env.tools: {spec!r} is not callable")
    return TOOLS[str(spec)]


@ENVS.register("tools")
class ToolEnv(TaskEnv):
    """Tool use over plain Python callables, answered and scored by the task's verifier.

    Args:
        task / system_prompt: from the run.
        tools: callables, built-in names (``calculator``, ``python``) or ``"module:function"`` strings; each needs
            type hints and a Google-style docstring with an ``Args:`` section (``get_json_schema``).
        parser: key of :data:`TOOL_PARSERS`.
        tool_timeout_s: seconds one call may run (> 0).
        max_output_chars: a tool's output (or error) longer than this is cut to it, with a note saying
            how much was left out.
        max_tool_calls: tool calls run per episode (``None``: no cap). A parsed call of a known tool
            past it is not run (no sandbox starts for ``python``); its ``tool`` message says so and it
            counts in ``tool_errors``. Calls that fail to parse or name an unknown tool never run and do
            not count. Interpretation (issue 37): the ``python`` tool's ``max_concurrent`` bounds the
            sandboxes at once, this bounds them per episode, so a policy cannot buy compute with calls.

    Raises:
        ValueError / UnknownNameError / transformers' ``TypeHintParsingException`` /
        ``DocstringParsingException``: no tools, an unknown tool or parser, a tool without a schema, a
        ``max_tool_calls`` that is not an integer >= 1 or null (the key is named).
    """

    observation_roles: tuple[str, ...] = ("tool",)

    def __init__(self, task: Any, system_prompt: str | None = None, tools: Sequence[Any] = ("calculator",),
                 parser: str = "hermes", tool_timeout_s: float = 5.0, max_output_chars: int = 1000,
                 max_tool_calls: int | None = 16) -> None:
        from transformers.utils import get_json_schema

        super().__init__(task, system_prompt)
        if isinstance(tools, (str, bytes)) or not tools:
            raise ValueError(f"env.tools must be a non-empty list of tools, got {tools!r}")
        if not tool_timeout_s > 0 or int(max_output_chars) < 1:
            raise ValueError("env.tool_timeout_s must be > 0 and env.max_output_chars >= 1")
        if max_tool_calls is not None and (isinstance(max_tool_calls, bool) or not isinstance(max_tool_calls, int)
                                           or max_tool_calls < 1):
            raise ValueError(f"env.max_tool_calls must be an integer >= 1 (or null: no cap), got {max_tool_calls!r}")
        self.functions = {fn.__name__: fn for fn in map(_resolve_tool, tools)}
        self.tools = [get_json_schema(fn) for fn in self.functions.values()]
        self.parse = TOOL_PARSERS[parser]
        self.tool_timeout_s = float(tool_timeout_s)
        self.max_output_chars = int(max_output_chars)
        self.max_tool_calls = max_tool_calls
        self.calls_run = 0  # tool calls run in this episode (reset by reset())

    def reset(self, problem: Any) -> list[dict[str, Any]]:
        """Start an episode: the task's prompt, and a fresh ``max_tool_calls`` budget."""
        self.calls_run = 0
        return super().reset(problem)

    def _cut(self, text: str) -> str:
        if len(text) <= self.max_output_chars:
            return text
        return text[: self.max_output_chars] + f"\n[output truncated: {len(text) - self.max_output_chars} more characters]"

    def _run_calls(self, calls: list[ToolCall]) -> tuple[list[str], int]:
        """Output text per call and the number that failed."""
        import time

        jobs, outs = [], [""] * len(calls)
        deadline = time.monotonic() + self.tool_timeout_s
        for i, c in enumerate(calls):
            if c.error is not None:
                outs[i] = f"Error: {c.error}"
            elif c.name not in self.functions:
                outs[i] = f"Error: unknown tool {c.name!r} (tools: {', '.join(self.functions)})"
            elif self.max_tool_calls is not None and self.calls_run >= self.max_tool_calls:
                outs[i] = (f"Error: tool call limit reached: this episode already ran {self.calls_run} tool calls "
                           f"(env.max_tool_calls={self.max_tool_calls}), so this {c.name!r} call was not run; "
                           "answer without a tool call")
            else:
                self.calls_run += 1
                jobs.append((i, c))
        errors = len(calls) - len(jobs)
        results = call_many([(lambda fn=self.functions[c.name], kw=c.arguments: fn(**kw), (), deadline) for _, c in jobs])
        for (i, c), r in zip(jobs, results):
            if isinstance(r, EnvFault):
                errors += 1
                why = (f"timed out after {self.tool_timeout_s:g} s" if r.kind == "timeout" else r.text)
                outs[i] = f"Error: tool {c.name!r} {why}"
            else:
                outs[i] = r if isinstance(r, str) else json.dumps(r, default=str)
        return [self._cut(o) for o in outs], errors

    def step(self, action: str) -> Step:
        """Run the tool calls of ``action``; without any, score it as the final answer and end."""
        calls = self.parse(action)
        if not calls:
            score, correct, feedback = self._judge(action)
            return Step([], score, True, feedback, {"correct": correct, "tool_calls": 0, "tool_errors": 0})
        outs, errors = self._run_calls(calls)
        obs = [{"role": "tool", "name": c.name or "unknown", "content": o} for c, o in zip(calls, outs)]
        return Step(obs, 0.0, False, None, {"tool_calls": len(calls), "tool_errors": errors})

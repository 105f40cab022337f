"""Running a completion's program against a problem's tests in a sandbox, and what to tell the model.

Two kinds of test (a problem's ``metadata["tests"]``, in order):

* ``{"kind": "assert", "expr": "add(1, 2) == 3", "hidden": false}`` and ``{"kind": "check", "code":
  ...}`` (HumanEval's ``check(candidate)``, hidden) — all of a completion's tests run in ONE sandbox
  run, through the harness of :mod:`rlvr.tasks.harness`: a judge process holds the tests and compares
  plain values decoded from the program's answers, the program runs in a second process that sees
  only the arguments of each call, and a result counts only when its report line carries the run's
  HMAC. A program that exits early, prints fake results, patches builtins, returns an object whose
  ``__eq__`` always answers True or inspects frames passes nothing (``docs/code_rewards.md``).
* ``{"kind": "io", "stdin": "1 2\\n", "stdout": "3\\n", "hidden": false}`` — the program runs as
  ``__main__`` with that stdin, once per test; it passes when it exits 0 and its stdout equals the
  expected one, up to trailing whitespace on each line and trailing blank lines.

Tests run in order and stop at the first failure; ``passed`` is the number before it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rlvr.sandbox import run as sandbox_run
from rlvr.tasks.harness import judge_program, judge_stdin, new_key, read_reports

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PY = {"python", "py", "python3", "py3", "python2"}


def extract_program(completion: str) -> tuple[str | None, str]:
    """The last fenced Python block of ``completion``: ``(code, source)``.

    ``source`` is ``"python"`` (a block tagged python/py/python3), ``"fence"`` (no tagged block:
    the last untagged block), or ``"none"`` (no closed block; code is None). Interpretation: a block
    tagged with another language (```text, ```bash) is never the program.
    """
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(completion)]
    tagged = [code for lang, code in blocks if lang in _PY]
    if tagged:
        return tagged[-1], "python"
    bare = [code for lang, code in blocks if not lang]
    if bare:
        return bare[-1], "fence"
    return None, "none"


def syntax_problem(code: str) -> str | None:
    """``None`` if ``code`` compiles, else a one-line description (line and message). ``compile``
    runs no code; inputs that crash the compiler (deep nesting, NUL bytes) are reported the same way."""
    try:
        compile(code, "solution.py", "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"line {exc.lineno}: {exc.msg}"
    except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@dataclass(frozen=True)
class Outcome:
    """The result of running one completion's tests.

    Attributes:
        passed: tests passed before the first failure.
        total: tests of the problem.
        failed: index of the first failing test, ``-1`` when the program itself failed to load (or
            lacks its entry point), ``None`` when all passed.
        error: what went wrong (``AssertionError``, an exception type, ``Timeout``, ``Memory``,
            ``OutputLimit``, ``WrongOutput``, ``Exited``), or ``""``.
        message: the error's message (the model's own program's, never a test's source).
        got, expected: reprs (assert) or texts (io) of a failing comparison, else None.
    """

    passed: int
    total: int
    failed: int | None = None
    error: str = ""
    message: str = ""
    got: str | None = None
    expected: str | None = None


class SandboxFailure(RuntimeError):
    """The sandbox itself failed (not the program): the reward worker counts it as an error, so a
    broken sandbox shows in the run's error count instead of as a policy that scores 0."""


def _limits(cfg: Any) -> dict[str, Any]:
    return dict(memory_mb=cfg.memory_mb, output_bytes=cfg.output_bytes, backend=cfg.backend, url=cfg.url,
                python=cfg.python)


_STATUS_ERROR = {"timeout": "Timeout", "memory": "Memory", "output_limit": "OutputLimit", "killed": "Killed"}


def _last_exception(stderr: str) -> tuple[str, str]:
    """``(type, message)`` from the last line of a Python traceback, or ``("Error", "")``."""
    line = stderr.rstrip().rsplit("\n", 1)[-1] if stderr.strip() else ""
    m = re.match(r"([A-Za-z_][\w.]*)(?::\s?(.*))?$", line)
    return (m.group(1).rsplit(".", 1)[-1], (m.group(2) or "")[:300]) if m else ("Error", "")


def run_assert_tests(code: str, tests: list[dict[str, Any]], entry_point: str | None, cfg: Any,
                     setup: str = "") -> Outcome:
    """Run the assert-style (and ``test_code``) ``tests`` of one program in one sandbox run, through the
    judge/candidate harness (:mod:`rlvr.tasks.harness`): the tests and their expected values never
    enter the program's process, results are compared as plain values by the judge, and only
    HMAC-signed report lines count. ``setup`` is the problem's own code (HumanEval's prompt helpers),
    run by the judge before the tests; a name it binds is the problem's, never the program's.

    Raises:
        SandboxFailure: the backend could not run the harness, or the harness itself failed (it could
            not protect itself, a test's own code failed, a test passes a value it cannot send).
    """
    key = new_key()
    stdin = judge_stdin(key, tests, entry_point, cfg.timeout_s, cfg.output_bytes, setup)
    res = sandbox_run(judge_program(), stdin=stdin, files={"solution.py": code},
                      timeout_s=cfg.timeout_s * (len(tests) + 1) + 1.0, **_limits(cfg))
    if res.status == "sandbox_error":
        raise SandboxFailure(f"sandbox backend {res.backend} failed: {res.detail}")
    passed, loaded = 0, False
    for r in read_reports(res.stdout, key):
        if "harness" in r:
            raise SandboxFailure(f"code-scoring harness: {r['harness']}")
        if r.get("loaded"):
            loaded = True
            continue
        if r.get("done"):
            return Outcome(passed, len(tests)) if loaded and passed == len(tests) else _ended(passed, tests, loaded, res)
        if r.get("ok"):
            passed += 1
            continue
        i = r.get("i", passed)
        return Outcome(passed, len(tests), i, str(r.get("error", "Error")), str(r.get("message") or ""),
                       r.get("got"), r.get("expected"))
    return _ended(passed, tests, loaded, res)


def _ended(passed: int, tests: list[dict[str, Any]], loaded: bool, res: Any) -> Outcome:
    """The run ended before the judge reported the last test (killed, out of time or memory)."""
    error = _STATUS_ERROR.get(res.status, "Exited")
    message = res.detail if res.status != "ok" else "the run ended before the tests finished"
    return Outcome(passed, len(tests), passed if loaded else -1, error, message)


def _same_output(got: str, want: str) -> bool:
    def norm(s: str) -> list[str]:
        lines = [ln.rstrip() for ln in s.replace("\r\n", "\n").split("\n")]
        while lines and not lines[-1]:
            lines.pop()
        return lines

    return norm(got) == norm(want)


def run_io_tests(code: str, tests: list[dict[str, Any]], cfg: Any) -> Outcome:
    """Run the stdin/stdout ``tests`` one sandbox run each, stopping at the first failure.

    Raises:
        SandboxFailure: the backend could not run the program.
    """
    for i, t in enumerate(tests):
        res = sandbox_run(code, stdin=t["stdin"], timeout_s=cfg.timeout_s, **_limits(cfg))
        if res.status == "sandbox_error":
            raise SandboxFailure(f"sandbox backend {res.backend} failed: {res.detail}")
        if res.status == "error":
            kind, msg = _last_exception(res.stderr)
            return Outcome(i, len(tests), i, kind, msg)
        if res.status != "ok":
            return Outcome(i, len(tests), i, _STATUS_ERROR.get(res.status, "Killed"), res.detail)
        if not _same_output(res.stdout, t["stdout"]):
            return Outcome(i, len(tests), i, "WrongOutput", "", res.stdout, t["stdout"])
    return Outcome(len(tests), len(tests))


def _clip(text: str, n: int = 120) -> str:
    s = text.strip()
    s = s if len(s) <= n else s[: n - 3] + "..."
    return s.replace("`", "'")


def feedback_for(outcome: Outcome, tests: list[dict[str, Any]], cfg: Any, entry_point: str | None) -> str | None:
    """The feedback text of ``outcome`` (``None`` when every test passed).

    A public test that failed is named by its number, its assertion or input, and how it failed
    (the error type and message, or expected against got); a hidden test only as "a hidden test
    failed" (interpretation: the count of tests passed is shown, their content never).
    """
    if outcome.failed is None:
        return None
    if outcome.failed < 0:
        if outcome.error == "NameError" and entry_point and "is defined" in outcome.message:
            return f"Your program does not define the function `{entry_point}`."
        if outcome.error == "Timeout":
            return f"Loading your program took longer than {cfg.timeout_s:g} s."
        detail = f": {_clip(outcome.message)}" if outcome.message else ""
        return f"Loading your program failed: {outcome.error}{detail}."
    if outcome.failed >= len(tests) or tests[outcome.failed].get("hidden"):
        return f"A hidden test failed ({outcome.passed} of {outcome.total} tests passed)."
    t, n = tests[outcome.failed], outcome.failed + 1
    what = f"`{_clip(t['expr'])}`" if t.get("kind") == "assert" else f"on input `{_clip(t['stdin'], 60)}`"
    if outcome.error == "Timeout":
        how = f"took longer than {cfg.timeout_s:g} s"
    elif outcome.error == "Memory":
        how = f"ran out of memory (limit {cfg.memory_mb} MiB)"
    elif outcome.error == "OutputLimit":
        how = f"printed more than {cfg.output_bytes} bytes"
    elif outcome.error == "WrongOutput":
        how = f"expected output `{_clip(outcome.expected or '', 60)}`, got `{_clip(outcome.got or '', 60)}`"
    elif outcome.error == "AssertionError" and outcome.got is not None:
        how = f"got `{_clip(outcome.got, 60)}`, expected `{_clip(outcome.expected or '', 60)}`"
    elif outcome.error == "AssertionError":
        how = "the assertion is false"
    else:
        how = f"raised {outcome.error}{': ' + _clip(outcome.message) if outcome.message else ''}"
    return f"Test {n} failed: {what}: {how}."

"""The built-in ``python`` tool of the ``tools`` environment: model-written code, run in the sandbox.

``env.tools=[python]`` gives the model a tool that runs a Python program with :func:`rlvr.sandbox.run`
and returns what it printed. A program that fails (an exception, a timeout, too much memory or
output) returns a message saying so, with the traceback; so does a sandbox that cannot run it: the
tool never raises into the episode (so such failures are not counted in ``env/tool_errors``).

The ``tools`` environment has no per-tool options, so the built-in ``python`` runs with
:data:`DEFAULTS`; other limits are a two-line module of your own, named as ``"my_tools:python"``::

    # my_tools.py
    from rlvr.envs.python_tool import make_python_tool
    python = make_python_tool(timeout_s=10, memory_mb=1024, max_concurrent=2)

At most ``max_concurrent`` programs of one tool run at once in a process (a ``tools`` step runs all
its calls together); a call beyond the cap waits ``wait_s`` for a slot, then returns an error.

Source: issue 26 item 6 (a Python tool over the code-execution sandbox); the limits and backends are
the sandbox's (``docs/code_rewards.md``).
"""

from __future__ import annotations

import os
import re
import threading
from typing import Callable

from rlvr.envs.tools import TOOLS

__all__ = ["DEFAULTS", "describe_result", "make_python_tool", "python"]

DEFAULTS: dict[str, object] = {"timeout_s": 3.0, "memory_mb": 512, "output_bytes": 64 * 1024, "backend": "auto",
                               "max_concurrent": max(1, min(os.cpu_count() or 4, 8)), "wait_s": 1.5}
"""Limits of the built-in ``python`` tool: the keywords of :func:`rlvr.sandbox.run` — 3 s wall clock
(below the environment's default ``tool_timeout_s`` of 5 s, so the sandbox's own message arrives
first), 512 MiB address space, 64 KiB of stdout and of stderr (the environment then cuts to its
``max_output_chars``), backend ``auto`` (``bwrap``; where bwrap cannot run, every call returns the
sandbox's refusal naming the fix: it never falls back to ``local``) — and the concurrency cap:
at most ``max_concurrent`` programs of this tool run at once in this process (the CPU count, at
most 8), and a call beyond it waits up to ``wait_s`` seconds for a slot, then returns an error
(1.5 s: the wait plus the run stay within ``tool_timeout_s``). Interpretation (issue 37): a
``tools`` step runs all its calls at once, so 40 calls in one turn would start 40 sandboxes."""

_LAUNCHER_FRAME = re.compile(r'^  File "<string>", line \d+, in <module>\n', re.MULTILINE)


def describe_result(res, timeout_s: float, memory_mb: int, output_bytes: int) -> str:
    """The tool message for one :class:`~rlvr.sandbox.RunResult`.

    ``ok``: stdout (plus stderr, labelled, when the program wrote any), or a note that nothing was
    printed. Otherwise ``"Error: ..."`` naming the status and the limit, then the stderr (the
    sandbox launcher's own traceback frame removed) and whatever stdout the program printed first.
    """
    err = _LAUNCHER_FRAME.sub("", res.stderr).rstrip()
    if res.status == "ok":
        out = res.stdout if res.stdout.strip() else "(no output: print() the values you want to see)"
        return out + (f"\nstderr:\n{err}" if err else "")
    why = {
        "error": f"the program failed (exit status {res.returncode})",
        "timeout": f"the program timed out after {timeout_s:g} s",
        "memory": f"the program ran out of memory ({memory_mb} MiB)",
        "output_limit": f"the program printed more than {output_bytes} bytes",
        "killed": f"the program was killed (signal {-(res.returncode or 0)})",
        "sandbox_error": f"the sandbox ({res.backend}) could not run the program: {res.detail}",
    }.get(res.status, f"the program ended with status {res.status}")
    parts = [f"Error: {why}"] + ([err] if err else []) + ([f"stdout:\n{res.stdout.rstrip()}"] if res.stdout.strip() else [])
    return "\n".join(parts)


def make_python_tool(*, timeout_s: float = DEFAULTS["timeout_s"], memory_mb: int = DEFAULTS["memory_mb"],
                     output_bytes: int = DEFAULTS["output_bytes"], backend: str = DEFAULTS["backend"],
                     url: str | None = None, max_concurrent: int = DEFAULTS["max_concurrent"],
                     wait_s: float = DEFAULTS["wait_s"]) -> Callable[[str], str]:
    """A ``python(code: str) -> str`` tool with these sandbox limits (see :func:`rlvr.sandbox.run`).

    Args:
        timeout_s: wall-clock seconds per run.
        memory_mb: address-space limit, MiB.
        output_bytes: cap on stdout and on stderr, each, in bytes.
        backend: ``auto``, ``bwrap``, ``local`` or ``http``.
        url: the ``http`` backend's service (default ``$RLVR_SANDBOX_URL``).
        max_concurrent: programs of this tool running at once, over every thread of the process
            (each tool made here has its own cap; the built-in ``python`` is one per process).
        wait_s: seconds a call beyond the cap waits for a free slot before it returns an
            ``Error:`` message saying so (``0``: do not wait).

    Returns:
        A function named ``python`` (its tool name) whose docstring gives its JSON schema. Limits are
        checked when it runs: a bad one comes back as an ``Error:`` message, like any sandbox fault.

    Raises:
        ValueError: ``max_concurrent`` is not an integer >= 1 or ``wait_s`` is not a number >= 0.
    """
    if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1:
        raise ValueError(f"python tool: max_concurrent must be an integer >= 1, got {max_concurrent!r}")
    if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not 0 <= wait_s < float("inf"):
        raise ValueError(f"python tool: wait_s must be a number of seconds >= 0, got {wait_s!r}")
    slots = threading.BoundedSemaphore(max_concurrent)

    def python(code: str) -> str:
        """Run a Python 3 program and return what it printed (stdout), or the error and its traceback.

        Only the standard library is available; there is no network and no state between calls.
        Use print() to show results.

        Args:
            code: the complete Python program to run, e.g. "import math\\nprint(math.factorial(20))".
        """
        from rlvr.sandbox import run

        if not isinstance(code, str):
            return f'Error: "code" must be a string (the program\'s text), got {type(code).__name__}'
        if not slots.acquire(timeout=wait_s):
            return (f"Error: too many programs at once: {max_concurrent} python calls are already running "
                    f"(max_concurrent={max_concurrent}) and none finished within {wait_s:g} s; "
                    "make fewer calls at a time")
        try:
            res = run(code, timeout_s=timeout_s, memory_mb=memory_mb, output_bytes=output_bytes,
                      backend=backend, url=url)
        except Exception as exc:  # noqa: BLE001 - a sandbox fault is a tool message, never a crash
            return f"Error: the sandbox could not run the program: {type(exc).__name__}: {exc}"
        finally:
            slots.release()
        return describe_result(res, timeout_s, memory_mb, output_bytes)

    return python


python = make_python_tool()
"""The built-in ``python`` tool (``env.tools=[python]``), with :data:`DEFAULTS`."""
TOOLS.register("python")(python)

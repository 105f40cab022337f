"""Calling environment methods safely: plain or async, under a deadline, with faults counted.

An environment is user code. A method that raises, hangs past the episode's wall-clock deadline,
returns the wrong type, or is called after the episode is done must end *that* episode (finish reason
``error`` or ``timeout``, reward 0) and never the run: :func:`call_many` runs each call in its own
daemon thread (so a hung call is abandoned, and never blocks the process from exiting), waits until
the call's deadline, and turns every failure into an :class:`EnvFault`. :class:`FaultLog` counts them
and warns once per (class, method, kind), naming both.

Source: issue 26 "Bad input and faults"; daemon threads rather than a pool because a pool's workers
are joined at interpreter exit, so one hung ``step`` would hang the whole run's exit (interpretation).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from rlvr.envs.base import Step

__all__ = ["EnvFault", "FaultLog", "call_many", "check_messages", "check_step", "timed_calls"]


@dataclass
class EnvFault:
    """A failed environment call: ``kind`` is ``"error"`` (raised, wrong type, stepped after done) or
    ``"timeout"``; ``text`` says what happened."""

    kind: str
    text: str


def _run(fn: Callable[..., Any], args: tuple) -> Any:
    out = fn(*args)
    if inspect.isawaitable(out):  # an async method: run its coroutine on this thread's own loop
        out = asyncio.run(_await(out))
    return out


async def _await(aw: Any) -> Any:
    return await aw


def timed_calls(calls: Sequence[tuple[Callable[..., Any], tuple, float]]) -> list[tuple[Any, float]]:
    """Run ``fn(*args)`` for each ``(fn, args, deadline)`` concurrently; a coroutine result is awaited.

    Args:
        calls: the callable, its arguments and its absolute deadline (``time.monotonic()`` seconds;
            ``math.inf`` = none).

    Returns:
        Per call, ``(result, seconds it ran)``; the result is an :class:`EnvFault` for a call that
        raised (``error``, with the exception's type and text) or was still running at its deadline
        (``timeout``: its thread is left running, abandoned).
    """
    results: list[Any] = [None] * len(calls)
    took = [0.0] * len(calls)
    done = [threading.Event() for _ in calls]

    def worker(i: int, fn: Callable[..., Any], args: tuple) -> None:
        t = time.monotonic()
        try:
            results[i] = _run(fn, args)
        except BaseException as exc:  # noqa: BLE001 - user code may raise anything
            results[i] = EnvFault("error", f"raised {type(exc).__name__}: {str(exc)[:300]}")
        finally:
            took[i] = time.monotonic() - t
            done[i].set()

    if len(calls) == 1 and calls[0][2] == math.inf:  # no deadline: no thread needed
        worker(0, calls[0][0], calls[0][1])
        return [(results[0], took[0])]
    start = time.monotonic()
    for i, (fn, args, _) in enumerate(calls):
        threading.Thread(target=worker, args=(i, fn, args), daemon=True, name=f"rlvr-env-{i}").start()
    for i, (_, _, deadline) in enumerate(calls):
        left = None if deadline == math.inf else max(0.0, deadline - time.monotonic())
        if not done[i].wait(left):
            results[i] = EnvFault("timeout", "still running at its deadline (env.timeout_s)")
            took[i] = time.monotonic() - start
    return list(zip(results, took))


def call_many(calls: Sequence[tuple[Callable[..., Any], tuple, float]]) -> list[Any]:
    """:func:`timed_calls` without the durations: per call its result or an :class:`EnvFault`."""
    return [r for r, _ in timed_calls(calls)]


def check_messages(out: Any) -> str | None:
    """None when ``out`` is a list of chat messages (dicts with string ``role`` and ``content``), else
    what was expected and what came."""
    if not isinstance(out, list):
        return f"expected a list of chat messages (dicts with 'role' and 'content'), got {type(out).__name__}"
    for j, m in enumerate(out):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            return (f"expected a list of chat messages (dicts with str 'role' and 'content'); item {j} is "
                    f"{type(m).__name__}: {str(m)[:80]}")
    return None


def check_step(out: Any) -> str | None:
    """None when ``out`` is a well-formed :class:`Step`, else what was expected and what came."""
    if not isinstance(out, Step):
        return f"expected rlvr.envs.Step(observation, reward, done, ...), got {type(out).__name__}"
    try:
        r = float(out.reward)
    except (TypeError, ValueError):
        return f"expected Step.reward to be a number, got {type(out.reward).__name__}"
    if not math.isfinite(r):
        return f"expected a finite Step.reward, got {out.reward!r}"
    if out.info is not None and not isinstance(out.info, dict):
        return f"expected Step.info to be a dict or None, got {type(out.info).__name__}"
    if out.done:
        return None
    return check_messages(out.observation)


@dataclass
class FaultLog:
    """Counts of failed environment calls, and a warning once per (class, method, kind).

    Attributes:
        errors / timeouts: failed calls since the log was made.
        by_kind: ``"Class.method/kind"`` → count.
    """

    errors: int = 0
    timeouts: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    def record(self, env: Any, method: str, fault: EnvFault) -> None:
        """Count ``fault`` of ``env.method`` and warn the first time this (class, method, kind) fails."""
        if fault.kind == "timeout":
            self.timeouts += 1
        else:
            self.errors += 1
        key = f"{type(env).__name__}.{method}/{fault.kind}"
        self.by_kind[key] = self.by_kind.get(key, 0) + 1
        if self.by_kind[key] == 1:
            warnings.warn(
                f"environment {type(env).__module__}.{type(env).__name__}.{method} failed ({fault.kind}): "
                f"{fault.text}; the episode ends with reward 0 and the run continues (further such failures "
                "are counted in env/errors and env/timeouts, not warned about)",
                stacklevel=3,
            )

"""Wall-clock accumulators for the benchmark scripts: wrap a function so its calls add up their seconds.

Imported by the scripts in this folder (``python benchmarks/<script>.py`` puts the folder on ``sys.path``).
Timings are for benchmarks only, never test assertions.
"""

from __future__ import annotations

import time
from typing import Any, Callable, MutableMapping


def timed(fn: Callable[..., Any], acc: MutableMapping[str, float], key: str) -> Callable[..., Any]:
    """``fn`` wrapped so that every call that returns adds its wall seconds (``time.perf_counter``) to
    ``acc[key]`` (which must exist); the result is passed through."""

    def wrapper(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        r = fn(*a, **k)
        acc[key] += time.perf_counter() - t
        return r

    return wrapper


def time_engine_forwards(eng: Any, acc: MutableMapping[str, float]) -> None:
    """Wrap an :class:`rlvr.engines.hf.HFEngine`'s ``_forward`` so that each call adds to ``acc``:
    ``prefill_s`` (calls of more than one position), or ``decode_fwd_s``, ``decode_steps`` and ``rows_steps``
    (one new token per row); missing keys start at 0."""
    for k in ("prefill_s", "decode_fwd_s", "decode_steps", "rows_steps"):
        acc.setdefault(k, 0)
    forward = eng._forward

    def wrapper(ids, mask, pos, cache):
        t = time.perf_counter()
        r = forward(ids, mask, pos, cache)
        dt = time.perf_counter() - t
        if ids.shape[1] > 1:
            acc["prefill_s"] += dt
        else:
            acc["decode_fwd_s"] += dt
            acc["decode_steps"] += 1
            acc["rows_steps"] += ids.shape[0]
        return r

    eng._forward = wrapper

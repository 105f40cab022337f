"""Does this CPU run bf16 matmuls natively? The probe behind ``model.dtype=auto`` on a CPU, and the machine
description every benchmark prints.

How the probe decides (:func:`probe_cpu_bf16`, once per machine and torch build): the CPU's feature flags first
(``/proc/cpuinfo``: ``avx512_bf16`` or ``amx_bf16`` on x86, ``bf16`` on ARM). Without them the answer is "not
native", with no timing. Where they claim native bf16, a matmul timing must confirm it, so a flag the torch
build cannot use never makes a run slower: interleaved bf16/fp32 pairs of ``torch.mm`` on one thread, at 256³,
512³ and 1024³ (5 pairs each, each timing the best of 3 calls; a size whose median is already beyond twice the
margin ends it early), and the **median** bf16/fp32 rate ratio decides with a margin (:func:`bf16_verdict`):
``>= 1.2`` → native; anything lower → not (``<= 1/1.2`` clearly, the band between is reported as undecided and
resolved to fp32, the exact precision, where bf16 brings no clear speed-up). One thread, interleaving and the
median make other processes' load cancel out of the ratio; the margin keeps a machine near 1.0 from flipping.
Without readable flags (macOS, Windows) the timing alone decides.

The verdict is cached (:mod:`rlvr.precision.cache`: ``~/.cache/rlvr/precision/``, or under ``$RLVR_CACHE_DIR``,
keyed by CPU model, flags and torch version), so every later process on the machine reads it instead of
timing, and it is memoised per process. ``torch.backends.cpu.get_cpu_capability()`` is reported alongside but
cannot decide: torch 2.13 names only the vector ISA (``AVX2``, ``AVX512``), not bf16 support. The environment
variable ``RLVR_CPU_BF16=1`` / ``=0`` overrides the probe and its cache (tests use it to exercise both branches
on one machine); ``RLVR_CPU_FLAGS="flag flag ..."`` replaces the flags read from ``/proc/cpuinfo`` (a test
hook: it lets a test take the timing path on a CPU without bf16 flags).

:mod:`rlvr.precision` turns the verdict into a policy and re-exports the public names here.

Source: the issue-15 measurement (bf16 matmuls ~4x faster than fp32 on an AVX-512-bf16 EPYC, ~46x slower
on an AVX2 one); interpretation: the margin and the one-thread interleaved median are issue 30's rule,
documented in ``docs/precision.md``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Any, Iterator

import torch

__all__ = [
    "BF16_MIN_SPEEDUP",
    "ENV_OVERRIDE",
    "FLAGS_ENV",
    "CpuBf16Probe",
    "bf16_verdict",
    "check_environment",
    "cpu_description",
    "forced_cpu_bf16",
    "matmul_rates",
    "model_matmul_rates",
    "probe_cpu_bf16",
]

ENV_OVERRIDE = "RLVR_CPU_BF16"
"""``1`` / ``0``: override the probe and its cache."""

@dataclass(frozen=True)
class CpuBf16Probe:
    """What :func:`probe_cpu_bf16` found.

    Attributes:
        native: bf16 matmuls are native (and, where timed, at least :data:`BF16_MIN_SPEEDUP` times faster).
        method: how it was decided: ``"override"``, ``"flags"`` (no bf16 flags: no timing),
            ``"flags+timing"``, ``"timing"`` (no readable flags) or ``"cache"`` (an earlier process's
            ``flags+timing`` / ``timing`` verdict, read from the machine's cache).
        reason: one human-readable line (flags seen, timing ratio, the rule, where it is cached).
        flags: the bf16-related CPU flags found (empty when none or unreadable).
        capability: ``torch.backends.cpu.get_cpu_capability()`` (e.g. ``"AVX2"``).
        bf16_over_fp32: median bf16 / fp32 matmul rate ratio (``None`` when not timed).
        cache_path: the cache file the verdict was read from or written to (None when not cached).
    """

    native: bool
    method: str
    reason: str
    flags: tuple[str, ...] = ()
    capability: str = ""
    bf16_over_fp32: float | None = None
    cache_path: str | None = None


FLAGS_ENV = "RLVR_CPU_FLAGS"
"""Test hook: a space-separated flag list used instead of ``/proc/cpuinfo``'s (e.g. ``"avx2 avx512_bf16"``)."""

BF16_MIN_SPEEDUP = 1.2
"""``auto`` picks bf16 on a CPU only where bf16 matmuls are at least this many times faster than fp32."""

FP32_CLEAR_RATIO = 1 / BF16_MIN_SPEEDUP
"""At or below this ratio fp32 is clearly faster; between it and :data:`BF16_MIN_SPEEDUP` is undecided (→ fp32)."""

PROBE_SIZES: tuple[int, ...] = (256, 512, 1024)
PROBE_PAIRS = 5
PROBE_CALLS = 3


def _cpu_flags() -> set[str] | None:
    """CPU feature flags from ``/proc/cpuinfo`` (x86 ``flags``, ARM ``Features``), or None if unreadable."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        return None
    return None


def _cpu_model_name() -> str:
    """``/proc/cpuinfo``'s ``model name`` (x86), else ``platform.processor()`` or the machine type."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _bf16_flags(flags: set[str]) -> tuple[str, ...]:
    return tuple(sorted(f for f in flags if f in ("avx512_bf16", "amx_bf16", "bf16")))


def _mm_operands(m: int, k: int, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ``[m, k]`` and ``[k, n]`` operands in ``dtype``, already multiplied once (the warm-up: oneDNN
    primitive creation). From a private generator: timing never moves torch's global RNG (a run's seeded stream)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=g).to(dtype), torch.randn(k, n, generator=g).to(dtype)
    torch.mm(a, b)
    return a, b


def _best_of(a: torch.Tensor, b: torch.Tensor, repeats: int) -> float:
    """Best-of-``repeats`` wall seconds of ``torch.mm(a, b)``: the one timing loop behind the probe and every
    benchmark's matmul rate."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return best


def _best_mm_seconds(m: int, k: int, n: int, dtype: torch.dtype, repeats: int) -> float:
    """Best-of-``repeats`` wall seconds of ``torch.mm`` ``[m, k] @ [k, n]`` in ``dtype``, after one warm-up call."""
    return _best_of(*_mm_operands(m, k, n, dtype), repeats)


def _bf16_speed_ratio(sizes: tuple[int, ...] = PROBE_SIZES, pairs: int = PROBE_PAIRS,
                      repeats: int = PROBE_CALLS) -> float:
    """Median bf16 / fp32 matmul rate ratio (> 1: bf16 is faster) over interleaved pairs, on one thread.

    Per size ``n`` (``n³`` products, operands warmed up once), ``pairs`` pairs of :func:`_best_of` timings,
    the pair's order alternating (fp32 first, then bf16 first) so a drift in load hits both dtypes alike;
    after each size the median over all pairs so far ends the measurement when it is beyond twice the margin
    either way (< ``FP32_CLEAR_RATIO / 2`` or > ``2 * BF16_MIN_SPEEDUP``), so a CPU whose bf16 is emulated
    (~30x slower) costs one small size. One thread: the ratio is the kernels' (bf16 support), and a
    single-threaded GEMM does not wait on the slowest of several threads when other processes load the
    cores. The previous thread count is restored.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ratios: list[float] = []
    try:
        for n in sizes:
            ops = {dt: _mm_operands(n, n, n, dt) for dt in (torch.float32, torch.bfloat16)}
            for i in range(pairs):
                order = (torch.float32, torch.bfloat16) if i % 2 == 0 else (torch.bfloat16, torch.float32)
                t = {dt: _best_of(*ops[dt], repeats) for dt in order}
                ratios.append(t[torch.float32] / t[torch.bfloat16])
            med = statistics.median(ratios)
            if med < FP32_CLEAR_RATIO / 2 or med > 2 * BF16_MIN_SPEEDUP:
                break
    finally:
        torch.set_num_threads(threads)
    return statistics.median(ratios)


def bf16_verdict(ratio: float) -> tuple[bool, str]:
    """The decision rule on a measured median bf16/fp32 ratio: ``(native, rule text)``.

    ``ratio >= BF16_MIN_SPEEDUP`` (1.2) → bf16; ``ratio <= FP32_CLEAR_RATIO`` (1/1.2) → fp32, clearly; in
    between → fp32 too, reported as undecided: bf16 brings no clear speed-up there, and fp32 is exact
    (engine and trainer agree to float noise, docs/precision.md). Interpretation: issue 30's margin, so
    that a machine measuring near 1.0 does not flip between commands.
    """
    if ratio >= BF16_MIN_SPEEDUP:
        return True, f">= {BF16_MIN_SPEEDUP:g}: bf16"
    if ratio <= FP32_CLEAR_RATIO:
        return False, f"<= 1/{BF16_MIN_SPEEDUP:g}: fp32, bf16 is slower in this torch build"
    return False, (f"undecided (between 1/{BF16_MIN_SPEEDUP:g} and {BF16_MIN_SPEEDUP:g}): fp32, the default "
                   "where bf16 is not clearly faster")


@functools.lru_cache(maxsize=None)
def _probe_hardware(flags_env: str | None = None, cache_dir: str | None = None) -> CpuBf16Probe:
    """The hardware verdict, memoised per process for each (``RLVR_CPU_FLAGS``, ``RLVR_CACHE_DIR``) value."""
    import rlvr.precision.cache as precision_cache

    cap = torch.backends.cpu.get_cpu_capability()
    flags = set(flags_env.split()) if flags_env is not None else _cpu_flags()
    found = _bf16_flags(flags) if flags is not None else ()
    if flags is not None and not found:
        return CpuBf16Probe(False, "flags", f"CPU flags have no avx512_bf16/amx_bf16/bf16 (torch capability {cap})",
                            (), cap)
    seen = (f"CPU flags {'/'.join(found)} (torch capability {cap})" if flags is not None
            else f"no readable CPU flags (torch capability {cap})")
    key = precision_cache.probe_key(_cpu_model_name(), flags, torch.__version__, cap)
    hit = precision_cache.read_verdict(key)
    if hit is None:
        with precision_cache.probe_lock(key):
            hit = precision_cache.read_verdict(key)  # another process may have decided while this one waited
            if hit is None:
                return _measure_and_store(key, seen, found, cap, "flags+timing" if flags is not None else "timing")
    path = str(precision_cache.verdict_path(key))
    return CpuBf16Probe(hit["native"], "cache", f"{seen}; {hit.get('summary', '')} (measured {hit.get('decided_at', '?')}, "
                        f"cached in {path}; delete it to measure again)", found, cap, hit.get("bf16_over_fp32"), path)


def _measure_and_store(key: dict[str, Any], seen: str, found: tuple[str, ...], cap: str, method: str) -> CpuBf16Probe:
    """Time the ratio, apply :func:`bf16_verdict`, write the cache; the probe for this process."""
    import rlvr.precision.cache as precision_cache

    ratio = _bf16_speed_ratio()
    native, rule = bf16_verdict(ratio)
    summary = f"bf16 matmul {ratio:.2f}x fp32 (median, 1 thread), {rule}"
    path, why = precision_cache.write_verdict(key, {
        "native": native, "bf16_over_fp32": round(ratio, 4), "summary": summary, "method": method,
        "rule": {"bf16_min_speedup": BF16_MIN_SPEEDUP, "sizes": list(PROBE_SIZES), "pairs": PROBE_PAIRS},
        "decided_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    where = f"cached in {path}" if path is not None else f"not cached ({why})"
    return CpuBf16Probe(native, method, f"{seen}; {summary}; {where}", found, cap, ratio,
                        str(path) if path is not None else None)


def check_environment() -> str | None:
    """The ``RLVR_CPU_BF16`` override (``"0"``/``"1"``), or None when unset or empty; the CLI calls this
    with the config checks, before any model loads.

    Raises:
        rlvr.errors.EnvVarError: any other value (a ``ValueError`` and a configuration error, exit 2).
    """
    from rlvr.errors import EnvVarError

    env = os.environ.get(ENV_OVERRIDE)
    if env in (None, ""):
        return None
    if env not in ("0", "1"):
        raise EnvVarError(f"{ENV_OVERRIDE} must be 0 or 1 (or unset), got {env!r}")
    return env


def probe_cpu_bf16() -> CpuBf16Probe:
    """Whether this CPU runs bf16 matmuls natively (see the module docstring for the method).

    ``RLVR_CPU_BF16=1`` (or ``0``) overrides the hardware probe and its cache; the hardware result is
    memoised per process and cached per machine (:mod:`rlvr.precision.cache`).

    Raises:
        rlvr.errors.EnvVarError: ``RLVR_CPU_BF16`` is set to something other than ``0`` or ``1``.
    """
    env = check_environment()
    if env is not None:
        return CpuBf16Probe(env == "1", "override", f"{ENV_OVERRIDE}={env} (override of the CPU probe)",
                            capability=torch.backends.cpu.get_cpu_capability())
    from rlvr.precision.cache import CACHE_ENV

    return _probe_hardware(os.environ.get(FLAGS_ENV), os.environ.get(CACHE_ENV))


# --------------------------------------------------------------------------------------------------
# machine description for benchmarks


def cpu_description() -> dict[str, Any]:
    """CPU model name, torch's capability string, the bf16-related flags and the probe's verdict."""
    name = _cpu_model_name()
    flags = _cpu_flags()
    vec = sorted(f for f in (flags or ()) if f.startswith(("avx512", "amx")) or f in ("avx2", "avx"))
    probe = probe_cpu_bf16()
    return {"model": name, "capability": torch.backends.cpu.get_cpu_capability(), "vector_flags": vec,
            "bf16_flags": list(_bf16_flags(flags or set())), "native_bf16": probe.native, "probe": probe.reason,
            "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "torch": torch.__version__}


def matmul_rates(m: int = 512, k: int = 576, n: int = 1536, repeats: int = 3,
                 dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)) -> dict[str, float]:
    """GFLOP/s of ``torch.mm`` ``[m, k] @ [k, n]`` per dtype (best of ``repeats`` after a warm-up).

    The default shape is issue 15's (SmolLM2's hidden → MLP projection over 512 rows).

    Returns:
        ``{"float32": GFLOP/s, "bfloat16": GFLOP/s}`` (keys: the dtype names).
    """
    return {str(dt).removeprefix("torch."): 2 * m * k * n / _best_mm_seconds(m, k, n, dt, repeats) / 1e9 for dt in dtypes}


def model_matmul_rates(hidden: int, inter: int, rows: int = 4096, repeats: int = 5,
                       dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """GFLOP/s of ``torch.mm`` in ``dtype`` on a decoder's own projection shapes over ``rows`` tokens.

    Shapes: ``hidden_to_inter`` ``[rows, hidden] @ [hidden, inter]``, ``inter_to_hidden``
    ``[rows, inter] @ [inter, hidden]``, ``hidden_to_hidden`` ``[rows, hidden] @ [hidden, hidden]``; each
    best of ``repeats`` after a warm-up (2·m·k·n FLOPs per product).

    Returns:
        The three rates plus ``best`` (their maximum: the rate a step's compute floor divides by).
    """
    shapes = {"hidden_to_inter": (rows, hidden, inter), "inter_to_hidden": (rows, inter, hidden),
              "hidden_to_hidden": (rows, hidden, hidden)}
    out = {name: matmul_rates(m, k, n, repeats, (dtype,))[str(dtype).removeprefix("torch.")]
           for name, (m, k, n) in shapes.items()}
    out["best"] = max(out.values())
    return out


@contextlib.contextmanager
def forced_cpu_bf16(native: bool) -> Iterator[None]:
    """Context manager that sets ``RLVR_CPU_BF16`` (restored afterwards) — for scripts and tests."""
    old = os.environ.get(ENV_OVERRIDE)
    os.environ[ENV_OVERRIDE] = "1" if native else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV_OVERRIDE, None)
        else:
            os.environ[ENV_OVERRIDE] = old

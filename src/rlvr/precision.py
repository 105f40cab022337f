"""The precision policy: which dtype the weights are stored in, which dtype the matmuls run in.

``model.dtype`` names a mode; :func:`resolve_precision` turns it into a :class:`PrecisionPolicy` that the
model loader, the trainer's forward passes and the generation engine all follow:

=============  =================  ===================  ==========================================
mode           master weights     matmuls              log-softmax, loss, optimizer state
=============  =================  ===================  ==========================================
``fp32``       float32            float32              float32
``bf16``       float32            bfloat16 (autocast)  float32
``bf16-pure``  bfloat16           bfloat16             float32 log-softmax; optimizer state bf16
``bf16-master`` bfloat16 weights,  bfloat16             float32 log-softmax; float32 gradient accumulation,
               float32 masters                         optimizer state and master copy in the optimizer
``fp16-pure``  float16            float16              as ``bf16-pure`` (kept for old configs)
``auto``       ``bf16`` where bf16 matmuls are native (CUDA with bf16; a CPU with ``avx512_bf16``,
               AMX or ARM ``bf16``), ``fp32`` elsewhere
=============  ==========================================================================

Generation follows the same policy: under ``bf16``, ``bf16-pure`` and ``bf16-master`` the engine decodes with
bfloat16 weights (:attr:`PrecisionPolicy.generation_dtype`; under ``bf16-master`` the model's own), under ``fp32``
with float32 ones. ``bf16-master`` (:mod:`rlvr.trainer.master_weights`) runs ``bf16-pure``'s forward and backward
(no autocast, no per-micro-batch weight cast) while the optimizer keeps fp32 masters: the fast mode on a CPU with
native bf16 (issue 28); not under ``torchrun``, where ``bf16`` with FSDP2 does the same.

How ``auto`` decides on a CPU (:func:`probe_cpu_bf16`, once per machine and torch build): the CPU's feature
flags first (``/proc/cpuinfo``: ``avx512_bf16`` or ``amx_bf16`` on x86, ``bf16`` on ARM). Without them the
answer is ``fp32``, with no timing. Where they claim native bf16, a matmul timing must confirm it, so a flag
the torch build cannot use never makes a run slower: interleaved bf16/fp32 pairs of ``torch.mm`` on one
thread, at 256³, 512³ and 1024³ (5 pairs each, each timing the best of 3 calls; a size whose median is
already beyond twice the margin ends it early), and the **median** bf16/fp32 rate ratio decides with a
margin: ``>= 1.2`` → ``bf16``; anything lower → ``fp32`` (``<= 1/1.2`` clearly, the band between is
reported as undecided and resolved to ``fp32``, the exact precision, where bf16 brings no clear speed-up).
One thread, interleaving and the median make other processes' load cancel out of the ratio; the margin
keeps a machine near 1.0 from flipping. Without readable flags (macOS, Windows) the timing alone decides.
The verdict is cached (:mod:`rlvr.precision_cache`: ``~/.cache/rlvr/precision/``, or under
``$RLVR_CACHE_DIR``, keyed by CPU model, flags and torch version), so every later process on the machine
reads it instead of timing, and it is memoised per process.
``torch.backends.cpu.get_cpu_capability()`` is reported alongside but cannot decide: torch 2.13 names
only the vector ISA (``AVX2``, ``AVX512``), not bf16 support. The environment variable
``RLVR_CPU_BF16=1`` / ``=0`` overrides the probe and its cache (tests use it to exercise both branches on
one machine); ``RLVR_CPU_FLAGS="flag flag ..."`` replaces the flags read from ``/proc/cpuinfo`` (a test
hook: it lets a test take the timing path on a CPU without bf16 flags).

A run records the precision it resolved (:mod:`rlvr.precision_record`: ``precision.json`` in every
checkpoint and ``final/``); ``--resume`` and ``rlvr eval --checkpoint`` under ``model.dtype=auto`` follow
the recording (:func:`rlvr.precision_record.follow_recorded_precision`), so a run keeps one precision on any machine.

Source: the mixed-precision recipe of Micikevicius et al. (2018, "Mixed Precision Training", §3: fp32
master weights, reduced-precision arithmetic, fp32 accumulation of reductions), as torch's autocast and
FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` implement it; the issue-15
measurement (bf16 matmuls ~4x faster than fp32 on an AVX-512-bf16 EPYC, ~46x slower on an AVX2 one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

__all__ = [
    "PRECISION_MODES",
    "CpuBf16Probe",
    "PrecisionPolicy",
    "canonical_precision",
    "cpu_description",
    "autocast_for",
    "matmul_rates",
    "model_matmul_rates",
    "model_precision",
    "precision_label",
    "bf16_verdict",
    "probe_cpu_bf16",
    "resolve_precision",
    "set_model_precision",
]

PRECISION_MODES: tuple[str, ...] = ("auto", "fp32", "bf16", "bf16-pure", "bf16-master", "fp16-pure")
"""Values of ``model.dtype``."""

_ALIASES = {"float32": "fp32", "bfloat16": "bf16-pure", "float16": "fp16-pure", "fp16": "fp16-pure"}
"""Older spellings (torch dtype names, as ``model.dtype`` took before the policy): loading weights in
that dtype, i.e. the pure modes."""

ENV_OVERRIDE = "RLVR_CPU_BF16"
_DTYPE = {"fp32": torch.float32, "bf16": torch.float32, "bf16-pure": torch.bfloat16, "bf16-master": torch.bfloat16,
          "fp16-pure": torch.float16}
_COMPUTE = {"fp32": torch.float32, "bf16": torch.bfloat16, "bf16-pure": torch.bfloat16, "bf16-master": torch.bfloat16,
            "fp16-pure": torch.float16}


def canonical_precision(mode: str) -> str:
    """The canonical spelling of a ``model.dtype`` value (``float32`` → ``fp32``, ``bfloat16`` → ``bf16-pure``).

    Raises:
        ValueError: not one of :data:`PRECISION_MODES` or their aliases (the message lists them).
    """
    m = str(mode).strip().lower()
    m = _ALIASES.get(m, m)
    if m not in PRECISION_MODES:
        raise ValueError(
            f"unknown precision {mode!r}: expected one of {', '.join(PRECISION_MODES)} "
            f"(or {', '.join(_ALIASES)})"
        )
    return m


# --------------------------------------------------------------------------------------------------
# probing the CPU


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
    from rlvr import precision_cache

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
    from rlvr import precision_cache

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
    memoised per process and cached per machine (:mod:`rlvr.precision_cache`).

    Raises:
        rlvr.errors.EnvVarError: ``RLVR_CPU_BF16`` is set to something other than ``0`` or ``1``.
    """
    env = check_environment()
    if env is not None:
        return CpuBf16Probe(env == "1", "override", f"{ENV_OVERRIDE}={env} (override of the CPU probe)",
                            capability=torch.backends.cpu.get_cpu_capability())
    from rlvr.precision_cache import CACHE_ENV

    return _probe_hardware(os.environ.get(FLAGS_ENV), os.environ.get(CACHE_ENV))


# --------------------------------------------------------------------------------------------------
# the policy


@dataclass(frozen=True)
class PrecisionPolicy:
    """A resolved precision: what every part of a run uses.

    Attributes:
        mode: ``"fp32"``, ``"bf16"``, ``"bf16-pure"``, ``"bf16-master"`` or ``"fp16-pure"`` (never ``"auto"``).
        requested: the ``model.dtype`` it was resolved from (e.g. ``"auto"``).
        device_type: ``"cpu"`` or ``"cuda"`` (the autocast device type).
        reason: why this mode (one line; logged once per process).
        param_dtype: dtype of the model's stored weights (and of their gradients); also of the optimizer state,
            except under ``bf16-master`` (:attr:`master_weights`), whose optimizer keeps fp32 masters.
        compute_dtype: dtype the matmuls run in (the autocast target under ``bf16``).
        reduce_dtype: dtype for gradient reductions across ranks (always float32; for FSDP2's
            ``MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=reduce_dtype)``).
        probe: the CPU probe behind an ``auto`` decision on CPU, else None.
        lm_head_fp32: the LM head's matmul runs in float32 on both sides, from float32 operands (the hidden
            states upcast, the master weight), with autocast off: the trainer's chunked log-softmax
            (:mod:`rlvr.trainer.forward`) and the HF engine's next-token logits. Config
            ``cast_lm_head_to_fp32`` (TRL's ``GRPOConfig`` name). Only changes anything under ``bf16`` and
            the pure modes; the logits are then not rounded to bf16 (a quantum of 0.06-0.125 at logit
            magnitudes of 8-32; ``benchmarks/logprob_agreement.py`` measures what it changes).
        generation_autocast: under ``bf16``, the HF engine decodes from the float32 master weights under the
            same autocast as the trainer's forward (its matmuls in bf16, norms and the residual stream in
            float32), instead of from a bf16 copy of the weights. Config ``generation_autocast``.
    """

    mode: str
    requested: str = "auto"
    device_type: str = "cpu"
    reason: str = ""
    param_dtype: torch.dtype = torch.float32
    compute_dtype: torch.dtype = torch.float32
    reduce_dtype: torch.dtype = torch.float32
    probe: CpuBf16Probe | None = field(default=None, compare=False)
    lm_head_fp32: bool = False
    generation_autocast: bool = False

    @property
    def autocast(self) -> bool:
        """True for ``bf16``: forward passes run under ``torch.autocast(device_type, bfloat16)``."""
        return self.mode == "bf16"

    @property
    def master_weights(self) -> bool:
        """True for ``bf16-master``: the optimizer keeps fp32 master copies of the bf16 weights and accumulates
        their gradients in fp32 (:class:`rlvr.trainer.master_weights.MasterWeightAdamW`)."""
        return self.mode == "bf16-master"

    @property
    def generation_dtype(self) -> torch.dtype:
        """dtype of the weights the engine decodes with (bf16 under ``bf16`` and ``bf16-pure``; the master
        weights' dtype under ``bf16`` with :attr:`generation_autocast`, which decodes them under autocast)."""
        return self.param_dtype if self.decodes_under_autocast else self.compute_dtype

    @property
    def decodes_under_autocast(self) -> bool:
        """True when the HF engine decodes from the master weights inside :meth:`autocast_context`."""
        return self.autocast and self.generation_autocast

    def with_switches(self, *, lm_head_fp32: bool = False, generation_autocast: bool = False) -> "PrecisionPolicy":
        """This policy with :attr:`lm_head_fp32` and :attr:`generation_autocast` set (``model.cast_lm_head_to_fp32``,
        ``model.generation_autocast``); a new object, the policy is frozen."""
        return dataclasses.replace(self, lm_head_fp32=bool(lm_head_fp32), generation_autocast=bool(generation_autocast))

    def autocast_context(self) -> contextlib.AbstractContextManager:
        """``torch.autocast(device_type, dtype=bfloat16)`` under ``bf16``, else a no-op context.

        The training forward (and its backward) runs inside it; rlvr's LM head computes the log-softmax
        in float32 regardless (:mod:`rlvr.core.logprobs`), and the loss is float32 elementwise math.
        """
        if not self.autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.compute_dtype)

    def fsdp_mixed_precision_kwargs(self) -> dict[str, torch.dtype]:
        """Keyword arguments for FSDP2's ``MixedPrecisionPolicy`` that implement this policy.

        ``bf16`` → ``{"param_dtype": bfloat16, "reduce_dtype": float32}`` (sharded fp32 master weights,
        bf16 compute copies, fp32 gradient reduction); every other mode → ``{}`` (FSDP keeps the
        parameters' own dtype). Autocast in the forward stays harmless under it (bf16 inputs are not
        cast again).
        """
        if self.mode != "bf16":
            return {}
        return {"param_dtype": self.compute_dtype, "reduce_dtype": self.reduce_dtype}

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable summary (mode, requested, device, reason, dtypes, probe)."""
        out: dict[str, Any] = {
            "mode": self.mode, "requested": self.requested, "device_type": self.device_type, "reason": self.reason,
            "param_dtype": str(self.param_dtype).removeprefix("torch."),
            "compute_dtype": str(self.compute_dtype).removeprefix("torch."),
            "lm_head_fp32": self.lm_head_fp32, "generation_autocast": self.generation_autocast,
        }
        if self.probe is not None:
            out["probe"] = {"native": self.probe.native, "method": self.probe.method, "flags": list(self.probe.flags),
                            "capability": self.probe.capability, "bf16_over_fp32": self.probe.bf16_over_fp32,
                            "cache_path": self.probe.cache_path}
        return out


_LOGGED: set[tuple[str, str, str]] = set()


def _log_once(policy: PrecisionPolicy) -> None:
    key = (policy.requested, policy.mode, policy.reason)
    if key in _LOGGED:
        return
    _LOGGED.add(key)
    print(f"rlvr: precision {policy.mode} (model.dtype={policy.requested}, {policy.device_type}): {policy.reason}",
          file=sys.stderr)


def resolve_precision(requested: str = "auto", device: torch.device | str | None = None, *,
                      native_bf16: bool | None = None, log: bool = True) -> PrecisionPolicy:
    """Resolve a ``model.dtype`` value into a :class:`PrecisionPolicy` for ``device``; log it once.

    Args:
        requested: a :data:`PRECISION_MODES` value or alias.
        device: where the model runs (default CPU). Only its type matters.
        native_bf16: bypass the probe (True/False) — for callers that already know; tests prefer the
            ``RLVR_CPU_BF16`` variable, which goes through the same path as a real run.
        log: print the decision to stderr the first time it is made in this process.

    Returns:
        The policy. ``auto`` → ``bf16`` on CUDA when ``torch.cuda.is_bf16_supported()``, on a CPU when
        :func:`probe_cpu_bf16` finds native bf16; ``fp32`` otherwise. Explicit modes are kept as asked
        (``bf16`` on a CPU without native bf16 says in its reason that matmuls will be slow).

    Raises:
        ValueError: an unknown mode or a bad ``RLVR_CPU_BF16`` value.
    """
    req = canonical_precision(requested)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    dtype_kind = "cuda" if dev.type == "cuda" else "cpu"
    probe = None
    if req == "auto":
        if dtype_kind == "cuda":
            ok = native_bf16 if native_bf16 is not None else torch.cuda.is_bf16_supported()
            mode = "bf16" if ok else "fp32"
            reason = "CUDA device with bf16 support" if ok else "CUDA device without bf16 support"
        else:
            if native_bf16 is not None:
                probe = CpuBf16Probe(native_bf16, "argument", f"native_bf16={native_bf16} given by the caller")
            else:
                probe = probe_cpu_bf16()
            mode = "bf16" if probe.native else "fp32"
            reason = ("native bf16: " if probe.native else "no native bf16: ") + probe.reason
    else:
        mode = req
        reason = "requested"
        if mode in ("bf16", "bf16-pure", "bf16-master") and dtype_kind == "cpu":
            p = probe_cpu_bf16() if native_bf16 is None else CpuBf16Probe(native_bf16, "argument", "")
            if not p.native:
                reason = f"requested, although this CPU has no native bf16 (bf16 matmuls will be slow: {p.reason})"
    policy = PrecisionPolicy(mode=mode, requested=str(requested), device_type=dtype_kind, reason=reason,
                             param_dtype=_DTYPE[mode], compute_dtype=_COMPUTE[mode], probe=probe)
    if log:
        _log_once(policy)
    return policy


# --------------------------------------------------------------------------------------------------
# the policy travels with the model

_ATTR = "rlvr_precision"


def resolve_model_precision(model_cfg: Any, device: torch.device | str | None = None) -> PrecisionPolicy:
    """A model section's precision: ``model_cfg.dtype`` resolved for ``device``
    (:func:`resolve_precision`) with the section's two agreement switches, ``cast_lm_head_to_fp32`` and
    ``generation_autocast`` (:meth:`PrecisionPolicy.with_switches`; absent attributes read as off). The one
    place a run turns its config into a policy, so the CLI, :func:`rlvr.models.load_policy` and a trainer
    built from Python agree (interpretation: issue 24 item 6, "resolve precision once").

    Raises:
        ValueError: an unknown mode or a bad ``RLVR_CPU_BF16`` value (:func:`resolve_precision`).
    """
    return resolve_precision(model_cfg.dtype, device).with_switches(
        lm_head_fp32=getattr(model_cfg, "cast_lm_head_to_fp32", False),
        generation_autocast=getattr(model_cfg, "generation_autocast", False))


def set_model_precision(model: Any, policy: PrecisionPolicy | None) -> None:
    """Attach ``policy`` to ``model`` (attribute ``rlvr_precision``; None detaches).

    Every training-side forward (:func:`rlvr.trainer.forward.completion_logprobs`, which the update, the
    behaviour / reference log-probs, replay and FBOS-RL's passes all go through) and every
    :class:`rlvr.engines.hf.HFEngine` built without an explicit ``precision`` read it from the model, so a
    policy set once (by :func:`rlvr.models.load_policy` or the trainer) holds on every path; a
    ``deepcopy`` (the reference model) keeps it.
    """
    if policy is None:
        if _ATTR in getattr(model, "__dict__", {}):
            delattr(model, _ATTR)
        return
    object.__setattr__(model, _ATTR, policy)


def model_precision(model: Any) -> PrecisionPolicy | None:
    """The policy attached by :func:`set_model_precision`, or None (the model runs in its own dtype)."""
    p = getattr(model, _ATTR, None)
    return p if isinstance(p, PrecisionPolicy) else None


def precision_label(model: Any) -> str:
    """The precision ``model`` runs at, for result files: its policy's mode (:func:`model_precision`), else
    the canonical name of its parameters' dtype (``fp32``, ``bf16-pure``, ``fp16-pure``; another dtype's torch
    name; ``"unknown"`` without parameters)."""
    p = model_precision(model)
    if p is not None:
        return p.mode
    param = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    if param is None:
        return "unknown"
    names = {torch.float32: "fp32", torch.bfloat16: "bf16-pure", torch.float16: "fp16-pure"}
    return names.get(param.dtype, str(param.dtype).removeprefix("torch."))


def autocast_for(model: Any) -> contextlib.AbstractContextManager:
    """The autocast context of ``model``'s policy (a no-op context without a policy or outside ``bf16``)."""
    p = model_precision(model)
    return p.autocast_context() if p is not None else contextlib.nullcontext()


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


def main(argv: list[str] | None = None) -> int:
    """``python -m rlvr.precision [--json]``: print what ``model.dtype=auto`` resolves to on this CPU (one word,
    or the probe as JSON), measuring and caching the verdict if this machine has none yet. ``make demo``
    pins its three commands to that word."""
    import json

    args = sys.argv[1:] if argv is None else argv
    policy = resolve_precision("auto", "cpu", log=False)
    print(json.dumps(policy.as_dict()) if "--json" in args else policy.mode)
    return 0


if __name__ == "__main__":
    sys.exit(main())

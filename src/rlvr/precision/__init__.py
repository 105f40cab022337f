"""Precision: which dtype a run's weights, matmuls and generation use, and how that is decided and recorded.

* :mod:`rlvr.precision.policy` — ``model.dtype`` → :class:`PrecisionPolicy` (master / compute / generation
  dtypes), attached to the model so every forward and the engine follow it;
* :mod:`rlvr.precision.probe` — does this CPU run bf16 matmuls natively (flags, then a timing), the machine
  description the benchmarks print;
* :mod:`rlvr.precision.cache` — the per-machine cache of the probe's verdict;
* :mod:`rlvr.precision.record` — ``precision.json`` in every checkpoint, followed by ``--resume`` and ``rlvr eval``;
* :mod:`rlvr.precision.dtype_account` — a dispatch mode counting matmul FLOPs, casts and vocabulary passes per
  dtype (benchmarks only; nothing in the library calls it).

The package re-exports the policy's names and the probe's (``from rlvr.precision import resolve_precision``);
``python -m rlvr.precision [--json]`` prints what ``model.dtype=auto`` picks here. Layer 0 of
``docs/architecture.md``: imports only torch, ``rlvr.errors`` and ``rlvr.util``. Page: ``docs/precision.md``.
"""

from rlvr.precision.policy import (
    BF16_MIN_SPEEDUP,
    ENV_OVERRIDE,
    FLAGS_ENV,
    PRECISION_MODES,
    CpuBf16Probe,
    PrecisionPolicy,
    autocast_for,
    bf16_verdict,
    canonical_precision,
    check_environment,
    cpu_description,
    forced_cpu_bf16,
    main,
    matmul_rates,
    model_matmul_rates,
    model_precision,
    precision_label,
    probe_cpu_bf16,
    resolve_model_precision,
    resolve_precision,
    set_model_precision,
)

__all__ = [
    "BF16_MIN_SPEEDUP", "ENV_OVERRIDE", "FLAGS_ENV", "PRECISION_MODES", "CpuBf16Probe", "PrecisionPolicy",
    "autocast_for", "bf16_verdict", "canonical_precision", "check_environment", "cpu_description", "forced_cpu_bf16",
    "main", "matmul_rates", "model_matmul_rates", "model_precision", "precision_label", "probe_cpu_bf16",
    "resolve_model_precision", "resolve_precision", "set_model_precision",
]

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
``auto``       on CUDA with bf16: ``bf16``; on a CPU whose probe finds native bf16 (``avx512_bf16``,
               AMX or ARM ``bf16``): ``bf16-master`` (``bf16`` under ``torchrun``); ``fp32`` elsewhere
=============  ==========================================================================

Generation follows the same policy: under ``bf16``, ``bf16-pure`` and ``bf16-master`` the engine decodes with
bfloat16 weights (:attr:`PrecisionPolicy.generation_dtype`; under ``bf16-master`` the model's own), under ``fp32``
with float32 ones. ``bf16-master`` (:mod:`rlvr.trainer.master_weights`) runs ``bf16-pure``'s forward and backward
(no autocast, no per-micro-batch weight cast) while the optimizer keeps fp32 masters: the fast mode on a CPU with
native bf16 (issue 28); not under ``torchrun``, where ``bf16`` with FSDP2 does the same.

How ``auto`` decides on a CPU is :mod:`rlvr.precision.probe`'s business (feature flags, then a matmul timing
with a margin, cached per machine); its public names (:func:`probe_cpu_bf16`, :class:`CpuBf16Probe`,
:func:`cpu_description`, :func:`matmul_rates`, ...) are re-exported here.

A run records the precision it resolved (:mod:`rlvr.precision.record`: ``precision.json`` in every
checkpoint and ``final/``); ``--resume`` and ``rlvr eval --checkpoint`` under ``model.dtype=auto`` follow
the recording (:func:`rlvr.precision.record.follow_recorded_precision`), so a run keeps one precision on any machine.

Source: the mixed-precision recipe of Micikevicius et al. (2018, "Mixed Precision Training", §3: fp32
master weights, reduced-precision arithmetic, fp32 accumulation of reductions), as torch's autocast and
FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` implement it; the issue-15
measurement (bf16 matmuls ~4x faster than fp32 on an AVX-512-bf16 EPYC, ~46x slower on an AVX2 one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from rlvr.precision.probe import (  # re-exported: the probe's public names
    BF16_MIN_SPEEDUP,
    ENV_OVERRIDE,
    FLAGS_ENV,
    CpuBf16Probe,
    bf16_verdict,
    check_environment,
    cpu_description,
    forced_cpu_bf16,
    matmul_rates,
    model_matmul_rates,
    probe_cpu_bf16,
)

__all__ = [
    "BF16_MIN_SPEEDUP",
    "ENV_OVERRIDE",
    "FLAGS_ENV",
    "PRECISION_MODES",
    "check_environment",
    "forced_cpu_bf16",
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
    "resolve_model_precision",
    "resolve_precision",
    "set_model_precision",
]

PRECISION_MODES: tuple[str, ...] = ("auto", "fp32", "bf16", "bf16-pure", "bf16-master", "fp16-pure")
"""Values of ``model.dtype``."""

_ALIASES = {"float32": "fp32", "bfloat16": "bf16-pure", "float16": "fp16-pure", "fp16": "fp16-pure"}
"""Older spellings (torch dtype names, as ``model.dtype`` took before the policy): loading weights in
that dtype, i.e. the pure modes."""

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
        The policy. ``auto`` → ``bf16`` on CUDA when ``torch.cuda.is_bf16_supported()``; ``bf16-master`` on a
        CPU when :func:`probe_cpu_bf16` finds native bf16 (``bf16`` when ``WORLD_SIZE`` > 1, see
        :func:`_cpu_auto`); ``fp32`` otherwise. Explicit modes are kept as asked
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
            mode, reason = _cpu_auto(probe)
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


def _cpu_auto(probe: CpuBf16Probe) -> tuple[str, str]:
    """``(mode, reason)`` of ``auto`` on a CPU given its bf16 ``probe``: ``bf16-master`` where bf16 is native
    (``bf16`` when ``WORLD_SIZE`` > 1: master weights are one process only), else ``fp32``.

    Source: issue 39 item 1 (docs/precision.md, "bf16-master"): on native-bf16 CPUs ``bf16-master`` updates as
    fast as ``bf16`` (no per-micro-batch weight cast) and its trainer log-probs agree about 9x better with the
    engine's (both run the same bf16 weights), so ``auto`` prefers it.
    """
    import os

    if not probe.native:
        return "fp32", "no native bf16: " + probe.reason
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        world = 1
    if world > 1:
        return "bf16", (f"native bf16: {probe.reason}; bf16 (autocast over fp32 masters), not bf16-master, "
                        f"because master weights are single-process and WORLD_SIZE={world}")
    return "bf16-master", (f"native bf16: {probe.reason}; bf16-master (bf16 weights and matmuls, fp32 masters "
                           "in the optimizer: as fast as bf16 and closer to the engine's log-probs)")


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


def main(argv: list[str] | None = None) -> int:
    """``python -m rlvr.precision [--json]``: print what ``model.dtype=auto`` resolves to on this CPU (one word,
    or the probe as JSON), measuring and caching the verdict if this machine has none yet. ``make demo``
    pins its three commands to that word."""
    import json

    args = sys.argv[1:] if argv is None else argv
    policy = resolve_precision("auto", "cpu", log=False)
    print(json.dumps(policy.as_dict()) if "--json" in args else policy.mode)
    return 0


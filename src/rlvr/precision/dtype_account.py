"""A dispatch-level account of where a computation's work runs in bf16 and where in fp32.

:class:`DtypeAccount` is a ``TorchDispatchMode``: every aten op that reaches the dispatcher below autograd
and autocast (so the casts autocast inserts, and the backward's ops, are seen as they execute) is recorded
per op overload name:

* **matmul FLOPs per dtype**, from the operands' shapes (:func:`matmul_flops`: ``mm``, ``addmm``, ``bmm``,
  ``baddbmm``, ``matmul``, ``linear`` and the scaled-dot-product-attention kernels, forward and backward);
* **bytes touched per dtype** by every other op that is not a view (inputs read + outputs written);
* **casts** (``_to_copy``, ``copy_`` and each pair of a ``_foreach_copy_`` between two floating dtypes): bytes
  converted per direction, and for casts whose source is a *weight* (identified by its storage), how many
  times each weight is converted per micro-batch;
* **passes over full-vocabulary tensors**: non-matmul ops with an input or output whose last dimension is
  the vocabulary size, or a transposed view of such a tensor (the LM head's log-softmax, its gradient, the casts of its
  logits).

Micro-batches are found without hooks in the trainer: an op runs in a backward pass when autograd has a
current graph task (``torch._C._current_graph_task_id() != -1``); a *segment* starts at the first forward op
after a backward, and a segment that contains a backward is one micro-batch (forward + its backward). The
forward-only tail (gradient clipping, the optimizer step) is reported as ``outside``.

Source: interpretation (issue 28: find where a bf16 update loses its matmul rate on any machine, without
timing): the same dispatch-mode mechanism as ``torch.utils.flop_counter.FlopCounterMode``, with the
attention FLOPs counted as in its ``sdpa_flop_count`` (``QKᵀ`` and ``PV``, no causal discount; the backward
as twice the forward).
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter, defaultdict
from typing import Any, Iterable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["DtypeAccount", "account_updates", "format_account", "matmul_flops"]

_SDPA_FWD = {
    "aten._scaled_dot_product_flash_attention_for_cpu", "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_cudnn_attention",
    "aten.scaled_dot_product_attention", "aten._scaled_dot_product_fused_attention_overrideable",
}
_SDPA_BWD = {name + "_backward" for name in _SDPA_FWD if name != "aten.scaled_dot_product_attention"}
_SDPA_BLHE = {"aten._flash_attention_forward", "aten._efficient_attention_forward"}  # [B, L, H, E] layouts
_MATMULS = {"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.matmul", "aten.linear"}
_CASTS = {"aten._to_copy", "aten.copy_", "aten.copy"}
_NO_TRAFFIC = {"aten._local_scalar_dense", "aten.lift_fresh", "aten.detach", "aten.alias"}


def _dims(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def _sdpa_flops(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blhe: bool = False) -> int:
    """``2·B·H·L·S·E + 2·B·H·L·S·Ev``: ``Q Kᵀ`` and ``P V`` of attention over ``[B, H, L, E]`` queries."""
    if blhe:
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    *batch, L, E = _dims(q)
    S, Ev = k.shape[-2], v.shape[-1]
    bh = math.prod(batch)
    return 2 * bh * L * S * E + 2 * bh * L * S * Ev


def matmul_flops(op: str, args: tuple, out: Any = None) -> int | None:
    """FLOPs of one matmul-family op call from its operands' shapes, or None for any other op.

    Args:
        op: the op packet name, e.g. ``"aten.mm"`` (``str(func.overloadpacket)``).
        args: the op's positional arguments as dispatched.
        out: its output (used by ``matmul`` and ``linear``: ``2 · out.numel() · K``).

    Returns:
        ``mm`` ``[m,k]@[k,n]``: ``2mkn``; ``addmm`` (bias, a, b): the same (the bias add not counted);
        ``bmm``/``baddbmm`` ``[b,m,k]@[b,k,n]``: ``2bmkn``; attention forward (``q [B,H,L,E]``,
        ``k [B,H,S,E]``, ``v [B,H,S,Ev]``): ``2BHLS(E + Ev)``, its backward twice that. None when ``op`` is
        not a matmul.

    Source: the usual 2-FLOPs-per-multiply-add convention (as ``torch.utils.flop_counter``).
    """
    if op in ("aten.mm", "aten.bmm"):
        a, b = args[0], args[1]
        return 2 * math.prod(_dims(a)) * b.shape[-1]
    if op in ("aten.addmm", "aten.baddbmm"):
        a, b = args[1], args[2]
        return 2 * math.prod(_dims(a)) * b.shape[-1]
    if op in ("aten.matmul", "aten.linear"):
        k = args[0].shape[-1]
        return 2 * out.numel() * k if isinstance(out, torch.Tensor) else None
    if op in _SDPA_FWD or op in _SDPA_BLHE:
        return _sdpa_flops(args[0], args[1], args[2], blhe=op in _SDPA_BLHE)
    if op in _SDPA_BWD:
        return 2 * _sdpa_flops(args[1], args[2], args[3])
    return None


def _dt(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _layout(t: torch.Tensor) -> str:
    """``N`` (row-major), ``T`` (a transposed view: column-major) or ``S`` (other strides) of a 2-d operand."""
    if t.dim() != 2 or t.stride(-1) == 1:
        return "N"
    return "T" if t.stride(0) == 1 else "S"


def _tensors(x: Any) -> Iterable[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


class _Segment:
    """What one stretch of ops (a micro-batch's forward and backward, or a forward-only tail) recorded."""

    def __init__(self) -> None:
        self.has_backward = False
        self.weight_casts: Counter[str] = Counter()
        self.matmul_flops: Counter[str] = Counter()
        self.vocab_passes = 0
        self.cast_bytes = 0


class DtypeAccount(TorchDispatchMode):
    """Records per op overload the matmul FLOPs and bytes per dtype, the casts and the full-vocabulary passes.

    Use as a context manager around the code to account (``with DtypeAccount(params=..., vocab_size=V) as acc:``),
    then read :meth:`summary` (a JSON-serialisable dict) or :func:`format_account`.

    Args:
        params: ``{name: tensor}`` of the weights to identify as cast sources (e.g.
            ``dict(model.named_parameters())``); tied weights (one storage) are reported under their names
            joined by ``=``.
        vocab_size: ``V``; non-matmul ops that read or write a ``[..., V]`` tensor (more than one row) count
            as full-vocabulary passes (None: not counted).

    Source: see the module docstring (interpretation, issue 28).
    """

    def __init__(self, params: dict[str, torch.Tensor] | None = None, vocab_size: int | None = None) -> None:
        super().__init__()
        names: dict[int, list[str]] = defaultdict(list)
        for name, p in (params or {}).items():
            names[p.untyped_storage().data_ptr()].append(name)
        self._weights = {ptr: "=".join(n) for ptr, n in names.items()}
        self.vocab_size = vocab_size
        self.ops: dict[str, dict[str, Any]] = {}
        self.casts: dict[str, dict[str, int]] = {}
        self.vocab: dict[str, dict[str, int]] = {}
        self.segments: list[_Segment] = [_Segment()]
        self.layouts: Counter[str] = Counter()

    # ------------------------------------------------------------------ recording
    def _segment(self, backward: bool) -> _Segment:
        seg = self.segments[-1]
        if not backward and seg.has_backward:
            seg = _Segment()
            self.segments.append(seg)
        seg.has_backward |= backward
        return seg

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            self._record(func, args, kwargs, out)
        except Exception as e:  # the account must never break the computation it watches
            self.ops.setdefault("<account errors>", {"calls": 0, "last": ""})
            self.ops["<account errors>"]["calls"] += 1
            self.ops["<account errors>"]["last"] = f"{func}: {e!r}"
        return out

    def _record(self, func, args, kwargs, out) -> None:
        name = str(func.overloadpacket)
        if func.is_view or name in _NO_TRAFFIC or name.startswith("profiler."):
            return
        backward = torch._C._current_graph_task_id() != -1
        seg = self._segment(backward)
        phase = "backward" if backward else "forward"
        ins = [t for t in _tensors(list(args) + list(kwargs.values()))]
        outs = list(_tensors(out))
        rec = self.ops.setdefault(str(func), {"calls": 0, "flops": Counter(), "bytes": Counter(),
                                              "phase_calls": Counter()})
        rec["calls"] += 1
        rec["phase_calls"][phase] += 1
        flops = matmul_flops(name, args, out)
        if flops is not None:
            dt = _dt(args[1] if name in ("aten.addmm", "aten.baddbmm") or name in _SDPA_BWD else args[0])
            rec["flops"][dt] += flops
            seg.matmul_flops[dt] += flops
            if name in ("aten.mm", "aten.addmm"):
                a, b = (args[0], args[1]) if name == "aten.mm" else (args[1], args[2])
                self.layouts[f"{dt} {_layout(a)}{_layout(b)}"] += flops
            return
        if name in _CASTS and self._cast(name, args, out, seg):
            return
        if name == "aten._foreach_copy_" and len(args) >= 2:  # e.g. bf16-master's masters -> weights, one op
            pairs = list(zip(args[0], args[1]))
            if [self._cast("aten.copy_", (d, s), None, seg) for d, s in pairs].count(True) == len(pairs):
                return
        floats = [t for t in outs + ins if t.is_floating_point()]
        dt = _dt(floats[0]) if floats else "other"
        nbytes = sum(t.nbytes for t in ins + outs)
        rec["bytes"][dt] += nbytes
        if any(self._vocab_sized(t) for t in outs + ins):
            self._vocab(str(func), nbytes, seg)

    def _vocab_sized(self, t: torch.Tensor) -> bool:
        """``t`` is a full-vocabulary activation: ``[..., V]`` with more than one row, or the transposed view
        ``[V, c]`` of one (stride 1 along ``V``; a ``[V, H]`` weight is row-major and does not count)."""
        V = self.vocab_size
        if not V or t.dim() == 0 or t.numel() <= V:
            return False
        return t.shape[-1] == V or (t.dim() == 2 and t.shape[0] == V and t.stride(0) == 1)

    def _vocab(self, op: str, nbytes: int, seg: _Segment) -> None:
        v = self.vocab.setdefault(op, {"calls": 0, "bytes": 0})
        v["calls"] += 1
        v["bytes"] += nbytes
        seg.vocab_passes += 1

    def _cast(self, name: str, args: tuple, out: Any, seg: _Segment) -> bool:
        """Record a float-to-float cast; False when the op is not one (same dtype, or not floating)."""
        if name == "aten._to_copy":
            src, dst = args[0], out
        else:
            dst, src = args[0], args[1]
        if not (isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor)):
            return False
        if src.dtype == dst.dtype or not (src.is_floating_point() and dst.is_floating_point()):
            return False
        key = f"{_dt(src)}->{_dt(dst)}"
        c = self.casts.setdefault(key, {"calls": 0, "elements": 0, "bytes_read": 0, "bytes_written": 0,
                                        "weight_calls": 0, "weight_bytes_read": 0})
        c["calls"] += 1
        c["elements"] += src.numel()
        c["bytes_read"] += src.nbytes
        c["bytes_written"] += dst.nbytes
        seg.cast_bytes += src.nbytes + dst.nbytes
        weight = self._weights.get(src.untyped_storage().data_ptr())
        if weight is not None:
            c["weight_calls"] += 1
            c["weight_bytes_read"] += src.nbytes
            seg.weight_casts[weight] += 1
        if weight is None and self._vocab_sized(dst):
            self._vocab(f"{name} {key}", src.nbytes + dst.nbytes, seg)
        return True

    # ------------------------------------------------------------------ reading
    def summary(self) -> dict[str, Any]:
        """The account as a JSON-serialisable dict.

        Keys: ``matmul_flops`` (``{dtype: FLOPs}``), ``matmul_bf16_fraction`` (bf16 FLOPs over all matmul
        FLOPs; None without matmuls), ``micro_batches``, ``weight_casts_per_micro_batch`` (one
        ``{weight: conversions}`` per micro-batch), ``max_weight_casts_per_micro_batch`` (``{weight: max}``
        and ``"__max__"``), ``weight_casts_outside`` (forward-only segments), ``casts`` (per direction:
        calls, elements, bytes), ``vocab_passes`` (per op: calls, bytes), ``vocab_passes_per_micro_batch``,
        ``bytes_by_dtype`` (non-matmul, non-cast ops), ``matmul_layouts`` (``mm``/``addmm`` FLOPs per
        ``"<dtype> <layout of a><layout of b>"``, ``N`` row-major, ``T`` transposed: the backward's
        weight-gradient products are ``T``-shaped, which some bf16 kernels handle slower), ``ops`` (per op overload: calls, FLOPs and bytes per
        dtype, calls per phase).
        """
        mm: Counter[str] = Counter()
        by_dtype: Counter[str] = Counter()
        ops = {}
        for op, r in self.ops.items():
            if "flops" not in r:
                ops[op] = dict(r)
                continue
            mm.update(r["flops"])
            by_dtype.update(r["bytes"])
            ops[op] = {"calls": r["calls"], "flops": dict(r["flops"]), "bytes": dict(r["bytes"]),
                       "phase_calls": dict(r["phase_calls"])}
        total = sum(mm.values())
        micro = [s for s in self.segments if s.has_backward]
        per_micro = [dict(s.weight_casts) for s in micro]
        mx: dict[str, int] = {}
        for d in per_micro:
            for k, v in d.items():
                mx[k] = max(mx.get(k, 0), v)
        mx["__max__"] = max(mx.values(), default=0)
        outside: Counter[str] = Counter()
        for s in self.segments:
            if not s.has_backward:
                outside.update(s.weight_casts)
        return {
            "matmul_flops": dict(mm), "matmul_bf16_fraction": (mm["bfloat16"] / total) if total else None,
            "micro_batches": len(micro), "weight_casts_per_micro_batch": per_micro,
            "max_weight_casts_per_micro_batch": mx, "weight_casts_outside": dict(outside),
            "casts": self.casts, "cast_bytes_per_micro_batch": [s.cast_bytes for s in micro],
            "vocab_passes": self.vocab, "vocab_passes_per_micro_batch": [s.vocab_passes for s in micro],
            "bytes_by_dtype": dict(by_dtype), "matmul_layouts": dict(self.layouts), "ops": ops,
        }


@contextlib.contextmanager
def account_updates(trainer: Any, account: DtypeAccount) -> Iterator[DtypeAccount]:
    """Record every optimizer update ``trainer`` runs inside the block (and nothing else: not generation,
    scoring or logging) into ``account``.

    ``trainer`` is a :class:`rlvr.trainer.trainer.Trainer` (duck-typed: its ``_update(step)`` method, the one
    that runs ``policy_update``, is wrapped on the instance and restored afterwards).
    """
    orig = trainer._update

    def recorded(step):
        with account:
            return orig(step)

    trainer._update = recorded
    try:
        yield account
    finally:
        del trainer._update  # the instance attribute; the class's method is visible again


def _si(x: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} "


def format_account(s: dict[str, Any], top: int = 12) -> str:
    """A plain-text table of :meth:`DtypeAccount.summary`: matmul FLOPs per op and dtype, the casts, the weight
    conversions per micro-batch, the full-vocabulary passes and the ops that move the most bytes."""
    lines = [f"micro-batches: {s['micro_batches']}"]
    frac = s["matmul_bf16_fraction"]
    lines.append("matmul FLOPs: " + ", ".join(f"{k} {_si(v)}FLOP" for k, v in sorted(s["matmul_flops"].items()))
                 + (f"  (bf16 share {frac:.1%})" if frac is not None else ""))
    lines.append(f"{'op (matmul)':<62}{'calls':>7}{'bf16 FLOP':>13}{'fp32 FLOP':>13}")
    for op, r in sorted(s["ops"].items(), key=lambda kv: -sum(kv[1].get("flops", {}).values())):
        f = r.get("flops", {})
        if f:
            lines.append(f"{op:<62}{r['calls']:>7}{_si(f.get('bfloat16', 0)):>13}{_si(f.get('float32', 0)):>13}")
    lines.append("mm FLOPs by operand layout (N row-major, T transposed): " + ", ".join(
        f"{k} {_si(v)}FLOP" for k, v in sorted(s.get("matmul_layouts", {}).items(), key=lambda kv: -kv[1])))
    lines.append(f"{'cast':<24}{'calls':>7}{'bytes read':>13}{'of weights':>13}")
    for k, c in sorted(s["casts"].items()):
        lines.append(f"{k:<24}{c['calls']:>7}{_si(c['bytes_read']) + 'B':>13}{_si(c['weight_bytes_read']) + 'B':>13}")
    mx = s["max_weight_casts_per_micro_batch"]
    worst = sorted(((v, k) for k, v in mx.items() if k != "__max__"), reverse=True)[:5]
    lines.append(f"weight conversions per micro-batch: max {mx['__max__']}"
                 + ("; most: " + ", ".join(f"{k} {v}" for v, k in worst) if worst else ""))
    lines.append(f"full-vocabulary passes per micro-batch: {s['vocab_passes_per_micro_batch']}")
    for op, v in sorted(s["vocab_passes"].items(), key=lambda kv: -kv[1]["bytes"]):
        lines.append(f"  {op:<60}{v['calls']:>7}{_si(v['bytes']) + 'B':>13}")
    lines.append("bytes of other ops by dtype: " + ", ".join(f"{k} {_si(v)}B" for k, v in
                                                           sorted(s["bytes_by_dtype"].items(), key=lambda kv: -kv[1])))
    heavy = sorted(((sum(r.get("bytes", {}).values()), op, r) for op, r in s["ops"].items() if r.get("bytes")),
                   key=lambda x: -x[0])[:top]
    lines.append(f"{'op (most bytes)':<62}{'calls':>7}{'bf16 B':>13}{'fp32 B':>13}")
    for total, op, r in heavy:
        b = r["bytes"]
        lines.append(f"{op:<62}{r['calls']:>7}{_si(b.get('bfloat16', 0)):>13}{_si(b.get('float32', 0)):>13}")
    return "\n".join(lines)

"""Memory-bounded log-probabilities and entropy of sampled tokens (``docs/grpo.md`` §4, §8).

:func:`selective_log_softmax_and_entropy` applies the LM head (``hidden @ weight.T + bias``) to
``chunk_size`` tokens at a time, so at most ``chunk_size × V`` logits exist at once — in the forward
pass **and** in the backward pass: a custom autograd function saves only the inputs and one
log-sum-exp per token, and recomputes each chunk's logits during backward (the trade-off of fused
linear-cross-entropy kernels: one extra ``[chunk, H] × [H, V]`` matmul per chunk, no ``[n, V]`` activations).

Numerics: logits are computed in the input dtype (in bfloat16 under ``torch.autocast``) and the softmax in
at least float32. Under autocast the weight and the hidden states are converted to the autocast dtype
**once per call** and those copies serve every chunk's matmul, forward and backward (autocast itself would
convert the weight per chunk and again in the backward: issue 28's dtype account counted 2–9 conversions
of the LM-head weight per micro-batch); the backward's two matmuls share one conversion of the logits'
gradient. The values are those autocast gives (the same roundings, done once); gradients accumulate in
float32. With bfloat16 inputs and no autocast (``bf16-pure``) all three matmuls run in bfloat16 too (the
weight-gradient product used to upcast to float32). At temperature 1 the logits are not multiplied by ``1/T``
(exact: ``x · 1 = x``).

Speed: when all ``n × V`` log-probabilities of a call fit in ``keep_bytes`` (default 256 MiB: a training
micro-batch of ≤ 1 024 completion tokens at a 49 k vocabulary), the forward keeps its chunks' ``log p`` for
the backward instead of recomputing the logits there — one ``[n, H] × [H, V]`` matmul less per call (≈ 6 % of
a SmolLM2-135M training step's FLOPs), the same numbers bit for bit (the backward's recomputation repeats the
forward's very operations). Larger calls keep the bounded-memory recompute.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

__all__ = ["KEEP_LOGITS_BYTES", "entropy_from_logits", "selective_log_softmax_and_entropy"]

KEEP_LOGITS_BYTES = 256 * 2**20
"""Default budget of :func:`selective_log_softmax_and_entropy` for keeping a call's ``[n, V]`` log-probs
between forward and backward (bytes); 0 always recomputes them in the backward."""


def entropy_from_logits(logits: torch.Tensor, *, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of ``softmax(logits / temperature)`` over the last dimension.

    Args:
        logits: ``[..., V]`` unnormalised log-probabilities; ``−inf`` entries (masked vocabulary) are
            allowed and contribute 0.
        temperature: ``> 0``.

    Returns:
        ``[...]`` entropy in nats, ``0 <= H <= log V``; dtype at least float32. Differentiable.

    Raises:
        ValueError: ``temperature <= 0`` or ``logits`` is 0-d.

    Source: grpo_core.md §8 (``H = −Σ_v p_v log p_v``, ``p = softmax(z / logprob_temperature)``).
    """
    if logits.dim() == 0:
        raise ValueError("entropy_from_logits: logits must have a vocabulary dimension [..., V]")
    if not temperature > 0:
        raise ValueError(f"entropy_from_logits: temperature must be > 0, got {temperature}")
    dt = torch.promote_types(logits.dtype, torch.float32)
    z = logits.to(dt) / temperature
    logp = torch.log_softmax(z, dim=-1)
    p = logp.exp()
    return -torch.where(p > 0, p * logp, torch.zeros((), dtype=dt, device=z.device)).sum(dim=-1)


def _chunk_logits(hidden, weight, bias, inv_temp, s, e, dt):
    """Fresh ``[c, V]`` tensor of scaled logits (callers may overwrite it in place); ``inv_temp`` None: all 1."""
    z = (hidden[s:e] @ weight.t()).to(dt)  # [c, V]; a new tensor, so the updates below can be in place
    if bias is not None:
        z.add_(bias)
    return z if inv_temp is None else z.mul_(inv_temp[s:e, None])


def _autocast_copy(t: torch.Tensor | None, device_type: str) -> torch.Tensor | None:
    """``t`` in the autocast dtype when autocast is on for ``device_type`` and would cast it (floating, not
    float64), else ``t`` itself: the one conversion the head's matmuls share (forward chunks and backward)."""
    if t is None or not torch.is_autocast_enabled(device_type) or not t.is_floating_point() or t.dtype == torch.float64:
        return t
    return t.to(torch.get_autocast_dtype(device_type))


class _ChunkedLMHeadLogProb(torch.autograd.Function):
    """logp[n], entropy[n] of ``target`` under ``softmax((hidden @ weight.T + bias) * inv_temp)``."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, inv_temp, chunk_size, with_entropy, entropy_grad, keep_bytes):
        with torch.profiler.record_function("rlvr::lm_head_fwd"):  # a label for profiles; free without one
            return _ChunkedLMHeadLogProb._forward(ctx, hidden, weight, bias, target, inv_temp, chunk_size,
                                                  with_entropy, entropy_grad, keep_bytes)

    @staticmethod
    def _forward(ctx, hidden, weight, bias, target, inv_temp, chunk_size, with_entropy, entropy_grad, keep_bytes):
        n = hidden.shape[0]
        dt = torch.promote_types(hidden.dtype, torch.float32)
        dev = hidden.device.type
        # under autocast: convert the weight and the hidden states once, for every chunk and the backward
        # (autocast itself would convert them per chunk, and again in the backward)
        h_c, w_c = _autocast_copy(hidden, dev), _autocast_copy(weight, dev)
        scale = None if bool((inv_temp == 1).all()) else inv_temp  # temperature 1: no pass over [c, V]
        logp = torch.empty(n, dtype=dt, device=hidden.device)
        lse_all = torch.empty(n, dtype=dt, device=hidden.device)
        ent = torch.empty(n if with_entropy else 0, dtype=dt, device=hidden.device)
        # keep each chunk's log p for the backward when they all fit the budget and a gradient is wanted
        keep = any(ctx.needs_input_grad[:3]) and n * weight.shape[0] * dt.itemsize <= keep_bytes
        kept: list[torch.Tensor] = []
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            z = _chunk_logits(h_c, w_c, bias, scale, s, e, dt)  # [c, V]
            lse = torch.logsumexp(z, dim=-1)  # [c]
            lse_all[s:e] = lse
            logp[s:e] = z.gather(1, target[s:e, None]).squeeze(1) - lse
            if with_entropy or keep:  # in place: each pass over [c, V] is memory-bound on a CPU
                lp = z.sub_(lse[:, None])  # log p, exactly what the backward's recomputation produces
                if with_entropy:
                    ent[s:e] = -lp.exp().mul_(lp).nansum(-1)  # p log p; 0 · (−inf) = nan → 0
                if keep:
                    kept.append(lp)
        ctx.kept = kept if keep else None
        ctx.chunk_size = chunk_size
        ctx.dtypes = (hidden.dtype, weight.dtype)
        ctx.unit_temp = scale is None
        ctx.entropy_grad = bool(with_entropy and entropy_grad)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(h_c, w_c, bias, target, inv_temp, lse_all, ent)
        if not ctx.entropy_grad:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    @once_differentiable
    def backward(ctx, g_logp, g_ent):
        """The forward's own operand dtypes (the converted copies under autocast), no autocast of its own:
        every matmul here runs in the forward's compute dtype without converting anything again."""
        with torch.profiler.record_function("rlvr::lm_head_bwd"):
            return _ChunkedLMHeadLogProb._backward(ctx, g_logp, g_ent)

    @staticmethod
    def _backward(ctx, g_logp, g_ent):
        h_c, w_c, bias, target, inv_temp, lse_all, ent = ctx.saved_tensors
        if not ctx.entropy_grad:
            g_ent = None
        n = h_c.shape[0]
        dt = lse_all.dtype
        h_dtype, w_dtype = ctx.dtypes
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        grad_h = torch.zeros(h_c.shape, dtype=h_dtype, device=h_c.device) if need_h else None
        grad_w = torch.zeros(w_c.shape, dtype=dt, device=w_c.device) if need_w else None
        grad_b = None
        if need_b and bias is not None:
            grad_b = torch.zeros(bias.shape, dtype=dt, device=bias.device)
        if g_logp is None and g_ent is None:
            ctx.kept = None
            return grad_h, grad_w, grad_b, None, None, None, None, None, None
        kept, ctx.kept = ctx.kept, None  # once_differentiable: the kept log p may be consumed in place
        scale = None if ctx.unit_temp else inv_temp
        for j, s in enumerate(range(0, n, ctx.chunk_size)):
            e = min(s + ctx.chunk_size, n)
            if kept is not None:
                lp = kept[j]  # [c, V] log p from the forward
            else:
                lp = _chunk_logits(h_c, w_c, bias, scale, s, e, dt).sub_(lse_all[s:e, None])  # [c, V]
            if g_ent is None:  # the common case, fused and in place: gz = (onehot − p) · g / T
                coef = g_logp[s:e].to(dt) * inv_temp[s:e]  # [c]
                gz = lp.exp_().mul_(-coef[:, None])
                gz.scatter_add_(1, target[s:e, None], coef[:, None])
            else:
                g_lp = g_logp[s:e] if g_logp is not None else None
                gz = _grad_logits(lp, target[s:e], g_lp, g_ent[s:e], ent[s:e], inv_temp[s:e], dt)
            if kept is not None:
                kept[j] = None  # free each chunk as soon as it is used
            gzc = gz.to(h_c.dtype)  # one conversion for both matmuls (none in fp32)
            if need_h:
                grad_h[s:e] = gzc @ w_c
            if need_w:
                grad_w += gzc.t() @ h_c[s:e]
            if grad_b is not None:
                grad_b += gz.sum(0)
        if grad_w is not None:
            grad_w = grad_w.to(w_dtype)
        if grad_b is not None:
            grad_b = grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None, None, None


def _grad_logits(lp, target, g_logp, g_ent, ent, inv_temp, dt):
    """``d loss / d z`` ``[c, V]`` of one chunk (``lp``: its ``log p``) when the entropy carries a gradient
    (or only it does).

    ``d logp / dz = onehot − p`` and ``dH / dz_k = −p_k (log p_k + H)``, both times ``1/T``.
    """
    p = lp.exp()
    gz = torch.zeros_like(lp)
    if g_logp is not None:
        g = g_logp.to(dt)
        gz = gz - p * g[:, None]
        gz.scatter_add_(1, target[:, None], g[:, None])
    zero = torch.zeros((), dtype=dt, device=lp.device)
    term = torch.where(p > 0, p * (lp + ent[:, None]), zero)
    gz = gz - g_ent.to(dt)[:, None] * term
    return gz * inv_temp[:, None]


def selective_log_softmax_and_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target_ids: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = True,
    entropy_grad: bool = False,
    keep_bytes: int = KEEP_LOGITS_BYTES,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each target token, and the entropy, through the LM head, chunk by chunk.

    With ``z = (hidden @ weight.T + bias) / temperature`` (``[n, V]``, never materialised beyond
    ``chunk_size`` rows): ``logp[j] = log_softmax(z[j])[target_ids[j]]`` and
    ``entropy[j] = −Σ_v p_v log p_v``.

    Args:
        hidden: ``[n, H]`` final hidden states of the positions that predict the ``n`` targets
            (flatten ``[N, T, H]`` and select masked positions first).
        weight: ``[V, H]`` LM-head weight. bias: ``[V]`` or ``None``.
        target_ids: ``[n]`` long token ids in ``[0, V)``.
        temperature: ``logprob_temperature``, a float ``> 0`` or a ``[n]`` tensor (per token; e.g. each
            sample's temperature repeated over its tokens). No gradient flows to it.
        chunk_size: rows per chunk (``>= 1``); peak logits memory is ``chunk_size × V``.
        with_entropy: compute the entropy (``None`` is returned otherwise).
        entropy_grad: let gradients flow from the entropy to ``hidden``/``weight``/``bias`` (needed only
            for an entropy bonus; otherwise the entropy is returned detached).
        keep_bytes: when the call's whole ``[n, V]`` log-probs (float32) fit in this many bytes and a
            gradient is needed, the forward keeps them for the backward instead of recomputing the
            logits there (same results bit for bit; one LM-head matmul less); 0: always recompute.

    Returns:
        ``(logp, entropy)``: ``[n]`` log-probs (nats, ``<= 0``) and ``[n]`` entropies (nats) or ``None``;
        dtype at least float32. ``logp`` is differentiable w.r.t. ``hidden``, ``weight`` and ``bias``.
        Not twice differentiable.

    Raises:
        ValueError: shapes do not match, a target id is outside ``[0, V)``, ``chunk_size < 1`` or a
            temperature is not ``> 0``.

    Source: grpo_core.md §4 (log-prob temperature, code-precedent TRL/verl) and §8 (entropy over
    vocabulary chunks); the recompute-in-backward scheme is interpretation (as in fused
    linear-cross-entropy kernels, e.g. Liger-Kernel) to keep backward memory bounded too.
    """
    fn = "selective_log_softmax_and_entropy"
    _check_head_inputs(fn, hidden, weight, bias, target_ids, chunk_size)
    dt = torch.promote_types(hidden.dtype, torch.float32)
    inv_temp = _inverse_temperature(fn, temperature, hidden.shape[0], dt, hidden.device)
    logp, ent = _ChunkedLMHeadLogProb.apply(
        hidden, weight, bias, target_ids.long(), inv_temp.contiguous(), int(chunk_size), bool(with_entropy),
        bool(entropy_grad), int(keep_bytes),
    )
    if not with_entropy:
        return logp, None
    return logp, (ent if entropy_grad else ent.detach())


def _check_head_inputs(fn: str, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       target_ids: torch.Tensor, chunk_size: int) -> None:
    """The shape, dtype and range checks of :func:`selective_log_softmax_and_entropy`.

    Raises:
        ValueError: see :func:`selective_log_softmax_and_entropy`.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"{fn}: need hidden [n, H] and weight [V, H], got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    n, V = hidden.shape[0], weight.shape[0]
    if bias is not None and tuple(bias.shape) != (V,):
        raise ValueError(f"{fn}: bias must be [V]=({V},), got {tuple(bias.shape)}")
    if target_ids.dim() != 1 or target_ids.shape[0] != n:
        raise ValueError(f"{fn}: target_ids must be [n]=({n},), got {tuple(target_ids.shape)}")
    if target_ids.is_floating_point():
        raise ValueError(f"{fn}: target_ids must be integer, got {target_ids.dtype}")
    if n and (int(target_ids.min()) < 0 or int(target_ids.max()) >= V):
        lo, hi = int(target_ids.min()), int(target_ids.max())
        raise ValueError(f"{fn}: target_ids must lie in [0, V={V}), got range [{lo}, {hi}]")
    if int(chunk_size) < 1:
        raise ValueError(f"{fn}: chunk_size must be >= 1, got {chunk_size}")


def _inverse_temperature(fn: str, temperature: float | torch.Tensor, n: int, dt: torch.dtype,
                         device: torch.device) -> torch.Tensor:
    """``[n]`` ``1 / temperature`` in ``dt`` on ``device`` from a float or a 0-d / ``[n]`` tensor (detached).

    Raises:
        ValueError: a tensor of another shape, or a temperature that is not ``> 0`` (finite, for a float).
    """
    if torch.is_tensor(temperature):
        temp = temperature.detach().to(device=device, dtype=dt)
        if temp.dim() == 0:
            temp = temp.expand(n)
        if tuple(temp.shape) != (n,):
            raise ValueError(
                f"{fn}: temperature tensor must be [n]=({n},) or 0-d, got {tuple(temperature.shape)}"
            )
        if n and not bool((temp > 0).all()):
            raise ValueError(f"{fn}: temperatures must be > 0")
        return 1.0 / temp
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"{fn}: temperature must be > 0, got {temperature}")
    return torch.full((n,), 1.0 / float(temperature), dtype=dt, device=device)

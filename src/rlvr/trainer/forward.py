"""Per-token log-probs (and entropy) of completion tokens under a model, without full-vocabulary logits.

The transformer body runs on ``context + completion`` rows right-padded to the micro-batch's own
longest row; the LM head then runs only on the hidden states that predict completion tokens, in
chunks (``rlvr.core.logprobs``). This is what keeps a CPU step fast and its memory bounded.

When every row of a micro-batch has the same context (the completions of one group), the context
runs once and its key/value states are reused by every completion (:func:`shared_context_hidden`):
the same values and gradients as separate rows, with the prompt's cost paid once instead of ``G``
times. Under gradient checkpointing (``model.gradient_checkpointing``) a training forward cannot keep
those states (checkpointed layers drop their cache), so such calls run every row in full instead
(:func:`shared_prompt_unavailable`), with a warning that says so; no-grad forwards still share.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import warnings
from typing import Any

import torch

from rlvr.core.logprobs import selective_log_softmax_and_entropy
from rlvr.models.split import decoder_of, lm_head_params, model_forward_hidden
from rlvr.precision import autocast_for, model_precision
from rlvr.types import RolloutBatch


def build_inputs(batch: RolloutBatch, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded model inputs for a (micro-)batch.

    A row's last completion token predicts nothing, so it is not fed: ``L`` is the longest
    ``context + completion − 1`` (exact: a causal model's states before it do not depend on it).

    Returns:
        input_ids: ``[n, L]`` long, ``context + completion`` per row (without the last token of the
            longest rows), ``L`` = longest ``context + completion − 1`` (at least the longest context).
        attention_mask: ``[n, L]`` long.
        pred_pos: ``[n, T]`` long, position of the hidden state that predicts completion token ``t``
            (``len(context) + t − 1``); 0 where the completion mask is 0.
    """
    lengths = batch.completion_lengths.tolist()
    ctx_lens = [len(c) for c in batch.context_ids]
    total = [c + k for c, k in zip(ctx_lens, lengths)]
    n, width = batch.completion_ids.shape
    L = max(max(total) - 1, max(ctx_lens))  # the last completion token of a row is never an input
    input_ids = torch.full((n, L), pad_token_id, dtype=torch.long)
    attn = torch.zeros((n, L), dtype=torch.long)
    pred_pos = torch.zeros((n, width), dtype=torch.long)
    for i, (ctx, k) in enumerate(zip(batch.context_ids, lengths)):
        c = len(ctx)
        input_ids[i, :c] = torch.as_tensor(ctx, dtype=torch.long)
        input_ids[i, c : min(c + k, L)] = batch.completion_ids[i, : min(k, L - c)]
        attn[i, : min(c + k, L)] = 1
        pred_pos[i, :k] = torch.arange(c - 1, c - 1 + k)
    return input_ids, attn, pred_pos


RUNNER_ATTR = "rlvr_forward_runner"
"""Set on an FSDP2-sharded policy (:func:`rlvr.distributed.fsdp.shard_policy`): its root module, through
which every forward here runs so that FSDP gathers the root's parameters (embedding, norm, head)."""


def completion_logprobs(
    model: Any,
    batch: RolloutBatch,
    *,
    pad_token_id: int,
    chunk_size: int = 1024,
    with_entropy: bool = True,
    entropy_grad: bool = False,
    share_prompt: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[n, T]`` of the batch's completion tokens and entropy ``[n, T]``
    (:func:`_local_completion_logprobs`), run through the FSDP root when ``model`` is sharded."""
    runner = getattr(model, RUNNER_ATTR, None)
    kw = dict(pad_token_id=pad_token_id, chunk_size=chunk_size, with_entropy=with_entropy,
              entropy_grad=entropy_grad, share_prompt=share_prompt)
    if runner is not None:
        return runner(_local_completion_logprobs, batch, **kw)
    return _local_completion_logprobs(model, batch, **kw)


def _local_completion_logprobs(
    model: Any,
    batch: RolloutBatch,
    *,
    pad_token_id: int,
    chunk_size: int = 1024,
    with_entropy: bool = True,
    entropy_grad: bool = False,
    share_prompt: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[n, T]`` of the batch's completion tokens (0 at padding and at environment tokens of
    a multi-turn row, whose ``loss_mask`` is 0: they are fed as inputs, never scored) and entropy ``[n, T]``.

    With ``share_prompt`` and ``n > 1`` rows that all have the same context, the context runs once
    (:func:`shared_context_hidden`); otherwise every row runs ``context + completion``. Both give the
    same log-probs and gradients (interpretation: an exact rewrite of the forward, no approximation).

    Logits are divided by each row's ``logprob_temperature`` (``grpo_core.md`` §4). Gradients flow
    through the log-probs when grad mode is on; the entropy carries a gradient only when
    ``entropy_grad`` (an entropy bonus is used).

    Precision: the model's policy (:func:`rlvr.precision.autocast_for`): under ``bf16`` the body and the
    LM head's matmuls run under bf16 autocast (their backward too); the log-softmax, the entropy and the
    returned log-probs are float32 in every mode. With the policy's ``lm_head_fp32``
    (``cast_lm_head_to_fp32``) the head's matmuls run in float32 (hidden states upcast, autocast off; its
    gradients flow back through the casts), as the HF engine's logits then do.

    Device: the batch is on the CPU; the inputs go to the model's device (that of its LM-head weight) and
    the returned ``[n, T]`` tensors are on the batch's device again (gradients flow back through the copy).

    Raises:
        ValueError: a row has an empty context (nothing to condition the first token on).
    """
    if any(len(c) == 0 for c in batch.context_ids):
        raise ValueError("completion_logprobs: every row needs at least one context token")
    with autocast_for(model):
        return _completion_logprobs(model, batch, pad_token_id, chunk_size, with_entropy, entropy_grad, share_prompt)


def _completion_logprobs(model, batch, pad_token_id, chunk_size, with_entropy, entropy_grad, share_prompt):
    # the batch lives on the CPU; the model's inputs go to its device (a no-op on the CPU) and the
    # [n, T] results come back to the batch's device, where the loss is computed
    weight, bias = lm_head_params(model)
    dev = weight.device
    mask = batch.model_mask > 0  # [n, T]: tokens the policy sampled (environment tokens are inputs only)
    rows, cols = mask.nonzero(as_tuple=True)  # selected completion tokens, k of them
    if share_prompt and shares_context(batch) and not _warn_unshared(model):
        h = shared_context_hidden(model, batch, rows, cols, pad_token_id)  # [k, H]
    else:
        input_ids, attn, pred_pos = build_inputs(batch, pad_token_id)
        hidden = model_forward_hidden(model, input_ids.to(dev), attn.to(dev))  # [n, L, H]
        h = hidden[rows.to(dev), pred_pos[rows, cols].to(dev)]  # [k, H]
    targets = batch.completion_ids[rows, cols].to(dev)  # [k]
    policy = model_precision(model)
    head_ctx: Any = contextlib.nullcontext()
    if policy is not None and policy.lm_head_fp32:  # cast_lm_head_to_fp32: fp32 operands, autocast off
        head_ctx = torch.autocast(dev.type, enabled=False)
        h, weight = h.float(), weight.float()
        bias = bias.float() if bias is not None else None
    temps = batch.logprob_temperature.to(h.dtype)[rows].to(dev)  # [k]
    with head_ctx:
        logp_sel, ent_sel = selective_log_softmax_and_entropy(
            h, weight, bias, targets, temperature=temps, chunk_size=chunk_size,
            with_entropy=with_entropy, entropy_grad=entropy_grad,
        )
    out = mask.device
    logp = torch.zeros(mask.shape, dtype=logp_sel.dtype)
    logp = logp.index_put((rows, cols), logp_sel.to(out))
    entropy = None
    if ent_sel is not None:
        entropy = torch.zeros(mask.shape, dtype=ent_sel.dtype).index_put((rows, cols), ent_sel.to(out))
    return logp, entropy


def shared_prompt_unavailable(model: Any) -> str | None:
    """Why this call cannot share the prompt's key/value states, or None when it can.

    Gradient checkpointing replays each decoder layer in the backward pass and therefore makes the
    layers drop their KV cache whenever the model is training with grad enabled (transformers
    ``GradientCheckpointingLayer``): the shared context's states would be ``None``. No-grad calls
    (behaviour / reference log-probs) and eval mode keep the cache, so they still share.

    Source: interpretation (issue 12 item 4): fall back per call, exact either way.
    """
    if not (torch.is_grad_enabled() and getattr(model, "training", False)):
        return None
    # what transformers' is_activation_checkpointing does, without its version-dependent name
    if any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()):
        return ("model.gradient_checkpointing is on: checkpointed layers keep no KV cache in a training "
                "forward, so each group's prompt runs once per completion in the update (exact, slower)")
    return None


_warned_unshared: set[int] = set()


def _warn_unshared(model: Any) -> bool:
    """True (and a warning, once per model) when :func:`shared_prompt_unavailable` gives a reason."""
    reason = shared_prompt_unavailable(model)
    if reason is None:
        return False
    if id(model) not in _warned_unshared:
        _warned_unshared.add(id(model))
        warnings.warn(f"share_prompt_forward falls back to unshared rows: {reason}", stacklevel=3)
    return True


def shares_context(batch: RolloutBatch) -> bool:
    """True when the batch has ≥ 2 rows and all of them have the same ``context_ids`` (one group's
    completions), i.e. when :func:`completion_logprobs` can run the context once."""
    return len(batch) > 1 and all(c == batch.context_ids[0] for c in batch.context_ids[1:])


def length_buckets(lengths: list[int], overhead: int = 32) -> list[list[int]]:
    """Split rows into buckets of similar length so that padding each bucket to its longest row wastes little.

    Rows are sorted longest first and cut into contiguous runs; the cut minimises
    ``Σ_buckets (rows · longest) + overhead · #buckets`` (exact dynamic programme, ``O(n²)``).

    Args:
        lengths: ``n`` non-negative row lengths (tokens).
        overhead: cost of one extra bucket, in padded tokens (a model call's fixed cost).

    Returns:
        Buckets of row indices into ``lengths``, each sorted longest first; every index exactly once.

    Source: interpretation (bucketing by length, as TRL/verl's sequence packing aims at): pads less than
    one rectangle and calls the model fewer times than one call per row.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    n = len(order)
    best = [0.0] + [math.inf] * n  # best[j]: cost of the first j rows (sorted)
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):  # last bucket = sorted rows i .. j-1, padded to lengths[order[i]]
            c = best[i] + (j - i) * lengths[order[i]] + overhead
            if c < best[j]:
                best[j], cut[j] = c, i
    out: list[list[int]] = []
    j = n
    while j > 0:
        out.append(order[cut[j] : j])
        j = cut[j]
    return out[::-1]


def shared_context_hidden(
    model: Any, batch: RolloutBatch, rows: torch.Tensor, cols: torch.Tensor, pad_token_id: int
) -> torch.Tensor:
    """Hidden states ``[k, H]`` that predict the selected completion tokens, for rows sharing one context.

    The context ``[1, C]`` runs once and keeps its per-layer key/value states (with gradient). The
    completions, without their last token (it predicts nothing), are bucketed by length
    (:func:`length_buckets`); each bucket ``[m, w]`` (right-padded) runs on top of a copy of those states
    expanded to ``m`` rows, at positions ``C .. C+w−1`` (a bucket of one-token completions runs nothing). Right
    padding needs no attention mask: a real token never attends to a later position. The state that
    predicts completion token 0 is the context's last hidden state; token ``t ≥ 1`` is predicted by the
    completion's state at ``t − 1``. Gradients reach the context through every bucket (they add up, as
    for ``n`` separate copies of the prompt).

    Args:
        model: a ``*ForCausalLM`` whose decoder accepts ``past_key_values`` (a transformers
            ``DynamicCache``).
        batch: ``n`` rows with identical ``context_ids`` (length ``C ≥ 1``).
        rows, cols: ``[k]`` long, the selected (row, completion position) pairs.
        pad_token_id: token id written at padded completion positions (never attended to).

    Returns:
        ``[k, H]`` hidden states in the model's dtype, in the order of ``rows``/``cols``.

    Source: interpretation — prefix sharing for a group's common prompt; exact (tested against
    separate rows, values and gradients).
    """
    from transformers import DynamicCache

    base = decoder_of(model)
    dev = lm_head_params(model)[0].device  # the model's device (inputs built on the CPU go there)
    ctx = torch.as_tensor(batch.context_ids[0], dtype=torch.long, device=dev)[None]  # [1, C]
    C = ctx.shape[1]
    out = base(input_ids=ctx, attention_mask=torch.ones_like(ctx), use_cache=True)
    kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]  # [1, heads, C, d] each
    lengths = batch.completion_lengths.tolist()
    H = out.last_hidden_state.shape[-1]
    pieces: list[torch.Tensor] = []  # per bucket: [m·w, H] states, row-major
    offset = torch.zeros(len(batch), dtype=torch.long)  # row → start of its states in the concatenation
    pos_total = 0
    cache_kw = _cache_kwarg(base)
    fed = [max(0, k - 1) for k in lengths]  # completion tokens each row feeds: all but its last
    for bucket in length_buckets(fed):
        m = len(bucket)
        w = max(fed[i] for i in bucket)
        if w == 0:  # completions of one token: predicted by the context's last state alone
            continue
        ids = batch.completion_ids[bucket, :w].clone()
        ids[batch.completion_mask[bucket, :w] <= 0] = pad_token_id
        cache = DynamicCache(ddp_cache_data=[(k.expand(m, -1, -1, -1), v.expand(m, -1, -1, -1)) for k, v in kv],
                             config=getattr(model, "config", None))
        pos = torch.arange(C, C + w, dtype=torch.long, device=dev)[None].expand(m, w)
        h = base(input_ids=ids.to(dev), position_ids=pos, use_cache=True, **{cache_kw: cache}).last_hidden_state
        pieces.append(h.reshape(m * w, H))
        for r, i in enumerate(bucket):
            offset[i] = pos_total + r * w
        pos_total += m * w
    h_first = out.last_hidden_state[0, -1]  # [H]: predicts completion token 0 of every row
    if not pieces:  # every completion has one token
        return h_first[None].expand(len(rows), H)
    h_at = torch.cat(pieces, dim=0)  # [Σ m·w, H]
    idx = (offset[rows] + (cols - 1).clamp(min=0)).clamp(max=h_at.shape[0] - 1)  # cols == 0: replaced below
    h = h_at[idx.to(dev)]  # [k, H]
    return torch.where((cols == 0).to(dev)[:, None], h_first[None].expand_as(h), h)


def _cache_kwarg(decoder: Any) -> str:
    """The decoder's keyword for a KV cache: ``cache`` (transformers ≥ 5.2x) or ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


def micro_batches(batch: RolloutBatch, rows_per_micro: int, keep_groups: bool = True) -> list[list[int]]:
    """Row indices of each micro-batch, longest micro-batch first.

    With ``keep_groups``, rows that share a context fill whole micro-batches on their own (a group of
    ``G ≥ rows_per_micro`` completions; longest rows first), so :func:`completion_logprobs` runs that
    prompt once per micro-batch. All other rows (small groups, group remainders, unique contexts such as
    feedback-augmented prompts), or every row without ``keep_groups``, are pooled, sorted by
    ``context + completion`` length (longest first) and cut into chunks of ``rows_per_micro``, so
    micro-batches stay full and little padded. :meth:`RolloutBatch.select` then cuts each micro-batch to
    its own longest row.
    """
    total = [len(c) + int(k) for c, k in zip(batch.context_ids, batch.completion_lengths.tolist())]
    out: list[list[int]] = []
    pooled: list[int] = list(range(len(batch)))
    if keep_groups and rows_per_micro > 1:
        by_ctx: dict[tuple[int, ...], list[int]] = {}
        for i, c in enumerate(batch.context_ids):
            by_ctx.setdefault(tuple(c), []).append(i)
        pooled = []
        for rows in by_ctx.values():
            rows.sort(key=lambda i: -total[i])
            full = len(rows) - len(rows) % rows_per_micro
            out += [rows[j : j + rows_per_micro] for j in range(0, full, rows_per_micro)]
            pooled += rows[full:]
    pooled.sort(key=lambda i: -total[i])
    out += [pooled[j : j + rows_per_micro] for j in range(0, len(pooled), rows_per_micro)]
    return sorted(out, key=lambda m: -max(total[i] for i in m))


@torch.no_grad()
def batch_logprobs(
    model: torch.nn.Module, batch: RolloutBatch, *, pad_token_id: int, rows_per_micro: int = 8,
    chunk_size: int = 1024, with_entropy: bool = False, share_prompt: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs ``[N, T]`` (nats, 0 at padding) and, with ``with_entropy``, full-distribution
    entropy ``[N, T]`` of ``batch`` under ``model``, without gradient.

    Each row uses its own ``logprob_temperature``; micro-batched (``rows_per_micro`` rows; with
    ``share_prompt`` a group's prompt runs once per micro-batch, see :func:`micro_batches`); the model's
    train/eval mode is restored.

    Raises:
        ValueError: a row has an empty context (from :func:`rlvr.trainer.forward.completion_logprobs`).

    Source: grpo_core.md §4 (log-probs at each row's temperature); used for stored replay ``old_logp``.
    """
    was = model.training
    model.eval()
    logp = torch.zeros_like(batch.completion_mask)
    ent = torch.zeros_like(batch.completion_mask) if with_entropy else None
    runner = getattr(model, RUNNER_ATTR, None)
    gathered: Any = contextlib.nullcontext()
    if runner is not None:  # FSDP: gather once for the whole pass (ranks may run different micro counts)
        from rlvr.distributed.fsdp import unsharded

        gathered = unsharded(runner, training=False)
    try:
        with gathered:
            for rows in micro_batches(batch, rows_per_micro, keep_groups=share_prompt):
                micro = batch.select(rows)
                lp, e = completion_logprobs(model, micro, pad_token_id=pad_token_id, chunk_size=chunk_size,
                                            with_entropy=with_entropy, share_prompt=share_prompt)
                logp[rows, : lp.shape[1]] = lp
                if ent is not None and e is not None:
                    ent[rows, : e.shape[1]] = e
    finally:
        model.train(was)
    return logp, ent

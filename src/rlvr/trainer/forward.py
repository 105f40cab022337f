"""Per-token log-probs (and entropy) of completion tokens under a model, without full-vocabulary logits.

The transformer body runs on ``context + completion`` rows right-padded to the micro-batch's own
longest row; the LM head then runs only on the hidden states that predict completion tokens, in
chunks (``rlvr.core.logprobs``). This is what keeps a CPU step fast and its memory bounded.
"""

from __future__ import annotations

from typing import Any

import torch

from rlvr.core.logprobs import selective_log_softmax_and_entropy
from rlvr.models import lm_head_params, model_forward_hidden
from rlvr.types import RolloutBatch


def build_inputs(batch: RolloutBatch, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded model inputs for a (micro-)batch.

    Returns:
        input_ids: ``[n, L]`` long, ``context + completion`` per row, ``L`` = longest row.
        attention_mask: ``[n, L]`` long.
        pred_pos: ``[n, T]`` long, position of the hidden state that predicts completion token ``t``
            (``len(context) + t − 1``); 0 where the completion mask is 0.
    """
    lengths = batch.completion_lengths.tolist()
    ctx_lens = [len(c) for c in batch.context_ids]
    total = [c + k for c, k in zip(ctx_lens, lengths)]
    n, width = batch.completion_ids.shape
    L = max(total)
    input_ids = torch.full((n, L), pad_token_id, dtype=torch.long)
    attn = torch.zeros((n, L), dtype=torch.long)
    pred_pos = torch.zeros((n, width), dtype=torch.long)
    for i, (ctx, k) in enumerate(zip(batch.context_ids, lengths)):
        c = len(ctx)
        input_ids[i, :c] = torch.as_tensor(ctx, dtype=torch.long)
        input_ids[i, c : c + k] = batch.completion_ids[i, :k]
        attn[i, : c + k] = 1
        pred_pos[i, :k] = torch.arange(c - 1, c - 1 + k)
    return input_ids, attn, pred_pos


def completion_logprobs(
    model: Any,
    batch: RolloutBatch,
    *,
    pad_token_id: int,
    chunk_size: int = 1024,
    with_entropy: bool = True,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[n, T]`` of the batch's completion tokens (0 at padding) and entropy ``[n, T]``.

    Logits are divided by each row's ``logprob_temperature`` (``grpo_core.md`` §4). Gradients flow
    through the log-probs when grad mode is on; the entropy carries a gradient only when
    ``entropy_grad`` (an entropy bonus is used).

    Raises:
        ValueError: a row has an empty context (nothing to condition the first token on).
    """
    if any(len(c) == 0 for c in batch.context_ids):
        raise ValueError("completion_logprobs: every row needs at least one context token")
    mask = batch.completion_mask > 0  # [n, T]
    input_ids, attn, pred_pos = build_inputs(batch, pad_token_id)
    hidden = model_forward_hidden(model, input_ids, attn)  # [n, L, H]
    rows, cols = mask.nonzero(as_tuple=True)  # selected completion tokens, k of them
    h = hidden[rows, pred_pos[rows, cols]]  # [k, H]
    targets = batch.completion_ids[rows, cols]  # [k]
    temps = batch.logprob_temperature.to(hidden.dtype)[rows]  # [k]
    weight, bias = lm_head_params(model)
    logp_sel, ent_sel = selective_log_softmax_and_entropy(
        h, weight, bias, targets, temperature=temps, chunk_size=chunk_size,
        with_entropy=with_entropy, entropy_grad=entropy_grad,
    )
    logp = torch.zeros(mask.shape, dtype=logp_sel.dtype)
    logp = logp.index_put((rows, cols), logp_sel)
    entropy = None
    if ent_sel is not None:
        entropy = torch.zeros(mask.shape, dtype=ent_sel.dtype).index_put((rows, cols), ent_sel)
    return logp, entropy


def micro_batches(batch: RolloutBatch, rows_per_micro: int) -> list[list[int]]:
    """Row indices of each micro-batch: rows sorted by ``context + completion`` length (longest first),
    cut into chunks of ``rows_per_micro``."""
    total = [len(c) + int(k) for c, k in zip(batch.context_ids, batch.completion_lengths.tolist())]
    order = sorted(range(len(batch)), key=lambda i: -total[i])
    return [order[i : i + rows_per_micro] for i in range(0, len(order), rows_per_micro)]


@torch.no_grad()
def batch_logprobs(
    model: torch.nn.Module, batch: RolloutBatch, *, pad_token_id: int, rows_per_micro: int = 8,
    chunk_size: int = 1024, with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs ``[N, T]`` (nats, 0 at padding) and, with ``with_entropy``, full-distribution
    entropy ``[N, T]`` of ``batch`` under ``model``, without gradient.

    Each row uses its own ``logprob_temperature``; micro-batched (``rows_per_micro`` rows); the model's
    train/eval mode is restored.

    Raises:
        ValueError: a row has an empty context (from :func:`rlvr.trainer.forward.completion_logprobs`).

    Source: grpo_core.md §4 (log-probs at each row's temperature); used for stored replay ``old_logp``.
    """
    was = model.training
    model.eval()
    logp = torch.zeros_like(batch.completion_mask)
    ent = torch.zeros_like(batch.completion_mask) if with_entropy else None
    try:
        for rows in micro_batches(batch, rows_per_micro):
            micro = batch.select(rows)
            lp, e = completion_logprobs(model, micro, pad_token_id=pad_token_id, chunk_size=chunk_size,
                                        with_entropy=with_entropy)
            logp[rows, : lp.shape[1]] = lp
            if ent is not None and e is not None:
                ent[rows, : e.shape[1]] = e
    finally:
        model.train(was)
    return logp, ent

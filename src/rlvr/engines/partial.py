"""Partial rollouts for :class:`rlvr.engines.hf.HFEngine`: new weights between decode steps of rows in flight.

With ``engine.decode_gate`` set (a :class:`DecodeGate`), the decode loop
(:func:`rlvr.engines.continuous.decode_pieces`) calls ``gate.between_steps()`` before every decode step (one
token per live row). The gate may let the trainer change the weights there (streaming's producer releases
its :class:`rlvr.trainer.streaming.WeightGate` when an update is waiting) and returns the version now in
force. When it differs from the version the rows were decoded under so far, the engine

1. refreshes what it derived from the weights (:func:`weights_changed`: a bf16 decode copy is re-cast by the
   gate's caller, the fp32 LM head taken once per call is taken again, autocast's cast cache is cleared,
   saved KV rows of a ``kv_session`` are dropped), then
2. recomputes the KV cache of every row of the batch under the new weights (:func:`reprefill`: a prefill of
   context + tokens generated so far, left-padded) — the cache of the old weights is discarded, so the next
   token's distribution, and its behaviour log-prob, is exactly the new policy's given the same prefix.

Each token records the version it was sampled under (:attr:`rlvr.types.Generation.versions`); its
behaviour log-prob is that version's. The boundary is a decode step: the tokens sampled before the
change are the old version's, every token from the step of the change on is the new one's.

Source: interpretation of AReaL's interruptible generation (Fu et al. 2025, "AReaL", §4.1: on a weight
update, rollout workers interrupt, discard the KV caches computed by the old weights, re-compute them with
the new weights and continue decoding the unfinished sequences) on this engine's decode loop.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import torch

from rlvr.engines.kv_cache import new_cache
from rlvr.types import GenerationRequest

__all__ = ["DecodeGate", "reprefill", "weights_changed"]


class DecodeGate(Protocol):
    """What the decode loop asks between decode steps (``HFEngine.decode_gate``).

    Attributes:
        version: the policy version of the weights when the ``generate`` call starts.
    """

    version: int

    def between_steps(self) -> int:
        """Called before every decode step, no forward in flight: the weights may change inside (the
        caller re-syncs any copy it keeps). Returns the version of the weights the next step decodes with."""
        ...


def weights_changed(engine: Any) -> None:
    """Refresh what ``engine`` (an :class:`~rlvr.engines.hf.HFEngine`) derived from the weights during one
    ``generate`` call: the fp32 LM head (``lm_head_fp32``), autocast's cache of cast weights
    (``generation_autocast``: one cast per weight per autocast region), the saved rows of a ``kv_session``
    (computed by the old weights). The decode copy itself (``casts_weights``) is re-cast by the gate's caller
    (the trainer's ``weight_sync``), as before each generation round."""
    if engine._head is not None:
        from rlvr.models.split import lm_head_params

        w, b = lm_head_params(engine.model)
        engine._head = (w.detach().float(), b.detach().float() if b is not None else None)
    if engine._autocast:
        torch.clear_autocast_cache()
    if engine._kv is not None:
        engine._kv.rows.clear()
        engine._kv.lengths.clear()
        engine._kv.used.clear()


def reprefill(engine: Any, requests: Sequence[GenerationRequest], batch: Any,
              toks: dict[tuple[int, int], list[int]]) -> None:
    """Recompute ``batch``'s KV cache and next-token logits under the engine's current weights.

    Every row (finished rows still in the batch too: their logits are sampled and ignored, so the
    generator's draws stay aligned) is prefilled as ``context_ids + tokens generated so far``, left-padded
    with explicit positions as :meth:`HFEngine._prefill` does; the row's count, cap and finish state are
    kept.

    Args:
        engine: the :class:`~rlvr.engines.hf.HFEngine`.
        requests: the call's requests (contexts by ``owners[b][0]``).
        batch: the decode loop's batch (``rlvr.engines.continuous._Batch``): ``cache``, ``trimmable``,
            ``mask [B, W]``, ``next_pos [B]``, ``logits [B, V]`` are replaced.
        toks: tokens generated so far per ``(request, sample)``.
    """
    device = batch.mask.device
    seqs = [list(requests[i].context_ids) + toks[(i, s)] for i, s in batch.owners]
    width = max(len(q) for q in seqs)
    ids = torch.full((len(seqs), width), engine.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for j, q in enumerate(seqs):
        ids[j, width - len(q):] = torch.tensor(q, dtype=torch.long)
        mask[j, width - len(q):] = 1
    ids, mask = ids.to(device), mask.to(device)
    remaining = int((batch.row_cap - batch.count).max().clamp_min(0)) if len(seqs) else 0
    cache, trimmable = new_cache(engine._decode_model.config, width + remaining + 1, engine.cache_kind)
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    batch.logits = engine._forward(ids, mask, pos, cache)
    batch.cache, batch.trimmable, batch.mask = cache, trimmable, mask.to(batch.mask.dtype)
    batch.next_pos = torch.tensor([len(q) for q in seqs], dtype=torch.long, device=device)

"""Continuous batching for :class:`rlvr.engines.hf.HFEngine` (``continuous=True``): when rows finish, waiting
requests take their slots, so a round is not held by its longest rows.

The requests' (request, samples) pieces (the engine's own plan: shorter contexts first, at most
``max_batch_size`` rows each) wait in a queue. The batch starts with as many pieces as fit; whenever the
engine compacts finished rows away (its ski-rental rule, ``prune_patience``) or every row has finished, the
next pieces that fit are prefilled (each context once, copied to its samples) and merged into the batch:
both KV caches are left-padded to the wider one's length and concatenated along the batch, and so are their
attention masks (padding columns are masked, so a row's attention sees only its own tokens; positions are
per row). Each row keeps its own cap, log-probs and finish reason.

Results: greedy decoding (``temperature=0`` or ``top_k=1``) gives the same tokens as the chunked loop up to
float rounding: a row's logits depend on the other rows only through the rounding of the batched matmuls and
attention (row count, left-padding width), which the tests find equal on the tiny model in fp32. Under bf16 that
rounding is coarse enough to flip near-tied argmaxes on a real model: on 64 GSM8K questions at <= 512 tokens with
SmolLM2-135M the two loops' greedy completions part for some rows (``docs/benchmark.md``). Seeded *sampling* draws from one generator per call in batch-row order, so
its draws depend on which rows share a step: with ``params.seed`` the result is reproducible for the same
engine settings (``max_batch_size``, ``continuous``), but not equal to the chunked loop's, which
interleaves the rows differently. Per-request generators would lift that; not built.

One decode loop serves both modes (:func:`decode_pieces`): the chunked loop (``HFEngine._run_chunk``) is this
loop given one chunk, which fits the batch whole, so nothing is ever admitted after its prefill and the batch
only shrinks; continuous batching gives it every piece of the call.

Source: interpretation of continuous (iteration-level) batching, Yu et al. 2022 ("Orca", §3.2), on
transformers' KV cache.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Sequence

import torch

from rlvr.engines.kv_cache import new_cache, trim_left
from rlvr.engines.kv_reuse import save_rows
from rlvr.engines.sampling import sample_from_logits
from rlvr.types import Generation, GenerationRequest, SamplingParams

__all__ = ["decode_pieces", "merge_caches", "run_continuous"]


def _pad_left(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    extra = width - t.shape[dim]
    if extra <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def merge_caches(config: Any, kind: str, a: Any, b: Any, capacity: int) -> Any:
    """A new cache holding ``a``'s rows then ``b``'s, both left-padded (zeros) to the longer length.

    Args:
        config: the model config (the cache's layer layout). kind: ``"append"`` or ``"dynamic"``.
        a, b: caches of plain full-attention layers (``keys``/``values`` ``[B, H, S, D]``).
        capacity: positions to preallocate (append layers).

    Returns:
        The merged cache: ``[B_a + B_b, H, max(S_a, S_b), D]`` per layer.
    """
    width = max(a.layers[0].keys.shape[-2], b.layers[0].keys.shape[-2])
    out, _ = new_cache(config, capacity, kind)
    for la, lb, lo in zip(a.layers, b.layers, out.layers):
        keys = torch.cat([_pad_left(la.keys, width, -2), _pad_left(lb.keys, width, -2)])
        values = torch.cat([_pad_left(la.values, width, -2), _pad_left(lb.values, width, -2)])
        lo.update(keys, values)
    return out


class _Batch:
    """The rows being decoded: cache, mask ``[B, W]``, next positions, logits ``[B, V]``, caps and counts."""

    def __init__(self, cache, trimmable, logits, mask, lens, owners, row_cap) -> None:
        self.cache, self.trimmable, self.logits, self.mask = cache, trimmable, logits, mask
        self.next_pos = lens.to(mask.device)
        self.owners, self.row_cap = list(owners), row_cap
        self.count = torch.zeros_like(row_cap)  # tokens generated per row
        self.done = torch.zeros(len(owners), dtype=torch.bool, device=mask.device)

    def select(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        for name in ("mask", "next_pos", "row_cap", "count", "done", "logits"):
            setattr(self, name, getattr(self, name)[keep])
        self.owners = [self.owners[b] for b in keep.tolist()]
        if self.trimmable:
            lead = int(self.mask.any(0).long().argmax())  # first column some live row uses
            if lead >= 8:
                trim_left(self.cache, lead)
                self.mask = self.mask[:, lead:]

    def merge(self, other: "_Batch", config: Any, kind: str) -> None:
        remaining = int((self.row_cap - self.count).max().clamp_min(0)) if len(self.owners) else 0
        width = max(self.mask.shape[1], other.mask.shape[1])
        cap = width + max(remaining, int(other.row_cap.max()))
        self.cache = merge_caches(config, kind, self.cache, other.cache, cap)
        self.mask = torch.cat([_pad_left(self.mask, width, 1), _pad_left(other.mask, width, 1)])
        for name in ("next_pos", "row_cap", "count", "done", "logits"):
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        self.owners += other.owners
        self.trimmable = self.trimmable and other.trimmable


def run_continuous(engine: Any, requests: Sequence[GenerationRequest], params: SamplingParams,
                   generator: torch.Generator | None, results: list[list[Generation | None]]) -> None:
    """Decode every request of ``requests`` with continuous batching; fill ``results[i][s]``.

    ``engine`` is the :class:`rlvr.engines.hf.HFEngine` (its plan, prefill, forward, EOS ids and pruning
    settings); the model is in eval mode under inference mode (the caller's). See the module docstring for
    what stays identical to the chunked loop. ``engine.on_generated`` is called with the rows of each compaction.
    """
    pieces = [piece for chunk in engine._plan(requests) for piece in chunk]
    decode_pieces(engine, requests, pieces, params, generator, results, on_finished=engine.on_generated)


def decode_pieces(engine: Any, requests: Sequence[GenerationRequest], pieces: Sequence[tuple[int, list[int]]],
                  params: SamplingParams, generator: torch.Generator | None,
                  results: list[list[Generation | None]], *, on_finished: Any = None) -> None:
    """The one decode loop of :class:`rlvr.engines.hf.HFEngine`: decode the (request, sample indices)
    ``pieces`` in order and fill ``results[i][s]`` with each sample's tokens, behaviour log-probs and finish.

    The batch starts with the pieces that fit ``engine.max_batch_size``; each step samples every row
    (:func:`rlvr.engines.sampling.sample_from_logits`, finished rows too, so the generator's draws do not
    depend on when rows finish), records the live rows' tokens, and ends a row at EOS or its cap. Finished
    rows ride along on a pad token until the row-steps spent on them reach ``engine.prune_patience`` (with
    ``engine.prune``) or every row is done; then they are compacted away (left padding no live row needs is
    trimmed) and the waiting pieces that fit are prefilled and merged in. Given one chunk of the engine's
    plan (at most ``max_batch_size`` rows) nothing waits: that is the chunked, shrinking-batch loop.

    Partial rollouts: with ``engine.decode_gate`` set (:class:`rlvr.engines.partial.DecodeGate`), it is asked
    before every step which version the weights are at; on a change the batch's KV cache is recomputed under
    the new weights (:func:`rlvr.engines.partial.reprefill`) before the step samples, and every token records
    the version it was sampled under (``Generation.versions``; ``None`` without a gate).

    Args:
        on_finished: called with the number of rows dropped at each compaction, or None.

    Source: interpretation (see the module docstring); the loop of ``HFEngine._run_chunk`` before the two
    were merged, step for step.
    """
    device = next(engine._decode_model.parameters()).device
    config, kind = engine._decode_model.config, engine.cache_kind
    queue = deque(pieces)
    toks: dict[tuple[int, int], list[int]] = {}
    lps: dict[tuple[int, int], list[float]] = {}
    finish: dict[tuple[int, int], str] = {}
    gate = getattr(engine, "decode_gate", None)  # partial rollouts (rlvr.engines.partial)
    version = gate.version if gate is not None else None
    vers: dict[tuple[int, int], list[int]] = {}
    eos = torch.tensor(sorted(engine.eos_token_ids), dtype=torch.long, device=device)
    pad = torch.tensor(engine.pad_token_id, dtype=torch.long, device=device)

    def admit(batch: _Batch | None) -> _Batch | None:
        free = engine.max_batch_size - (len(batch.owners) if batch is not None else 0)
        take = []
        while queue and len(queue[0][1]) <= free:
            piece = queue.popleft()
            take.append(piece)
            free -= len(piece[1])
        if not take:
            return batch
        new = _Batch(*engine._prefill(requests, take, params))
        for o in new.owners:
            toks[o], lps[o], finish[o], vers[o] = [], [], "length", []
        if batch is None or not batch.owners:
            return new
        batch.merge(new, config, kind)
        return batch

    batch = admit(None)
    waste = 0
    while batch is not None:
        if gate is not None:
            now = int(gate.between_steps())
            if now != version:  # new weights: discard the old KV cache, recompute it (AReaL's interruption)
                from rlvr.engines.partial import reprefill, weights_changed

                weights_changed(engine)
                reprefill(engine, requests, batch, toks)
                version = now
        tok, lp = sample_from_logits(batch.logits, params.temperature, params.top_p, params.top_k, generator)
        live = ~batch.done
        ended = torch.isin(tok, eos) & live
        for b, (o, t, p, e, d) in enumerate(zip(batch.owners, tok.tolist(), lp.tolist(), ended.tolist(),
                                                batch.done.tolist())):
            if not d:
                toks[o].append(t)
                lps[o].append(p)
                vers[o].append(version)
                if e:
                    finish[o] = "eos"
        batch.count = batch.count + live.long()
        finished = (ended | (batch.row_cap <= batch.count)) & live  # rows ending at this step
        batch.done |= finished
        kv = getattr(engine, "_kv", None)
        if kv is not None and bool(finished.any()):  # kv_session: keep what a later turn would attend to
            rows = finished.nonzero().flatten().tolist()  # its context and all but its last token
            save_rows(kv, batch.cache, batch.mask, rows,
                      [list(requests[batch.owners[b][0]].context_ids) + toks[batch.owners[b]][:-1] for b in rows])
        n_done = int(batch.done.sum())
        waste += n_done
        compacted = n_done == len(batch.owners) or (n_done > 0 and engine.prune and waste >= engine.prune_patience)
        if compacted:  # drop the finished rows (their slots are free for waiting requests)
            keep = (~batch.done).nonzero().flatten()
            if on_finished is not None:
                on_finished(n_done)
            tok = tok[keep]
            if keep.numel():
                batch.select(keep)
            else:
                batch = None
            waste = 0
        else:
            tok = torch.where(batch.done, pad, tok)  # finished rows ride along on a pad token
        if batch is not None:
            batch.mask = torch.cat([batch.mask, torch.ones((batch.mask.shape[0], 1), dtype=batch.mask.dtype,
                                                           device=device)], dim=1)
            batch.logits = engine._forward(tok[:, None], batch.mask, batch.next_pos[:, None], batch.cache)
            batch.next_pos = batch.next_pos + 1
        if compacted or batch is None:
            batch = admit(batch)
    for (i, s), t in toks.items():
        results[i][s] = Generation(token_ids=t, logprobs=lps[(i, s)], finish_reason=finish[(i, s)],  # type: ignore[arg-type]
                                   versions=vers[(i, s)] if gate is not None else None)

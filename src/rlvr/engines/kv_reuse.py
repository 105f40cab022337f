"""Keeping sequences' KV caches between engine calls: a multi-turn episode's later turns prefill only what is new.

An episode's turn ``k+1`` continues the context of turn ``k`` (its prompt, everything sampled, the
environment's observation), so recomputing the whole context every turn makes a later turn cost a prefill of
``rows × context`` tokens, which on a CPU outweighs the turn's own decoding. Inside
:meth:`rlvr.engines.hf.HFEngine.kv_session`, the engine saves each sample row's keys and values when the row
finishes (:func:`save_rows`: the positions the row attends to, compacted, keyed by the tokens they encode), and a
later request whose context starts with a saved key prefills only the rest (:func:`lookup`, :func:`prime_cache`);
a saved row that a call used is dropped at the end of that call (the continued row is saved again, longer, when it
finishes), so a session holds about one call's rows at a time.

Layout of a primed chunk, per row ``j`` (``a_j`` saved positions, ``s_j`` new tokens, ``A = max a``, ``S = max s``)::

    [pad × (A − a_j) | saved a_j | pad × (S − s_j) | new s_j]

the attention mask hides the pads (holes in the middle are fine: position ids count real tokens, as in a fresh
prefill), so a row's numbers do not depend on its batch-mates. The saved keys/values were computed during
decoding rather than in one prefill; they are the same function of the same tokens (equal up to float rounding,
tested), and the behaviour log-probs are those of the computation that actually ran.

Only within one session: weights do not change inside it (a sampler opens one per generation round), so a saved
cache is never stale. Source: interpretation of prefix caching (vLLM's automatic prefix caching, Kwon et al.
2023 §4.4) for the HF engine's multi-turn use; issue 26 "Measured" (later turns at ≥ 0.8× single-turn tok/s).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

__all__ = ["KVStore", "lookup", "prime_cache", "save_rows"]

Slices = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer ``(keys [H, a, D], values [H, a, D])`` of one row's real positions."""


class KVStore:
    """Saved rows of one session: ``tokens (tuple) -> per-layer (keys, values)``, the lengths present, the keys the
    current call reused (``used``) and counters (``hits``: requests that reused a row, ``reused_tokens``)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[int, ...], Slices] = {}
        self.lengths: set[int] = set()
        self.hits = 0
        self.reused_tokens = 0
        self.used: set[tuple[int, ...]] = set()

    def put(self, key: tuple[int, ...], slices: Slices) -> None:
        """Save ``slices`` (the KV of the tokens ``key``)."""
        if key:
            self.rows[key] = slices
            self.lengths.add(len(key))

    def free_used(self) -> None:
        """Drop the rows a call reused (its requests were continued; their longer rows are saved instead)."""
        for key in self.used:
            self.rows.pop(key, None)
        self.used.clear()
        self.lengths = {len(k) for k in self.rows}


def save_rows(store: KVStore, cache: Any, mask: torch.Tensor, rows: Sequence[int], keys: Sequence[Sequence[int]]) -> None:
    """Save batch rows ``rows`` of ``cache``: the columns where ``mask[row] == 1`` (``mask [B, W]``, ``W`` = the
    cache's length), under ``keys[i]`` (the tokens those columns encode, in order).

    Raises:
        ValueError: a key's length differs from its row's number of real columns (a bookkeeping error).
    """
    for b, key in zip(rows, keys):
        cols = mask[b].nonzero().flatten()
        if cols.numel() != len(key):
            raise ValueError(f"kv_reuse: row {b} has {cols.numel()} cached positions for a {len(key)}-token key")
        store.put(tuple(key), [(layer.keys[b].index_select(1, cols), layer.values[b].index_select(1, cols))
                               for layer in cache.layers])


def lookup(store: KVStore, context: Sequence[int]) -> tuple[int, Slices | None]:
    """The longest saved key that is a proper prefix of ``context`` (at least one token must stay new, to give the
    next logits): ``(its length, its slices)``, or ``(0, None)``."""
    for n in sorted((n for n in store.lengths if n < len(context)), reverse=True):
        got = store.rows.get(tuple(context[:n]))
        if got is not None:
            return n, got
    return 0, None


def prime_cache(cache: Any, saved: Sequence[Slices | None], lengths: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    """Fill an empty ``cache`` with the saved rows, each right-aligned in ``A = max(lengths)`` columns
    (a row without a hit has ``lengths[j] = 0``); returns the mask of those columns ``[R, A]`` (long).

    Args:
        like: a tensor on the engine's device (the mask's device).
    """
    r, width = len(saved), max(lengths)
    mask = torch.zeros((r, width), dtype=torch.long, device=like.device)
    proto = next(s for s in saved if s is not None)
    for li in range(len(proto)):
        k0, v0 = proto[li]
        k = k0.new_zeros((r, k0.shape[0], width, k0.shape[2]))
        v = v0.new_zeros((r, v0.shape[0], width, v0.shape[2]))
        for j, (s, n) in enumerate(zip(saved, lengths)):
            if s is not None and n:
                k[j, :, width - n:] = s[li][0]
                v[j, :, width - n:] = s[li][1]
        cache.layers[li].update(k, v)
    for j, n in enumerate(lengths):
        if n:
            mask[j, width - n:] = 1
    return mask

"""HFEngine.kv_session: a later call whose contexts extend an earlier call's rows prefills only the new tokens,
and gives the same tokens and log-probs as recomputing the whole context (rlvr.engines.kv_reuse)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from rlvr.engines.hf import HFEngine
from rlvr.models import build_tiny_model
from rlvr.types import GenerationRequest, SamplingParams

EOS = 2
PROMPTS = ([5, 9, 13, 17], [7, 11, 15, 19, 23, 27, 31, 35, 39])


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model(0, initializer_range=0.05)


def _two_turns(engine, session: bool, eos_bias: bool, model):
    """Turn 1: two prompts of different lengths, 3 samples each (different caps); turn 2: every row's context +
    its tokens + an observation of a row-dependent length. Returns (turn-1 and turn-2 generations, the store)."""
    handle = None
    if eos_bias:  # rows finish at different steps: saved at different points, some pruned mid-chunk
        def hook(_m, _i, out):
            out = out.clone()
            out[..., EOS] += 4.0
            return out
        handle = model.lm_head.register_forward_hook(hook)
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    try:
        with engine.kv_session() if session else contextlib.nullcontext() as store:
            first = engine.generate([GenerationRequest(PROMPTS[0], n=3),
                                     GenerationRequest(PROMPTS[1], n=3, max_new_tokens=4)], params)
            later = [GenerationRequest(PROMPTS[i] + list(g.token_ids) + [40 + k for k in range(1 + (i + j) % 3)], n=1)
                     for i, gens in enumerate(first) for j, g in enumerate(gens)]
            second = engine.generate(later, SamplingParams(temperature=1.0, max_new_tokens=5, seed=3))
    finally:
        if handle is not None:
            handle.remove()
    return first, second, store


@pytest.mark.parametrize("continuous", [False, True], ids=["chunked", "continuous"])
@pytest.mark.parametrize("eos_bias", [False, True])
def test_session_gives_the_same_tokens_and_logprobs_as_full_prefill(tiny, eos_bias, continuous):
    model, tok = tiny
    # 6 rows, 4 slots: two chunks (or, continuous, rows admitted as slots free up), so saved rows come from both
    engine = HFEngine(model, tok, max_batch_size=4, continuous=continuous)
    f0, s0, _ = _two_turns(engine, False, eos_bias, model)
    f1, s1, store = _two_turns(engine, True, eos_bias, model)
    assert [[g.token_ids for g in gs] for gs in f0] == [[g.token_ids for g in gs] for gs in f1]
    assert [[g.token_ids for g in gs] for gs in s0] == [[g.token_ids for g in gs] for gs in s1]
    for a, b in zip(s0, s1):
        assert torch.allclose(torch.tensor(a[0].logprobs), torch.tensor(b[0].logprobs), atol=1e-4)
    assert store.hits == 6  # every turn-2 request found its turn-1 row
    # each row reused its prompt and all but the last sampled token: the rest (last token + observation) is new
    assert store.reused_tokens == sum(len(p) + len(g.token_ids) - 1 for p, gs in zip(PROMPTS, f1) for g in gs)
    assert engine._kv is None  # dropped at the session's end


def test_no_session_keeps_nothing_and_a_partial_match_is_not_reused(tiny):
    model, tok = tiny
    engine = HFEngine(model, tok, max_batch_size=8)
    params = SamplingParams(temperature=0.0, max_new_tokens=3)
    engine.generate([GenerationRequest([5, 9, 13], n=1)], params)
    assert engine._kv is None
    with engine.kv_session() as store:
        (g,), = engine.generate([GenerationRequest([5, 9, 13], n=1)], params)
        engine.generate([GenerationRequest([5, 9, 14] + list(g.token_ids), n=1)], params)  # differs inside the prompt
        assert store.hits == 0
        engine.generate([GenerationRequest([5, 9, 13] + list(g.token_ids) + [40], n=1)], params)
        assert store.hits == 1


def test_a_used_row_is_freed(tiny):
    model, tok = tiny
    engine = HFEngine(model, tok, max_batch_size=8)
    params = SamplingParams(temperature=0.0, max_new_tokens=3)
    with engine.kv_session() as store:
        (g,), = engine.generate([GenerationRequest([5, 9, 13], n=1)], params)
        assert len(store.rows) == 1
        engine.generate([GenerationRequest([5, 9, 13] + list(g.token_ids) + [40], n=1)], params)
        assert store.hits == 1 and len(store.rows) == 1  # the turn-1 row was freed, the turn-2 row is kept
        (key,) = store.rows
        assert len(key) == 3 + len(g.token_ids) + 1 + 2  # prompt, turn 1, observation, turn 2 minus its last token


def test_prefill_gives_the_lm_head_a_contiguous_input_and_leaves_no_hook(tiny):
    """logits_to_keep=1 slices the last position as a strided view; the engine makes it contiguous for the
    prefill (torch.matmul would otherwise broadcast the head's weight over the rows, a huge copy)."""
    model, tok = tiny
    seen = []
    handle = model.lm_head.register_forward_hook(lambda m, args, out: seen.append(args[0].is_contiguous()))
    try:
        HFEngine(model, tok, max_batch_size=8).generate(
            [GenerationRequest([5, 9, 13, 17], n=2), GenerationRequest([7, 11], n=1)], SamplingParams(max_new_tokens=3, seed=0))
    finally:
        handle.remove()
    assert seen and all(seen)
    assert not model.lm_head._forward_pre_hooks

"""Continuous batching in the HF engine (rlvr.engines.continuous): greedy outputs equal the chunked loop's,
seeded sampling is reproducible with valid log-probs, and finished rows' slots are really reused."""

from __future__ import annotations

import pytest
import torch

from rlvr.engines.continuous import merge_caches
from rlvr.engines.hf import HFEngine
from rlvr.engines.kv_cache import new_cache
from rlvr.models.tiny import build_tiny_model
from rlvr.types import GenerationRequest, SamplingParams

EOS = 2


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model(0, initializer_range=0.05)


@pytest.fixture()
def eos_bias(tiny):
    """EOS made likely so rows finish at different steps (ragged rows: what continuous batching is for)."""
    model, _ = tiny

    def hook(_mod, _inp, out):
        out = out.clone()
        out[..., EOS] += 4.0
        return out

    h = model.lm_head.register_forward_hook(hook)
    yield
    h.remove()


def _requests(caps: bool = True):
    """10 requests, 20 rows, contexts of 2-12 tokens; with ``caps`` their own caps of 2-12 new tokens (ragged
    rows under greedy decoding, where the random model rarely picks EOS)."""
    g = torch.Generator().manual_seed(0)
    cap = [12, 3, 7, 2, 12, 5, 9, 4, 12, 6]
    return [GenerationRequest([1] + torch.randint(3, 400, (int(k),), generator=g).tolist(), n=int(n),
                              max_new_tokens=c if caps else None)
            for k, n, c in zip(torch.randint(1, 12, (10,), generator=g), [1, 3, 2, 1, 4, 1, 2, 1, 3, 2], cap)]


def _tokens(out):
    return [[(g.token_ids, g.finish_reason) for g in gs] for gs in out]


@pytest.mark.parametrize("max_batch_size,cache", [(4, "append"), (5, "dynamic"), (64, "append")])
def test_greedy_outputs_equal_the_chunked_loop(tiny, max_batch_size, cache):
    model, tok = tiny
    reqs = _requests()  # 20 rows: more than the slots at 4 and 5
    p = SamplingParams(temperature=0.0, max_new_tokens=12)
    chunked = HFEngine(model, tok, max_batch_size=max_batch_size, cache=cache).generate(reqs, p)
    cont = HFEngine(model, tok, max_batch_size=max_batch_size, cache=cache, continuous=True).generate(reqs, p)
    assert _tokens(cont) == _tokens(chunked)
    assert len({len(g.token_ids) for gs in cont for g in gs}) > 2  # ragged: rows really finished apart
    for a, b in zip(cont, chunked):
        for x, y in zip(a, b):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)


def test_per_request_caps_are_kept(tiny):
    model, tok = tiny
    reqs = [GenerationRequest([1, 5, 9], n=2, max_new_tokens=3), GenerationRequest([1, 7], n=3, max_new_tokens=9),
            GenerationRequest([1, 30, 31, 32], n=2)]
    p = SamplingParams(temperature=0.0, max_new_tokens=9)
    cont = HFEngine(model, tok, max_batch_size=3, continuous=True).generate(reqs, p)
    assert _tokens(cont) == _tokens(HFEngine(model, tok, max_batch_size=3).generate(reqs, p))
    assert all(len(g.token_ids) <= cap for gs, cap in zip(cont, (3, 9, 9)) for g in gs)


def test_seeded_sampling_is_reproducible_and_its_logprobs_are_the_models(tiny, eos_bias):
    model, tok = tiny
    reqs = _requests(caps=False)
    p = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)
    eng = HFEngine(model, tok, max_batch_size=4, continuous=True)
    a, b = eng.generate(reqs, p), eng.generate(reqs, p)
    assert _tokens(a) == _tokens(b) and [len(gs) for gs in a] == [r.n for r in reqs]
    r, g = reqs[4], a[4][0]  # teacher forcing: the behaviour log-probs are the full model's
    ids = torch.tensor([r.context_ids + g.token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    c = len(r.context_ids)
    want = [float(logp[c - 1 + t, x]) for t, x in enumerate(g.token_ids)]
    assert g.logprobs == pytest.approx(want, abs=1e-4)


def test_finished_rows_slots_are_taken_by_waiting_requests(tiny, monkeypatch):
    model, tok = tiny
    eng = HFEngine(model, tok, max_batch_size=4, continuous=True)
    eng.prune_patience = 1  # compact (and admit) as soon as a row finishes
    events = []  # ("prefill", rows admitted) and ("step", rows decoded), in order
    orig_forward, orig_prefill = eng._forward, eng._prefill

    def forward(ids, mask, pos, cache):
        if ids.shape[1] == 1:
            events.append(("step", ids.shape[0]))
        return orig_forward(ids, mask, pos, cache)

    def prefill(requests, chunk, params):
        events.append(("prefill", sum(len(s) for _, s in chunk)))
        return orig_prefill(requests, chunk, params)

    monkeypatch.setattr(eng, "_forward", forward)
    monkeypatch.setattr(eng, "_prefill", prefill)
    reqs = [GenerationRequest([1, 10 + i], n=1, max_new_tokens=2 + i % 5) for i in range(12)]  # 12 requests, 4 slots
    out = eng.generate(reqs, SamplingParams(temperature=0.0, max_new_tokens=10))
    admitted = [n for kind, n in events if kind == "prefill"]
    assert sum(admitted) == 12 and admitted[0] == 4
    assert max(n for kind, n in events if kind == "step") <= 4  # never more rows than slots
    # a later admission joined rows still decoding: the next step ran more rows than were just admitted
    joined = [events[j + 1][1] > n for j, (kind, n) in enumerate(events[:-1])
              if kind == "prefill" and j > 0 and events[j + 1][0] == "step"]
    assert any(joined), events
    assert all(gs[0].finish_reason in ("eos", "length") for gs in out)
    chunked = HFEngine(model, tok, max_batch_size=4).generate(reqs, SamplingParams(temperature=0.0, max_new_tokens=10))
    assert _tokens(out) == _tokens(chunked)


def test_merge_caches_left_pads_the_shorter_and_stacks_rows(tiny):
    model, _ = tiny
    cfg = model.config
    a, _ = new_cache(cfg, 8, "append")
    b, _ = new_cache(cfg, 8, "append")
    for layer in range(len(a.layers)):
        a.layers[layer].update(torch.ones(2, 2, 3, 16), torch.ones(2, 2, 3, 16))
        b.layers[layer].update(2 * torch.ones(1, 2, 5, 16), 2 * torch.ones(1, 2, 5, 16))
    m = merge_caches(cfg, "append", a, b, 10)
    k = m.layers[0].keys
    assert k.shape == (3, 2, 5, 16)
    assert torch.equal(k[:2, :, :2], torch.zeros(2, 2, 2, 16)) and torch.equal(k[:2, :, 2:], torch.ones(2, 2, 3, 16))
    assert torch.equal(k[2], 2 * torch.ones(2, 5, 16))

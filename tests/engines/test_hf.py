"""HFEngine on a tiny random llama: contract, exactness of behaviour log-probs, determinism."""

from __future__ import annotations

import pytest
import torch

from rlvr.engines import continuous as loop_mod  # the decode loop (and its left trim) of both modes
from rlvr.engines.base import Engine
from rlvr.engines.hf import HFEngine
from rlvr.engines.sampling import sample_from_logits
from rlvr.models.tiny import build_tiny_model
from rlvr.types import Generation, GenerationRequest, SamplingParams

EOS = 2


@pytest.fixture(scope="module")
def tiny():
    model, tok = build_tiny_model(0, initializer_range=0.05)
    return model, tok


@pytest.fixture()
def eos_bias(tiny):
    """Make EOS likely (~25 % per step) so rows finish at different steps (exercises pruning)."""
    model, _ = tiny
    handles = []

    def install(bias: float = 6.0):
        def hook(_mod, _inp, out):
            out = out.clone()
            out[..., EOS] += bias
            return out

        handles.append(model.lm_head.register_forward_hook(hook))

    yield install
    for h in handles:
        h.remove()


@pytest.fixture()
def late_eos(tiny):
    """Force EOS (+20 logit) at every position >= ``start``: rows with long contexts end first.

    The bias depends on the absolute position only, so a teacher-forced forward sees the same one.
    """
    model, _ = tiny
    handles = []

    def install(start: int):
        seen = {}

        def pre(_mod, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            pos = kwargs.get("position_ids")
            seen["pos"] = pos if pos is not None else torch.arange(ids.shape[1]).expand_as(ids)

        def hook(_mod, _inp, out):
            pos = seen["pos"][:, -out.shape[1] :]  # logits_to_keep may cut positions
            out = out.clone()
            out[..., EOS] += 20.0 * (pos >= start).float()
            return out

        handles.append(model.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(model.lm_head.register_forward_hook(hook))

    yield install
    for h in handles:
        h.remove()


def _ctx(tok, text: str) -> list[int]:
    enc = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(enc["input_ids"])


def _teacher_logprobs(model, context: list[int], new: list[int], temperature: float) -> torch.Tensor:
    """Log-probs of ``new`` after ``context`` from one plain, unpadded full forward."""
    ids = torch.tensor([context + new])
    with torch.no_grad():
        logits = model(ids).logits[0].float() / temperature
    lp = logits.log_softmax(-1)[len(context) - 1 : len(context) - 1 + len(new)]
    return lp.gather(-1, torch.tensor(new)[:, None]).squeeze(-1)


def _requests(tok):
    return [
        GenerationRequest(_ctx(tok, "What is 12 + 7 and then 3 * 45 - 6?"), n=3),
        GenerationRequest(_ctx(tok, "2+2"), n=2),
        GenerationRequest([1, 40], n=1),
        GenerationRequest(_ctx(tok, "Compute 100 - 58, then add 9 and 14."), n=2),
    ]


def test_engine_satisfies_protocol(tiny):
    eng = HFEngine(*tiny)
    assert isinstance(eng, Engine)
    assert eng.eos_token_ids == {EOS}


def test_shapes_counts_and_finish_reasons(tiny, eos_bias):
    eos_bias(4.0)
    eng = HFEngine(*tiny)
    reqs = _requests(tiny[1])
    out = eng.generate(reqs, SamplingParams(max_new_tokens=12, seed=0))
    assert len(out) == len(reqs)
    reasons = set()
    for r, gens in zip(reqs, out):
        assert len(gens) == r.n
        for g in gens:
            assert isinstance(g, Generation)
            assert 1 <= len(g.token_ids) <= 12
            assert len(g.logprobs) == len(g.token_ids)
            assert all(lp <= 0 for lp in g.logprobs)
            # EOS appears only as the last token, exactly when finish_reason says so
            assert EOS not in g.token_ids[:-1]
            if g.finish_reason == "eos":
                assert g.token_ids[-1] == EOS
            else:
                assert g.finish_reason == "length"
                assert len(g.token_ids) == 12 and g.token_ids[-1] != EOS
            reasons.add(g.finish_reason)
    assert reasons == {"eos", "length"}


def test_max_new_tokens_one(tiny):
    out = HFEngine(*tiny).generate([GenerationRequest([1, 5, 6], n=2)], SamplingParams(max_new_tokens=1, seed=1))
    assert [len(g.token_ids) for g in out[0]] == [1, 1]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("cache,prune", [("append", True), ("dynamic", True), ("append", False)])
def test_logprobs_match_teacher_forcing(tiny, late_eos, temperature, cache, prune, monkeypatch):
    """Each row's returned log-probs equal a plain unpadded forward's, whatever shares its batch.

    Rows whose context is longest are made to end first, so finished rows are pruned and the
    left-padding columns only they used are trimmed off the cache mid-batch.
    """
    late_eos(22)
    model, tok = tiny
    trims = []
    orig = loop_mod.trim_left
    monkeypatch.setattr(loop_mod, "trim_left", lambda c, k: (trims.append(k), orig(c, k)))
    eng = HFEngine(model, tok, cache=cache, prune=prune)
    reqs = _requests(tok)[1:] + [GenerationRequest(_requests(tok)[0].context_ids, n=1)]
    assert len({len(r.context_ids) for r in reqs}) == len(reqs)  # different context lengths in one batch
    worst = 0.0
    for seed in range(2):
        out = eng.generate(reqs, SamplingParams(temperature=temperature, max_new_tokens=10, seed=seed))
        for r, gens in zip(reqs, out):
            for g in gens:
                ref = _teacher_logprobs(model, list(r.context_ids), g.token_ids, temperature)
                worst = max(worst, float((ref - torch.tensor(g.logprobs)).abs().max()))
    assert worst < 1e-4
    if prune:
        assert trims, "the left-trim path was not exercised"
    lengths = {len(r.context_ids): [len(g.token_ids) for g in gens] for r, gens in zip(reqs, out)}
    assert lengths[23] == [1] and max(lengths[11]) > 2


def test_prefix_continuation_returns_only_new_tokens(tiny):
    model, tok = tiny
    eng = HFEngine(model, tok)
    prompt = _ctx(tok, "What is 3 + 4?")
    greedy = SamplingParams(top_k=1, max_new_tokens=10)
    full = eng.generate([GenerationRequest(prompt)], greedy)[0][0].token_ids
    prefix = full[:4]
    cont = eng.generate([GenerationRequest(prompt + prefix)], SamplingParams(top_k=1, max_new_tokens=6))[0][0]
    assert cont.token_ids == full[4:10]
    ref = _teacher_logprobs(model, prompt + prefix, cont.token_ids, 1.0)
    assert torch.all(ref <= 0)


def test_n_samples_share_context_but_differ(tiny):
    out = HFEngine(*tiny).generate([GenerationRequest([1, 7, 8, 9], n=4)], SamplingParams(max_new_tokens=8, seed=3))
    seqs = {tuple(g.token_ids) for g in out[0]}
    assert len(seqs) == 4


def test_seed_determinism(tiny):
    eng = HFEngine(*tiny)
    reqs = _requests(tiny[1])
    p = SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=10, seed=11)
    a, b = eng.generate(reqs, p), eng.generate(reqs, p)
    assert a == b
    c = eng.generate(reqs, SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=10, seed=12))
    assert a != c
    # seed=None draws from torch's global RNG
    torch.manual_seed(5)
    d = eng.generate(reqs, SamplingParams(max_new_tokens=6))
    torch.manual_seed(5)
    assert eng.generate(reqs, SamplingParams(max_new_tokens=6)) == d


def test_top_k_1_is_greedy(tiny):
    model, tok = tiny
    eng = HFEngine(model, tok)
    reqs = [GenerationRequest(_ctx(tok, "What is 9 * 9?")), GenerationRequest([1, 33, 34])]
    out = eng.generate(reqs, SamplingParams(top_k=1, max_new_tokens=8, seed=0))
    for r, gens in zip(reqs, out):
        ids = torch.tensor([list(r.context_ids)])
        ref = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=8, pad_token_id=EOS
        )[0, ids.shape[1] :].tolist()
        if EOS in ref:
            ref = ref[: ref.index(EOS) + 1]
        assert gens[0].token_ids == ref
        assert gens[0].logprobs == [0.0] * len(ref)
    # a row's greedy output does not depend on its batch-mates
    alone = eng.generate(reqs[1:], SamplingParams(top_k=1, max_new_tokens=8))
    assert alone[0][0].token_ids == out[1][0].token_ids


def test_top_k_and_top_p_truncate_and_renormalise(tiny):
    model, tok = tiny
    ctx = _ctx(tok, "12 + 30")
    for params in (
        SamplingParams(top_k=5, max_new_tokens=6, seed=0),
        SamplingParams(top_p=0.3, temperature=0.8, max_new_tokens=6, seed=0),
        SamplingParams(top_k=40, top_p=0.5, max_new_tokens=6, seed=0),
    ):
        g = HFEngine(model, tok).generate([GenerationRequest(ctx, n=3)], params)[0]
        for gen in g:
            ids = torch.tensor([ctx + gen.token_ids])
            with torch.no_grad():
                logits = model(ids).logits[0, len(ctx) - 1 : -1].float() / params.temperature
            for t, (tok_id, lp) in enumerate(zip(gen.token_ids, gen.logprobs)):
                row = logits[t]
                vals, idx = row.sort(descending=True)
                if params.top_k:
                    vals, idx = vals[: params.top_k], idx[: params.top_k]
                probs = vals.softmax(-1)
                keep = (probs.cumsum(-1) - probs) < params.top_p
                kept = idx[keep]
                assert tok_id in kept.tolist()
                ref = vals[keep].log_softmax(-1)[kept.tolist().index(tok_id)]
                assert abs(float(ref) - lp) < 1e-4


def test_sample_from_logits_frequencies_and_nucleus():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(40_000, 4)
    g = torch.Generator().manual_seed(0)
    toks, lps = sample_from_logits(logits, generator=g)
    freq = torch.bincount(toks, minlength=4).float() / toks.numel()
    assert torch.allclose(freq, probs, atol=0.01)
    assert torch.allclose(lps, probs.log()[toks], atol=1e-6)
    # top_p keeps the smallest head whose mass reaches top_p
    for top_p, kept in ((0.45, [0]), (0.55, [0, 1]), (0.79, [0, 1]), (0.85, [0, 1, 2])):
        toks, lps = sample_from_logits(probs.log().expand(4000, 4), top_p=top_p, generator=g)
        assert set(toks.tolist()) == set(kept)
        ref = probs[kept].log() - probs[kept].sum().log()
        assert torch.allclose(lps, ref[torch.tensor([kept.index(t) for t in toks.tolist()])], atol=1e-5)
    # top-p on a wide vocabulary (candidate widening beyond 256)
    wide = torch.zeros(3, 5000)
    toks, lps = sample_from_logits(wide, top_p=0.9003, generator=g)  # keeps 4502 of 5000 (no float tie)
    assert torch.allclose(lps, torch.full((3,), -torch.log(torch.tensor(4502.0))), atol=1e-4)


def test_chunking_by_max_batch_size(tiny):
    model, tok = tiny
    reqs = _requests(tok) + [GenerationRequest([1, 50, 51], n=6)]
    p = SamplingParams(top_k=1, max_new_tokens=7)
    big = HFEngine(model, tok).generate(reqs, p)
    small = HFEngine(model, tok, max_batch_size=4).generate(reqs, p)
    assert [[g.token_ids for g in gs] for gs in big] == [[g.token_ids for g in gs] for gs in small]
    assert [len(gs) for gs in small] == [r.n for r in reqs]


def test_restores_training_mode_and_rejects_bad_input(tiny):
    model, tok = tiny
    eng = HFEngine(model, tok)
    model.train()
    try:
        eng.generate([GenerationRequest([1, 5])], SamplingParams(max_new_tokens=2, seed=0))
        assert model.training
        with pytest.raises(ValueError, match="empty context"):
            eng.generate([GenerationRequest([])], SamplingParams(max_new_tokens=2))
        assert model.training
    finally:
        model.eval()
    eng.generate([GenerationRequest([1, 5])], SamplingParams(max_new_tokens=2, seed=0))
    assert not model.training
    with pytest.raises(ValueError, match="n must be"):
        eng.generate([GenerationRequest([1], n=0)], SamplingParams())
    for bad in (-0.5, float("nan"), float("inf")):  # 0 is greedy (valid); negatives and non-finite are not
        with pytest.raises(ValueError, match="temperature"):
            eng.generate([GenerationRequest([1])], SamplingParams(temperature=bad))
    with pytest.raises(ValueError, match="top_p"):
        eng.generate([GenerationRequest([1])], SamplingParams(top_p=0.0))
    assert eng.generate([], SamplingParams()) == []


def test_load_weights(tiny):
    model, tok = tiny
    other, _ = build_tiny_model(1, initializer_range=0.05)
    mine, _ = build_tiny_model(0, initializer_range=0.05)
    eng = HFEngine(mine, tok)
    ptrs = {k: v.data_ptr() for k, v in mine.state_dict().items()}
    eng.load_weights(mine.state_dict())  # same storage: no-op
    eng.load_weights(mine)
    assert {k: v.data_ptr() for k, v in mine.state_dict().items()} == ptrs
    p = SamplingParams(top_k=1, max_new_tokens=6)
    req = [GenerationRequest([1, 5, 6, 7])]
    want = HFEngine(other, tok).generate(req, p)
    eng.load_weights(other.state_dict())
    assert eng.generate(req, p) == want
    assert {k: v.data_ptr() for k, v in mine.state_dict().items()} == ptrs  # copied in place
    with pytest.raises(KeyError, match="no tensors named"):
        eng.load_weights({"not.a.weight": torch.zeros(1)})


@pytest.mark.parametrize("prune", [True, False])
def test_per_request_cap_stops_rows_at_their_own_length(tiny, prune):
    """A request's ``max_new_tokens`` stops its rows there ("length"); other rows run to the call's cap.
    The capped rows' log-probs still equal a teacher-forced forward (they left the batch cleanly)."""
    model, tok = tiny
    eng = HFEngine(model, tok, prune=prune)
    eng.prune_patience = 1  # compact as soon as a row stops
    reqs = [GenerationRequest([1, 5, 6], n=3, max_new_tokens=3), GenerationRequest([1, 9], n=2),
            GenerationRequest([1, 4, 4, 7], n=2, max_new_tokens=7)]
    out = eng.generate(reqs, SamplingParams(max_new_tokens=10, seed=4))
    for gens, cap in zip(out, (3, 10, 7)):
        for g in gens:
            assert len(g.token_ids) <= cap
            assert (g.finish_reason == "length") == (len(g.token_ids) == cap and g.token_ids[-1] != EOS)
    assert any(len(g.token_ids) == 3 for g in out[0])
    g = out[0][0]
    ids = torch.tensor([[1, 5, 6] + g.token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, 2:-1], -1)
    ref = logp[torch.arange(len(g.token_ids)), torch.tensor(g.token_ids)]
    assert torch.allclose(ref, torch.tensor(g.logprobs), atol=1e-4)


def test_per_request_cap_out_of_range_is_rejected(tiny):
    eng = HFEngine(*tiny)
    for bad in (0, 11):
        with pytest.raises(ValueError, match=r"request 0: max_new_tokens must be in \[1, 10\]"):
            eng.generate([GenerationRequest([1, 5], max_new_tokens=bad)], SamplingParams(max_new_tokens=10))


def _argmax_decode(model, context: list[int], steps: int, eos: set[int]) -> list[int]:
    """Hand-rolled greedy decoding: full forward over the whole sequence at each step, no cache."""
    ids = list(context)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            tok = int(torch.argmax(logits))
            out.append(tok)
            ids.append(tok)
            if tok in eos:
                break
    return out


def test_temperature_zero_is_argmax_decoding(tiny, eos_bias):
    model, tok = tiny
    eos_bias(4.0)  # some rows end early, some run to the cap (exercises pruning under greedy)
    eng = HFEngine(model, tok)
    contexts = [[1, 5, 9, 12], [1, 7], [1, 30, 31, 32, 33, 34, 35], [1, 44, 45]]
    rng_before = torch.get_rng_state()
    params = SamplingParams(temperature=0.0, top_p=0.3, top_k=5, max_new_tokens=12)  # top-p/k ignored
    outs = eng.generate([GenerationRequest(c, n=3) for c in contexts], params)
    assert torch.equal(torch.get_rng_state(), rng_before)  # greedy consumes no randomness
    for c, gens in zip(contexts, outs):
        want = _argmax_decode(model, c, 12, eng.eos_token_ids)
        for g in gens:  # the n samples of a request are identical
            assert g.token_ids == want
            assert g.logprobs == [0.0] * len(want)
            assert g.finish_reason == ("eos" if want[-1] in eng.eos_token_ids else "length")


def test_greedy_ties_go_to_the_lowest_token_id():
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0], [5.0, 5.0, 5.0, 5.0]])
    toks, lps = sample_from_logits(logits, temperature=0.0)
    assert toks.tolist() == [1, 0] and lps.tolist() == [0.0, 0.0]

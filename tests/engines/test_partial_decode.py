"""Partial rollouts in the hf engine (rlvr.engines.partial): weights changed between two decode steps of rows
in flight. On the tiny model in fp32 the recorded per-token versions change at exactly the step of the change,
and each token's behaviour log-prob is the one of the weights that sampled it (recomputed by a full forward of
the old and of the new model); without a gate nothing changes."""

from __future__ import annotations

import copy

import pytest
import torch

from rlvr.engines.hf import HFEngine
from rlvr.models.tiny import build_tiny_model
from rlvr.types import GenerationRequest, SamplingParams

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=16, seed=3)
BOUNDARY = 5  # the weights change before decode step 5: tokens 0-4 are version 0's, 5- version 1's


def _contexts(tok):
    texts = ["What is 2 + 3?", "Compute 17 * 4 then add 9."]
    return [tok(f"<|im_start|>user\n{t}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
            for t in texts]


class ForcedPublish:
    """A decode gate that changes the weights (in place, as an optimizer step does) before step ``at``."""

    def __init__(self, model, at: int, sync=None) -> None:
        self.model, self.at, self.sync = model, at, sync
        self.version = 0
        self.calls = 0

    def between_steps(self) -> int:
        if self.calls == self.at:
            with torch.no_grad():
                g = torch.Generator().manual_seed(11)
                for p in self.model.parameters():
                    p.add_(0.3 * torch.randn(p.shape, generator=g))
            self.version = 1
            if self.sync is not None:
                self.sync(self.version)
        self.calls += 1
        return self.version


def recompute_logp(model, context, tokens, temperature=1.0):
    """``[L]`` log-probs of ``tokens`` after ``context`` by one full forward of ``model`` (fp32)."""
    ids = torch.tensor([list(context) + list(tokens)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(context) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


@pytest.mark.parametrize("continuous", [False, True])
def test_versions_and_behaviour_logprobs_switch_at_the_boundary(continuous):
    policy, tok = build_tiny_model(0)
    old = copy.deepcopy(policy)
    engine = HFEngine(policy, tok, continuous=continuous, max_batch_size=8)  # all rows in one batch
    engine.decode_gate = ForcedPublish(policy, BOUNDARY)
    contexts = _contexts(tok)
    out = engine.generate([GenerationRequest(context_ids=c, n=3) for c in contexts], PARAMS)
    new = policy
    spanned = 0
    for c, gens in zip(contexts, out):
        for g in gens:
            n = len(g.token_ids)
            assert g.versions == [0 if t < BOUNDARY else 1 for t in range(n)]
            lp = torch.tensor(g.logprobs)
            lp_old, lp_new = recompute_logp(old, c, g.token_ids), recompute_logp(new, c, g.token_ids)
            k = min(n, BOUNDARY)
            torch.testing.assert_close(lp[:k], lp_old[:k], atol=1e-4, rtol=0)  # fp32 KV decode vs a full forward: ~1e-5 apart
            assert not torch.allclose(lp[:k], lp_new[:k], atol=1e-3)  # the test can tell the versions apart
            if n > BOUNDARY:
                spanned += 1
                torch.testing.assert_close(lp[BOUNDARY:], lp_new[BOUNDARY:], atol=1e-4, rtol=0)  # fp32 KV decode vs a full forward: ~1e-5 apart
                assert not torch.allclose(lp[BOUNDARY:], lp_old[BOUNDARY:], atol=1e-3)
    assert spanned >= 3  # rows really were in flight at the change


def test_bf16_decode_copy_is_recast_at_the_boundary():
    """A cast decode copy (model.dtype=bf16 policy: fp32 masters, bf16 decode) is re-cast by the gate's
    caller; the tokens after the change are the new bf16 copy's (log-probs equal a forward of a bf16 cast of
    the new weights, up to bf16 rounding of the batched vs full forward)."""
    from rlvr.engines.hf import _cast_copy
    from rlvr.precision import PrecisionPolicy

    policy, tok = build_tiny_model(0)
    prec = PrecisionPolicy(mode="bf16", compute_dtype=torch.bfloat16)
    assert prec.generation_dtype == torch.bfloat16
    engine = HFEngine(policy, tok, precision=prec, max_batch_size=4)
    assert engine.casts_weights
    old16 = _cast_copy(policy, torch.bfloat16)
    engine.decode_gate = ForcedPublish(policy, BOUNDARY, sync=lambda v: engine.sync_weights(version=v))
    c = _contexts(tok)[0]
    gens = engine.generate([GenerationRequest(context_ids=c, n=3)], PARAMS)[0]
    new16 = _cast_copy(policy, torch.bfloat16)
    checked = 0
    for g in gens:
        if len(g.token_ids) <= BOUNDARY:
            continue
        checked += 1
        assert g.versions[BOUNDARY - 1:BOUNDARY + 1] == [0, 1]
        lp = torch.tensor(g.logprobs)
        after = lp[BOUNDARY:]
        d_new = (after - recompute_logp(new16, c, g.token_ids)[BOUNDARY:]).abs().max()
        d_old = (after - recompute_logp(old16, c, g.token_ids)[BOUNDARY:]).abs().max()
        assert d_new < 0.05 < d_old
    assert checked >= 2


def test_without_a_gate_nothing_changes():
    """No gate: no versions recorded, and a gate that never changes the weights gives the same tokens and
    log-probs bit for bit (the check itself does not perturb decoding)."""
    policy, tok = build_tiny_model(0)
    engine = HFEngine(policy, tok, max_batch_size=4)
    reqs = [GenerationRequest(context_ids=c, n=3) for c in _contexts(tok)]
    plain = engine.generate(reqs, PARAMS)
    assert all(g.versions is None for gens in plain for g in gens)
    engine.decode_gate = ForcedPublish(policy, at=10**9)
    gated = engine.generate(reqs, PARAMS)
    for a, b in zip(plain, gated):
        for x, y in zip(a, b):
            assert x.token_ids == y.token_ids and x.logprobs == y.logprobs
            assert y.versions == [0] * len(y.token_ids)

"""The policy on every path: the trainer's forwards autocast, the engine decodes with a bf16 copy kept
in sync, master weights and optimizer state stay fp32, the LM head's backward follows autocast."""

from __future__ import annotations

import copy

import pytest
import torch

from rlvr.core.logprobs import selective_log_softmax_and_entropy
from rlvr.engines.hf import HFEngine
from rlvr.errors import RlvrError
from rlvr.precision import model_precision, resolve_precision, set_model_precision
from rlvr.testing import small_config
from rlvr.trainer.forward import completion_logprobs
from rlvr.trainer.trainer import Trainer
from rlvr.types import GenerationRequest, SamplingParams


def _trainer(tmp_path, tiny, task, env, monkeypatch, *overrides):
    monkeypatch.setenv("RLVR_CPU_BF16", env)
    factory, tok = tiny
    return Trainer(small_config(tmp_path, *overrides), factory(0), tok, task)


def test_bf16_trains_with_fp32_master_weights(tmp_path, tiny, toy_task, monkeypatch):
    tr = _trainer(tmp_path, tiny, toy_task, "1", monkeypatch, "max_steps=1", "model.dtype=bf16")
    assert tr.precision.mode == "bf16" and model_precision(tr.model) is tr.precision
    assert tr.engine.decode_dtype == torch.bfloat16  # generation follows the policy
    last = tr.train()
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())  # master weights
    states = [s for s in tr.optimizer.state.values() if s]
    assert states and all(v.dtype == torch.float32 for s in states for k, v in s.items() if k != "step")
    assert torch.isfinite(torch.tensor(last["loss/total"]))
    assert last["actor/rollout_logp_diff"] > 1e-4  # bf16 decode vs bf16-autocast training: a real gap


def test_bf16_decode_copy_is_synced_before_each_round_after_fused_adamw(tmp_path, tiny, toy_task, monkeypatch):
    tr = _trainer(tmp_path, tiny, toy_task, "1", monkeypatch, "max_steps=1", "model.dtype=bf16")
    assert tr.optimizer.defaults.get("fused")  # fused AdamW does not bump the parameters' version counters
    tr.train()
    stale = [not torch.equal(s.to(torch.bfloat16), d) for s, d in zip(tr.model.parameters(),
                                                                       tr.engine._decode_model.parameters())]
    assert any(stale)  # the update changed the weights; the copy still holds the old ones
    tr.generate_batch()  # the next round syncs first
    for src, dst in zip(tr.model.parameters(), tr.engine._decode_model.parameters()):
        assert torch.equal(src.to(torch.bfloat16), dst)


def test_auto_without_native_bf16_is_fp32_everywhere(tmp_path, tiny, toy_task, monkeypatch):
    tr = _trainer(tmp_path, tiny, toy_task, "0", monkeypatch, "max_steps=1")
    assert tr.precision.mode == "fp32" and tr.engine.decode_dtype == torch.float32
    assert tr.engine._decode_model is tr.model  # no copy: the engine samples from the trained module
    last = tr.train()
    assert last["actor/rollout_logp_diff"] < 1e-4  # same precision on both sides: float noise only


def test_training_forward_autocasts_and_returns_fp32(tmp_path, tiny, toy_task, monkeypatch):
    tr = _trainer(tmp_path, tiny, toy_task, "0", monkeypatch)
    batch, _ = tr.generate_batch()
    fp32, _ = completion_logprobs(tr.model, batch, pad_token_id=tr.pad_token_id)
    set_model_precision(tr.model, resolve_precision("bf16", log=False))
    bf16, _ = completion_logprobs(tr.model, batch, pad_token_id=tr.pad_token_id)
    m = batch.completion_mask > 0
    assert bf16.dtype == torch.float32
    gap = (bf16 - fp32).detach()[m].abs()
    assert 1e-5 < float(gap.max()) < 0.2  # autocast really ran (bf16 rounding), and only rounding


def test_bf16_pure_needs_bf16_weights(tmp_path, tiny, toy_task, monkeypatch):
    with pytest.raises(RlvrError, match=r"bf16-pure.*bfloat16.*float32"):
        _trainer(tmp_path, tiny, toy_task, "0", monkeypatch, "model.dtype=bf16-pure")


def test_engine_bf16_copy_follows_in_place_updates(tiny):
    factory, tok = tiny
    model = factory(0)
    eng = HFEngine(model, tok, precision=resolve_precision("bf16", log=False))
    assert eng._decode_model is not model and eng.decode_dtype == torch.bfloat16
    assert all(b.dtype == torch.float32 for b in eng._decode_model.buffers() if b.is_floating_point())
    req, sp = [GenerationRequest([1, 5, 9], n=2)], SamplingParams(max_new_tokens=4, seed=0)
    eng.generate(req, sp)
    assert eng.sync_weights() is False  # nothing changed since the last call
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)  # an in-place update, as an optimizer step does
    eng.generate(req, sp)  # re-casts before decoding
    for src, dst in zip(model.parameters(), eng._decode_model.parameters()):
        assert torch.equal(src.to(torch.bfloat16), dst)
    assert all(not p.requires_grad for p in eng._decode_model.parameters())


def test_engine_bf16_logprobs_are_the_bf16_models(tiny):
    factory, tok = tiny
    model = factory(0)
    eng = HFEngine(model, tok, precision=resolve_precision("bf16", log=False))
    out = eng.generate([GenerationRequest([1, 5, 9], n=1)], SamplingParams(max_new_tokens=5, seed=3))[0][0]
    pure = copy.deepcopy(model).to(torch.bfloat16)
    ids = torch.tensor([[1, 5, 9] + out.token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(pure(input_ids=ids).logits.float(), -1)[0]
    want = [float(logp[2 + t, tok_id]) for t, tok_id in enumerate(out.token_ids)]
    assert out.logprobs == pytest.approx(want, abs=0.05)  # bf16 cached decode vs bf16 full forward


def test_lm_head_backward_runs_in_the_forwards_compute_dtype(monkeypatch):
    import rlvr.core.logprobs as lpmod

    seen = []
    orig = lpmod._chunk_logits

    def spy(*a):  # (hidden, weight, ...): the operands of the chunk's matmul
        seen.append(a[0].dtype == a[1].dtype == torch.bfloat16)
        return orig(*a)

    monkeypatch.setattr(lpmod, "_chunk_logits", spy)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(12, 16, generator=g, requires_grad=True)
    w = torch.randn(50, 16, generator=g, requires_grad=True)
    tgt = torch.randint(0, 50, (12,), generator=g)
    grads = {}
    for name, enabled in (("fp32", False), ("bf16", True)):
        h.grad = w.grad = None
        seen.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            lp, _ = selective_log_softmax_and_entropy(h, w, None, tgt, chunk_size=5, with_entropy=False,
                                                      keep_bytes=0)  # the recompute path
        assert lp.dtype == torch.float32
        lp.sum().backward()  # outside the autocast block, as loss.backward() usually is
        assert seen == [enabled] * 6  # 3 chunks forward + 3 recomputed in backward, all in the forward's dtype
        seen.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            kept, _ = selective_log_softmax_and_entropy(h, w, None, tgt, chunk_size=5, with_entropy=False)
        assert seen == [enabled] * 3 and torch.equal(kept, lp)  # within keep_bytes: no recompute
        grads[name] = (h.grad.clone(), w.grad.clone())
        assert w.grad.dtype == torch.float32
    for a, b in zip(grads["fp32"], grads["bf16"]):
        assert torch.allclose(a, b, rtol=0.05, atol=0.05)

"""``model.cast_lm_head_to_fp32`` and ``model.generation_autocast``: they reach the policy on every path, the
trainer's head runs in fp32, the engine decodes from the masters under autocast, and the engine's behaviour
log-probs then agree more closely with the trainer's than under the plain bf16 policy."""

from __future__ import annotations

import warnings

import torch

from rlvr.config import build_config
from rlvr.engines.hf import HFEngine
from rlvr.models import build_tiny_model
from rlvr.precision import resolve_precision, set_model_precision
from rlvr.samplers.group import GroupSampler, PromptEncoder
from rlvr.testing import ToyTask, small_config
from rlvr.trainer.forward import batch_logprobs, completion_logprobs
from rlvr.trainer.trainer import Trainer
from rlvr.types import GenerationRequest, SamplingParams

BF16 = resolve_precision("bf16", native_bf16=True, log=False)
BOTH = BF16.with_switches(lm_head_fp32=True, generation_autocast=True)


def _sample(model, tok, policy, prompts=4, gens=4, max_new=12):
    set_model_precision(model, None)
    engine = HFEngine(model, tok, precision=policy)
    task = ToyTask()
    enc = PromptEncoder(tok, task.system_prompt, 256)
    batch = GroupSampler(engine, enc, tok.pad_token_id).sample(
        task.problems("train")[:prompts], gens, SamplingParams(temperature=1.0, max_new_tokens=max_new, seed=0),
        first_group_id=0)
    set_model_precision(model, policy)
    logp, _ = batch_logprobs(model, batch, pad_token_id=tok.pad_token_id)
    set_model_precision(model, None)
    return engine, batch, logp


def test_config_switches_reach_trainer_and_engine(tmp_path, tiny, toy_task, monkeypatch):
    monkeypatch.setenv("RLVR_CPU_BF16", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the alias warning
        cfg = build_config(overrides=["cast_lm_head_to_fp32=true"])  # TRL's top-level name
    assert cfg.model.cast_lm_head_to_fp32 is True and cfg.model.generation_autocast is False
    assert build_config().model.cast_lm_head_to_fp32 is False  # off by default
    factory, tok = tiny
    tr = Trainer(small_config(tmp_path, "model.dtype=bf16", "model.cast_lm_head_to_fp32=true",
                              "model.generation_autocast=true", "max_steps=1"), factory(0), tok, toy_task)
    assert tr.precision.mode == "bf16" and tr.precision.lm_head_fp32 and tr.precision.generation_autocast
    assert not tr.engine.casts_weights and tr.engine.decode_dtype == torch.float32  # decodes from the masters
    last = tr.train()
    assert torch.isfinite(torch.tensor(last["loss/total"]))
    assert 0 < last["actor/rollout_logp_diff"] < 0.05


def test_trainer_fp32_head_is_closer_to_fp32_and_has_fp32_gradients():
    model, tok = build_tiny_model(0, initializer_range=0.2)
    _, batch, _ = _sample(model, tok, resolve_precision("fp32", log=False))
    out = {}
    for name, policy in (("fp32", resolve_precision("fp32", log=False)), ("bf16", BF16),
                         ("head32", BF16.with_switches(lm_head_fp32=True))):
        set_model_precision(model, policy)
        model.zero_grad(set_to_none=True)
        lp, _ = completion_logprobs(model, batch, pad_token_id=tok.pad_token_id, with_entropy=False)
        lp.sum().backward()
        out[name] = (lp.detach(), model.get_output_embeddings().weight.grad.clone())
    set_model_precision(model, None)
    m = batch.completion_mask > 0
    gap_bf16 = (out["bf16"][0] - out["fp32"][0])[m].abs().mean()
    gap_head32 = (out["head32"][0] - out["fp32"][0])[m].abs().mean()
    assert gap_head32 < gap_bf16  # the bf16 rounding of the logits is gone; the body's bf16 matmuls remain
    assert not torch.equal(out["head32"][0], out["bf16"][0])
    g = out["head32"][1]
    assert g.dtype == torch.float32 and torch.isfinite(g).all() and g.abs().sum() > 0


def test_engine_under_both_switches_agrees_more_closely_and_continuous_is_unchanged():
    model, tok = build_tiny_model(0, initializer_range=0.2)
    _, b_plain, lp_plain = _sample(model, tok, BF16)
    engine, b_both, lp_both = _sample(model, tok, BOTH)
    assert not engine.casts_weights  # no bf16 copy: the masters under autocast
    med = lambda a, b, mask: (a - b)[mask > 0].abs().median()  # noqa: E731
    plain = med(lp_plain, b_plain.sampler_logp, b_plain.completion_mask)
    both = med(lp_both, b_both.sampler_logp, b_both.completion_mask)
    assert both < 0.5 * plain, (float(both), float(plain))
    # continuous batching runs the same forward (the fp32 head, under the same autocast): same greedy tokens
    reqs = [GenerationRequest(list(b_both.context_ids[i]), n=1) for i in range(0, len(b_both), 4)] * 3
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    chunked = HFEngine(model, tok, precision=BOTH, max_batch_size=2).generate(reqs, greedy)
    cont = HFEngine(model, tok, precision=BOTH, max_batch_size=2, continuous=True).generate(reqs, greedy)
    assert [[g.token_ids for g in gs] for gs in chunked] == [[g.token_ids for g in gs] for gs in cont]

"""The vLLM engine against a real vLLM server on a tiny model (``make test-vllm``; CI runs it).

Skipped unless ``RLVR_VLLM_PYTHON`` names the vLLM environment's interpreter (``make test-vllm``
builds ``.venv-vllm`` and sets it). One server (``enforce_eager``, fp32) serves the module; the
trainer test starts and stops its own.
"""

from __future__ import annotations

import os
import re
import urllib.request

import pytest
import torch

from rlvr.config import build_config
from rlvr.engines.factory import build_engine
from rlvr.engines.vllm_engine import VLLMEngine
from rlvr.engines.weight_sync import sync_policy
from rlvr.models.tiny import build_tiny_model
from rlvr.types import GenerationRequest, SamplingParams

PY = os.environ.get("RLVR_VLLM_PYTHON")
pytestmark = pytest.mark.skipif(not PY, reason="RLVR_VLLM_PYTHON not set (run `make test-vllm`)")
EOS = 2
TINY = dict(hidden_size=128, num_heads=2, num_kv_heads=2, intermediate_size=256, initializer_range=0.5)
NON_NEUTRAL_GENERATION = dict(do_sample=True, temperature=0.3, repetition_penalty=1.3, min_p=0.2, top_k=5, top_p=0.5,
                              presence_penalty=0.5, frequency_penalty=0.5)


def vllm_overrides(tmp, *extra):
    return ["engine=vllm", f"vllm.python={PY}", "vllm.enforce_eager=true", "vllm.max_model_len=512",
            "vllm.dtype=float32", "vllm.cpu_kv_cache_gib=1", "vllm.startup_timeout_s=900",
            f"vllm.log_file={tmp}/vllm_server.log", *extra]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm")
    policy, tok = build_tiny_model(0, **TINY)
    # issue 25 item 1: sampling defaults vLLM would apply from the served generation_config.json (as
    # Qwen2.5-Instruct's repetition_penalty 1.1, min_p 0.05); every log-prob test below must still
    # match plain softmax(z/T), greedy must stay the argmax
    for k, v in NON_NEUTRAL_GENERATION.items():
        setattr(policy.generation_config, k, v)
    cfg = build_config(overrides=vllm_overrides(tmp))
    engine = build_engine(cfg, policy, tok, tmp)
    assert isinstance(engine, VLLMEngine)
    yield engine, policy, tok
    pid = engine.server.proc.pid
    engine.close()
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def _teacher_logprobs(model, context, tokens, temperature=1.0, top_k=0):
    """fp32 log-probs of ``tokens`` after ``context`` under softmax(logits/T), top-k renormalised."""
    with torch.no_grad():
        ids = torch.tensor([list(context) + list(tokens)])
        logits = model(ids).logits[0, len(context) - 1 : -1].float() / temperature
        if top_k:
            kth = logits.topk(top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return logits.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 50)])
def test_behaviour_logprobs_match_fp32_transformers(served, temperature, top_k):
    engine, policy, _ = served
    ctx = [1, 40, 41, 42, 43]
    out = engine.generate([GenerationRequest(ctx, n=4)],
                          SamplingParams(temperature=temperature, top_k=top_k, max_new_tokens=24, seed=1))[0]
    for g in out:
        assert len(g.logprobs) == len(g.token_ids) >= 1
        want = _teacher_logprobs(policy, ctx, g.token_ids, temperature, top_k)
        assert torch.allclose(torch.tensor(g.logprobs), want, atol=1e-4), (g.logprobs, want.tolist())


def test_served_generation_config_carries_non_neutral_defaults_and_the_server_ignores_them(served):
    """The fixture's folder holds the non-neutral defaults; a request that sets no sampling field but
    the temperature (as a client of a server started without rlvr's body) still samples softmax(z/T):
    rlvr's server runs with --generation-config vllm."""
    import json
    from pathlib import Path

    engine, policy, _ = served
    folder = Path(engine.server.model_dir)
    saved = json.loads((folder / "generation_config.json").read_text())
    assert saved["repetition_penalty"] == 1.3 and saved["min_p"] == 0.2 and saved["top_k"] == 5
    ctx = [1, 40, 41, 42, 43]
    answer = engine.client.completions({"model": engine.model_name, "prompt": ctx, "n": 4, "max_tokens": 16,
                                        "temperature": 1.0, "logprobs": 0, "return_token_ids": True})
    for choice in answer["choices"]:
        tokens = choice["token_ids"]
        got = torch.tensor(choice["logprobs"]["token_logprobs"])
        assert torch.allclose(got, _teacher_logprobs(policy, ctx, tokens), atol=1e-4), (got, tokens)


def test_per_request_caps_seeds_and_greedy(served):
    engine, policy, _ = served
    engine.seed_requests = True  # short prompts: no split prefill, so vLLM's CPU seeded path is safe
    reqs = [GenerationRequest([1, 5, 6], n=3, max_new_tokens=3), GenerationRequest([1, 7, 8, 9], n=2)]
    p = SamplingParams(max_new_tokens=10, seed=5)
    a, b = engine.generate(reqs, p), engine.generate(reqs, p)
    assert [[g.token_ids for g in r] for r in a] == [[g.token_ids for g in r] for r in b]  # same seed, same draws
    assert all(len(g.token_ids) <= 3 for g in a[0]) and all(len(g.token_ids) <= 10 for g in a[1])
    assert all(g.finish_reason == "length" for g in a[0] if len(g.token_ids) == 3 and g.token_ids[-1] != EOS)
    greedy = engine.generate([GenerationRequest([1, 5, 6], n=2)], SamplingParams(temperature=0, max_new_tokens=6))[0]
    ids = [1, 5, 6]
    with torch.no_grad():
        for _ in range(len(greedy[0].token_ids)):
            ids.append(int(policy(torch.tensor([ids])).logits[0, -1].argmax()))
    assert greedy[0].token_ids == greedy[1].token_ids == ids[3:]
    assert all(x == 0.0 for x in greedy[0].logprobs)
    engine.seed_requests = False


def _prefix_hits(engine) -> float:
    text = urllib.request.urlopen(engine.client.url + "/metrics", timeout=10).read().decode()
    return sum(float(m) for m in re.findall(r'^vllm:prefix_cache_hits(?:_total)?\{[^}]*\} ([0-9.e+]+)$', text, re.M))


def test_continuation_from_a_prefix_uses_the_prefix_cache(served):
    engine, _, _ = served
    prompt = [1] + [10 + (i % 200) for i in range(300)]
    first = engine.generate([GenerationRequest(prompt)], SamplingParams(max_new_tokens=8, seed=0))[0][0]
    before = _prefix_hits(engine)
    cont = engine.generate([GenerationRequest(prompt + first.token_ids, n=2, max_new_tokens=4)],
                           SamplingParams(max_new_tokens=8, seed=1))[0]
    assert all(1 <= len(g.token_ids) <= 4 for g in cont)
    assert _prefix_hits(engine) - before >= 256  # the shared prompt's full blocks were reused


def test_weight_sync_then_eos_and_greedy_follow_the_new_weights(served):
    engine, policy, tok = served
    new, _ = build_tiny_model(1, **TINY)
    with torch.no_grad():  # make EOS likely: its (tied) head row along the mean final hidden state
        h = new(torch.tensor([list(range(1, 16))]), output_hidden_states=True).hidden_states[-1][0].mean(0)
        new.model.embed_tokens.weight[EOS] = h / h.norm() * 4.0
    assert sync_policy(engine, new, 7) and engine.generation_sync.version == 7
    out = engine.generate([GenerationRequest([1, 5, 6], n=8)], SamplingParams(max_new_tokens=12, seed=0))[0]
    assert any(g.finish_reason == "eos" for g in out)
    for g in out:
        if g.finish_reason == "eos":
            assert g.token_ids[-1] == EOS
        want = _teacher_logprobs(new, [1, 5, 6], g.token_ids)
        assert torch.allclose(torch.tensor(g.logprobs), want, atol=1e-4)
    sync_policy(engine, policy, 8)  # back to the module's policy for the other tests
    g = engine.generate([GenerationRequest([1, 40, 41])], SamplingParams(max_new_tokens=6, seed=2))[0][0]
    assert torch.allclose(torch.tensor(g.logprobs), _teacher_logprobs(policy, [1, 40, 41], g.token_ids), atol=1e-4)


def test_trainer_on_a_vllm_server_it_owns(tmp_path, toy_task):
    from rlvr.testing import small_config
    from rlvr.trainer.trainer import Trainer

    policy, tok = build_tiny_model(0, **TINY)
    cfg = small_config(tmp_path / "run", "max_steps=2", "model.dtype=fp32", *vllm_overrides(tmp_path))
    trainer = Trainer(cfg, policy, tok, toy_task)
    try:
        pid = trainer.engine.server.proc.pid
        last = trainer.train()
        assert trainer.engine.generation_sync.pushes == 1 and trainer.global_step == 2
        assert "reward/mean" in last or last
    finally:
        trainer.close()
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"

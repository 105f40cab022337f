"""Episodes on the vLLM server engine (token ids in, token ids + log-probs out), against the fake server
of ``tests/fake_vllm_server.py``: later turns send prompt + trajectory so far as token ids."""

from __future__ import annotations

import copy

from conftest import EOS, CountingEnv
from fake_vllm_server import FakeVLLM

from rlvr.engines.vllm_engine import VLLMClient, VLLMEngine
from rlvr.models.tiny import build_tiny_model
from rlvr.tasks.base import Problem
from rlvr.types import SamplingParams


def test_multiturn_episodes_over_the_vllm_engine(make_sampler):
    policy, tok = build_tiny_model(0, initializer_range=0.3)
    with FakeVLLM(copy.deepcopy(policy), tok) as fake:
        eng = VLLMEngine(VLLMClient(fake.url, timeout_s=30), eos_token_ids={EOS}, max_concurrency=4)
        s = make_sampler(eng, lambda: CountingEnv(2), max_tokens=60)
        b = s.sample([Problem(uid="p", question="1 + 1 =", answer="2")], 2, SamplingParams(max_new_tokens=5))
        prompts = [body["prompt"] for path, body, _ in fake.calls if path == "/v1/completions"]
    assert len(prompts) >= 2 and prompts[0] == b.context_ids[0]  # turn 1: one request, n = 2
    for i in range(2):
        k = int(b.completion_mask[i].sum())
        row = b.context_ids[i] + b.completion_ids[i, :k].tolist()
        later = [p for p in prompts[1:] if row[: len(p)] == p]  # turn 2 continued this row's exact tokens
        assert later
        lp = b.sampler_logp[i, :k][b.loss_mask[i, :k] == 1]
        assert (lp < 0).all() and (b.sampler_logp[i, :k][b.loss_mask[i, :k] == 0] == 0).all()
    assert b.metrics["env/turns_mean"] == 2 and b.metrics["env/model_tokens"] > 0

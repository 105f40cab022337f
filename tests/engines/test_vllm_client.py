"""The vLLM engine's client logic against a fake server (no vLLM needed): request bodies, parsing,
greedy, errors, weight sync order and content, and a trainer run whose rounds use the synced weights."""

from __future__ import annotations

import copy

import pytest
import torch
from fake_vllm_server import FakeVLLM, checksum

from rlvr.engines.base import Engine
from rlvr.engines.hf import HFEngine
from rlvr.engines.vllm_engine import VLLMClient, VLLMEngine, request_seed
from rlvr.engines.vllm_server import VLLMServerError
from rlvr.engines.weight_sync import FilesystemWeightSync, ServerWeightSync, export_state_dict, sync_policy
from rlvr.models.tiny import build_tiny_model
from rlvr.types import GenerationRequest, SamplingParams

EOS = 2


@pytest.fixture()
def served():
    """``(fake, engine, policy)``: a fake server on its own copy of a tiny model, and an engine on it."""
    policy, tok = build_tiny_model(0, initializer_range=0.3)
    with FakeVLLM(copy.deepcopy(policy), tok) as fake:
        eng = VLLMEngine(VLLMClient(fake.url, timeout_s=30), eos_token_ids={EOS}, max_concurrency=4)
        yield fake, eng, policy


def _completion_bodies(fake):
    return [b for p, b, _ in fake.calls if p == "/v1/completions"]


def test_protocol_and_request_bodies(served):
    fake, eng, _ = served
    assert isinstance(eng, Engine)
    reqs = [GenerationRequest([1, 5, 6], n=3), GenerationRequest([1, 7], n=2, max_new_tokens=4)]
    out = eng.generate(reqs, SamplingParams(temperature=0.9, top_p=0.95, top_k=20, max_new_tokens=6, seed=11))
    assert [len(o) for o in out] == [3, 2]
    bodies = sorted(_completion_bodies(fake), key=lambda b: len(b["prompt"]), reverse=True)
    assert [b["prompt"] for b in bodies] == [[1, 5, 6], [1, 7]]
    assert [b["n"] for b in bodies] == [3, 2]
    assert [b["max_tokens"] for b in bodies] == [6, 4]  # per-request cap
    for b in bodies:
        assert b["logprobs"] == 0 and b["return_token_ids"] is True and b["stop_token_ids"] == [EOS]
        assert b["temperature"] == 0.9 and b["top_p"] == 0.95 and b["top_k"] == 20
        # issue 25 item 1: no field left for vLLM to fill from the model's generation_config.json
        assert (b["repetition_penalty"], b["presence_penalty"], b["frequency_penalty"], b["min_p"]) == (1.0, 0.0, 0.0, 0.0)
    assert [b["seed"] for b in bodies] == [request_seed(11, 0), request_seed(11, 1)]
    assert request_seed(11, 0) != request_seed(11, 1) and request_seed(11, 0) != request_seed(12, 0)
    assert all(len(g.token_ids) <= 4 for g in out[1])
    eng.seed_requests = False  # the config default (vLLM CPU crashes on split seeded prefills)
    eng.generate(reqs, SamplingParams(max_new_tokens=6, seed=11))
    assert all("seed" not in b for b in _completion_bodies(fake)[2:])


def test_parse_matches_the_server_generation(served):
    """Tokens, log-probs and finish reasons come back in order: the same as the server-side engine
    produces for the same request and seed."""
    fake, eng, policy = served
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)
    reqs = [GenerationRequest([1, 9, 4, 4], n=4), GenerationRequest([1, 3], n=2)]
    got = eng.generate(reqs, params)
    ref = HFEngine(copy.deepcopy(policy), fake.tokenizer)
    for i, r in enumerate(reqs):
        want = ref.generate([r], SamplingParams(temperature=1.0, max_new_tokens=12, seed=request_seed(3, i)))[0]
        assert [g.token_ids for g in got[i]] == [w.token_ids for w in want]
        assert [g.finish_reason for g in got[i]] == [w.finish_reason for w in want]
        for g, w in zip(got[i], want):
            assert g.logprobs == pytest.approx(w.logprobs, abs=1e-6)
            assert (g.finish_reason == "eos") == (g.token_ids[-1] == EOS)
            assert len(g.logprobs) == len(g.token_ids)


def test_eos_kept_and_finish_reasons(served):
    fake, eng, _ = served
    # make EOS near-certain: the fake's model gets a large EOS bias, so rows end early with "eos"
    with torch.no_grad():
        fake.model.model.embed_tokens.weight[EOS] *= 0  # tied head: EOS logit 0; others random
        fake.model.model.embed_tokens.weight[EOS, 0] = 50.0
        fake.model.model.norm.weight.fill_(1.0)
    out = eng.generate([GenerationRequest([1, 5], n=8)], SamplingParams(max_new_tokens=16, seed=0))[0]
    reasons = {g.finish_reason for g in out}
    assert "eos" in reasons
    for g in out:
        if g.finish_reason == "eos":
            assert g.token_ids[-1] == EOS and EOS not in g.token_ids[:-1]
        else:
            assert len(g.token_ids) == 16


def test_greedy_contract(served):
    fake, eng, policy = served
    out = eng.generate([GenerationRequest([1, 5, 6], n=3)], SamplingParams(temperature=0.0, max_new_tokens=5))[0]
    (body,) = _completion_bodies(fake)
    assert body["n"] == 1 and body["temperature"] == 0.0 and "seed" not in body
    # greedy evaluation runs with no repetition penalty, whatever the model's generation config says
    assert {k: body[k] for k in ("repetition_penalty", "presence_penalty", "frequency_penalty", "min_p", "top_p", "top_k")} == {
        "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0, "top_p": 1.0, "top_k": -1}
    assert len(out) == 3 and all(g.token_ids == out[0].token_ids for g in out)
    assert all(lp == 0.0 for g in out for lp in g.logprobs)
    with torch.no_grad():  # the argmax continuation of the policy
        ids = [1, 5, 6]
        for _ in range(len(out[0].token_ids)):
            ids.append(int(policy(torch.tensor([ids])).logits[0, -1].argmax()))
    assert out[0].token_ids == ids[3:]


@pytest.mark.parametrize(
    "reqs,params,match",
    [
        ([GenerationRequest([], n=1)], SamplingParams(), "request 0: empty context_ids"),
        ([GenerationRequest([1], n=0)], SamplingParams(), "n must be >= 1"),
        ([GenerationRequest([1], n=1, max_new_tokens=9)], SamplingParams(max_new_tokens=8), r"max_new_tokens must be in \[1, 8\]"),
        ([GenerationRequest([1])], SamplingParams(temperature=-1.0), "temperature must be >= 0"),
        ([GenerationRequest([1])], SamplingParams(top_p=0.0), "top_p"),
    ],
)
def test_bad_requests_fail_before_any_http(served, reqs, params, match):
    fake, eng, _ = served
    with pytest.raises(ValueError, match=match):
        eng.generate(reqs, params)
    assert fake.calls == []


def test_server_error_names_the_request(served):
    fake, eng, _ = served
    fake.fail_next["/v1/completions"] = 500
    with pytest.raises(VLLMServerError, match=r"request 0: .*HTTP 500.*injected failure"):
        eng.generate([GenerationRequest([1, 2])], SamplingParams(max_new_tokens=2, seed=0))
    eng.client.url = "http://127.0.0.1:9"  # nothing listens there
    with pytest.raises(VLLMServerError, match="failed"):
        eng.generate([GenerationRequest([1, 2])], SamplingParams(max_new_tokens=2, seed=0))


def test_export_state_dict_dedups_tied_weights_and_casts():
    policy, _ = build_tiny_model(0)
    sd = export_state_dict(policy, torch.bfloat16)
    assert "lm_head.weight" not in sd and "model.embed_tokens.weight" in sd  # tied: stored once
    assert all(t.dtype == torch.bfloat16 for t in sd.values())
    assert torch.equal(sd["model.norm.weight"], policy.model.norm.weight.detach().bfloat16())


def test_filesystem_sync_order_content_and_versions(served, tmp_path):
    fake, eng, policy = served
    eng.generation_sync = ServerWeightSync(FilesystemWeightSync(tmp_path / "w"), eng.client)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01)
    assert checksum(fake.model) != pytest.approx(checksum(policy))
    assert sync_policy(eng, policy, 1) is True
    assert fake.paths() == ["/pause?mode=wait", "/collective_rpc", "/reset_prefix_cache", "/resume"]
    assert fake.calls[1][1] == {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "w")}}
    for (n, a), b in zip(policy.state_dict().items(), fake.model.state_dict().values()):
        assert torch.equal(a, b), n
    assert not fake.paused and eng.generation_sync.version == 1
    assert sync_policy(eng, policy, 1) is False and len(fake.calls) == 4  # same version: nothing pushed
    # a failing reload still resumes the server, and the version is not advanced
    fake.fail_next["/collective_rpc"] = 500
    with pytest.raises(VLLMServerError, match="collective_rpc"):
        sync_policy(eng, policy, 2)
    assert fake.paths()[-1] == "/resume" and not fake.paused and eng.generation_sync.version == 1
    # a server without the dev-mode endpoints: the error says how to start it
    fake.fail_next["/pause"] = 404
    with pytest.raises(VLLMServerError, match="VLLM_SERVER_DEV_MODE=1"):
        sync_policy(eng, policy, 3)
    # a colocated engine needs no sync
    assert sync_policy(HFEngine(policy, fake.tokenizer), policy, 5) is False


def test_trainer_pushes_weights_before_each_round(tmp_path, toy_task):
    """engine=vllm with vllm.url: every round after the first is generated from the weights of the
    policy version its rows record (fake server's weight checksum at generation time)."""
    from rlvr.testing import small_config
    from rlvr.trainer.trainer import Trainer

    policy, tok = build_tiny_model(0)
    with FakeVLLM(copy.deepcopy(policy), tok) as fake:
        cfg = small_config(tmp_path / "run", "max_steps=3", "engine=vllm", f"vllm.url={fake.url}",
                           f"vllm.sync_dir={tmp_path / 'sync'}", "model.dtype=fp32",
                           "vllm.seed_requests=true")
        trainer = Trainer(cfg, policy, tok, toy_task)
        assert isinstance(trainer.engine, VLLMEngine)
        sums = {0: checksum(policy)}
        trainer.callbacks.append(lambda t, m: sums.__setitem__(t.global_step, checksum(t.model)))
        trainer.train()
        trainer.close()
    gen = [(c[2]) for c in fake.calls if c[0] == "/v1/completions"]
    per_round = len(gen) // 3
    assert per_round == cfg.prompts_per_generation and len(gen) == 3 * per_round
    for r in range(3):  # round r is generated after r updates, from exactly those weights
        assert all(s == pytest.approx(sums[r], rel=1e-12) for s in gen[r * per_round:(r + 1) * per_round])
    assert trainer.engine.generation_sync.pushes == 2
    assert fake.paths().count("/collective_rpc") == 2


def test_config_vllm_python_missing_is_a_config_error(tmp_path):
    from rlvr.config import build_config
    from rlvr.engines.factory import check_engine_config
    from rlvr.errors import ConfigError

    cfg = build_config(overrides=["engine=vllm", f"vllm.python={tmp_path}/nope/python"])
    with pytest.raises(ConfigError, match=r"vllm.python=.*does not exist.*make vllm-env"):
        check_engine_config(cfg)
    check_engine_config(build_config(overrides=["engine=vllm", "vllm.url=http://127.0.0.1:1"]))  # url: no local python needed
    with pytest.raises(ConfigError, match="vllm.url must start with http"):
        build_config(overrides=["engine=vllm", "vllm.url=localhost:8000"])


def test_served_policy_is_untied_with_the_same_outputs(tmp_path):
    """rlvr's servers get tied models untied (vLLM CPU keeps a prepacked head that an embedding-only
    reload would leave stale); the folder loads back to the same logits, and pushes carry the head."""
    import json

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rlvr.engines.factory import write_served_policy

    policy, tok = build_tiny_model(0)
    d = write_served_policy(policy, tok, tmp_path / "policy", torch.float32)
    assert json.loads((d / "config.json").read_text())["tie_word_embeddings"] is False
    sd = load_file(str(d / "model.safetensors"))
    assert torch.equal(sd["lm_head.weight"], sd["model.embed_tokens.weight"])
    x = torch.tensor([[1, 5, 6, 7]])
    assert torch.allclose(AutoModelForCausalLM.from_pretrained(d)(x).logits, policy(x).logits, atol=1e-6)
    pushed = FilesystemWeightSync(tmp_path / "w", tied="clone").write(policy.state_dict())
    assert "lm_head.weight" in load_file(str(pushed))
    with pytest.raises(ValueError, match="tied must be"):
        export_state_dict(policy, tied="keep")


def test_url_server_serving_the_model_untied_gets_the_new_head(tmp_path):
    """A vllm.url server may serve a tied model untied (started from write_served_policy's folder, as
    rlvr's own servers are): a push must carry lm_head.weight, or its head stays at the old weights."""
    from transformers import AutoModelForCausalLM

    from rlvr.config import build_config
    from rlvr.engines.factory import build_engine, write_served_policy

    policy, tok = build_tiny_model(0)
    assert policy.config.tie_word_embeddings
    served = AutoModelForCausalLM.from_pretrained(write_served_policy(policy, tok, tmp_path / "p", torch.float32))
    with FakeVLLM(served, tok) as fake:
        eng = build_engine(build_config(overrides=["engine=vllm", f"vllm.url={fake.url}", "vllm.dtype=float32",
                                                   f"vllm.sync_dir={tmp_path / 'sync'}"]), policy, tok, tmp_path)
        with torch.no_grad():
            policy.model.embed_tokens.weight.mul_(-2.0)  # tied: the head changes with it
        assert sync_policy(eng, policy, 1)
        assert torch.equal(fake.model.lm_head.weight, policy.model.embed_tokens.weight)
        assert torch.equal(fake.model.model.embed_tokens.weight, policy.model.embed_tokens.weight)
        eng.close()

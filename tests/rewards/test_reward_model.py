"""``type: reward_model`` on a tiny random LlamaForSequenceClassification built in-process."""

from __future__ import annotations

import pytest
import torch

from rlvr.config import build_config
from rlvr.errors import ConfigError
from rlvr.rewards.reward_model import RewardModelReward, resolve_device
from rlvr.tasks.base import Problem
from rlvr.models.tiny import build_tiny_reward_model

PROBLEMS = [Problem("a", "1 + 1 =", "2"), Problem("b", "What is 20 + 3?", "23"), Problem("c", "7 * 6", "42")]
TEXTS = ["2", "The answer is <answer>23</answer>, computed step by step.", "42 42 42 42"]


@pytest.fixture(scope="module")
def rm():
    return build_tiny_reward_model(0)


def direct_score(model, tok, problem, text):
    """The score of one conversation, unbatched (no padding anywhere)."""
    conv = [{"role": "user", "content": problem.question}, {"role": "assistant", "content": text}]
    ids = tok(tok.apply_chat_template(conv, tokenize=False), add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        return float(model(**ids).logits[0, 0])


def test_scores_are_the_unbatched_scores_in_input_order_for_any_batch_size(rm):
    model, tok = rm
    want = [direct_score(model, tok, p, t) for p, t in zip(PROBLEMS, TEXTS)]
    assert len(set(round(w, 6) for w in want)) == 3  # the three conversations score differently
    for bs in (1, 2, 8):
        r = RewardModelReward(model, tok, batch_size=bs)
        got = r.score(PROBLEMS, TEXTS)
        assert got.shape == (3,) and got.dtype == torch.float32 and not got.requires_grad
        assert got.tolist() == pytest.approx(want, abs=1e-5)
    m = r.pop_metrics()
    assert m["reward_model/calls"] == 3 and m["reward_model/seconds"] > 0
    assert r.pop_metrics()["reward_model/calls"] == 0


def test_the_reward_models_chat_template_renders_the_conversation(rm):
    model, tok = rm
    r = RewardModelReward(model, tok, system_prompt="Be brief.")
    text = r.render(PROBLEMS[0], "2")
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n1 + 1 =<|im_end|>\n<|im_start|>assistant\n2<|im_end|>\n"
    tok2 = build_tiny_reward_model(0)[1]
    tok2.chat_template = None
    assert RewardModelReward(model, tok2).render(PROBLEMS[0], "2") == "1 + 1 =\n2"


def test_max_length_keeps_the_end_of_the_conversation(rm):
    model, tok = rm
    long = "step " * 300 + "done"
    short = RewardModelReward(model, tok, max_length=16)
    full = RewardModelReward(model, tok, max_length=1024)
    assert float(short.score([PROBLEMS[0]], [long])[0]) != pytest.approx(float(full.score([PROBLEMS[0]], [long])[0]))
    ids = tok(short.render(PROBLEMS[0], long), add_special_tokens=False, return_tensors="pt")["input_ids"][:, -16:]
    with torch.no_grad():
        want = float(model(input_ids=ids).logits[0, 0])
    assert float(short.score([PROBLEMS[0]], [long])[0]) == pytest.approx(want, abs=1e-5)


def test_a_multi_label_head_reads_label_index(rm):
    model, tok = build_tiny_reward_model(0, num_labels=3)
    conv = tok.apply_chat_template([{"role": "user", "content": "1 + 1 ="}, {"role": "assistant", "content": "2"}],
                                   tokenize=False)
    with torch.no_grad():
        logits = model(**tok(conv, add_special_tokens=False, return_tensors="pt")).logits[0]
    got = RewardModelReward(model, tok, label_index=2).score(PROBLEMS[:1], ["2"])
    assert float(got[0]) == pytest.approx(float(logits[2]), abs=1e-5)


def test_loads_a_saved_classifier_by_name_or_path(rm, tmp_path):
    model, tok = rm
    model.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    cfg = build_config(overrides=[f"rewards=[{{type: reward_model, name_or_path: '{tmp_path / 'rm'}', batch_size: 2, device: cpu}}]"])
    loaded = RewardModelReward.from_config(cfg.rewards[0])
    assert loaded.batch_size == 2 and loaded.device == torch.device("cpu")
    assert loaded.score(PROBLEMS, TEXTS).tolist() == pytest.approx(
        RewardModelReward(model, tok).score(PROBLEMS, TEXTS).tolist(), abs=1e-5)


def test_a_missing_reward_model_is_a_load_error_naming_the_key(tmp_path):
    from rlvr.errors import ModelLoadError

    cfg = build_config(overrides=[f"rewards=[{{type: reward_model, name_or_path: '{tmp_path / 'nope'}'}}]"])
    with pytest.raises(ModelLoadError, match="reward_model name_or_path="):
        RewardModelReward.from_config(cfg.rewards[0])


def test_device_resolution():
    assert resolve_device("trainer", None) == torch.device("cpu")
    assert resolve_device("trainer", torch.device("cpu")) == torch.device("cpu")
    assert resolve_device("cuda:1", None) == torch.device("cuda:1")


@pytest.mark.parametrize("entry, message", [
    ("{type: reward_model}", "rewards[0]: type: reward_model needs the key name_or_path"),
    ("{type: reward_model, name_or_path: tiny, batch_size: 0}", "rewards[0].batch_size: Input should be greater"),
    ("{type: reward_model, name_or_path: tiny, device: gpu}", "device must be trainer, cpu, cuda or cuda:N"),
    ("{type: reward_model, name_or_path: tiny, normalise: group}", "did you mean 'rewards[0].normalize'"),
    ("{type: reward_model, name_or_path: tiny, rubric: x}", "key rubric is not read by type: reward_model"),
    ("{type: reward_model, name_or_path: tiny, weight: .nan}", "rewards[0].weight"),
])
def test_bad_reward_model_config_names_the_key(entry, message):
    with pytest.raises(ConfigError) as e:
        build_config(overrides=[f"rewards=[{entry}]"])
    assert message in str(e.value)

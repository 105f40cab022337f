"""``type: reward_model`` under faults: a batch deadline checked between mini-batches, a forward that
raises (a device OOM) or overflows in one mini-batch, inputs past the model's position table; on tiny
random classifiers built in-process."""

from __future__ import annotations

import time

import pytest
import torch

from rlvr.config import build_config
from rlvr.errors import ConfigError
from rlvr.models.tiny import build_tiny_reward_model, build_tiny_tokenizer
from rlvr.rewards.reward_model import RewardModelReward
from rlvr.tasks.base import Problem

P = Problem("q", "What is 2 + 3?", "5")
TEXTS = ["5", "It is 5.", "The sum of 2 and 3 is 5, so 5.", "2 + 3 = 5 " * 4, "five " * 12, "5 " * 30,
         "x " * 40, "y " * 50]


@pytest.fixture()
def rm():
    """A fresh model per test: the tests hook its forward."""
    return build_tiny_reward_model(0)


def lengths(r: RewardModelReward, texts: list[str]) -> list[int]:
    return [len(r.tokenizer(r.render(P, t), add_special_tokens=False)["input_ids"]) for t in texts]


def unbatched(r: RewardModelReward, texts: list[str]) -> list[float]:
    """Each row's score in a forward of its own (no padding; before any hook is set)."""
    out = []
    for t in texts:
        ids = r.tokenizer(r.render(P, t), add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out.append(float(r.model(input_ids=ids).logits[0, 0]))
    return out


def test_a_slow_forward_is_cut_at_the_batch_deadline_and_counted(rm, recwarn):
    """8 mini-batches of 0.4 s would hold the step 3.2 s; the 0.5 s deadline stops starting new ones, so
    the call returns after at most the deadline plus one forward, the rows left scoring failure_score."""
    model, tok = rm
    want = unbatched(RewardModelReward(model, tok), TEXTS)
    model.register_forward_pre_hook(lambda *a: time.sleep(0.4))
    r = RewardModelReward(model, tok, batch_size=1, batch_timeout_s=0.5, failure_score=-7.0)
    t0 = time.perf_counter()
    got = r.score([P] * len(TEXTS), TEXTS).tolist()
    took = time.perf_counter() - t0
    m = r.pop_metrics()
    assert took < 2.0  # unbounded: >= 3.2 s
    cut = [i for i, g in enumerate(got) if g == -7.0]
    assert len(cut) >= 6 and m["reward_model/timeouts"] == len(cut) == m["reward_model/failures"]
    assert m["reward_model/calls"] == len(TEXTS)
    for i, g in enumerate(got):  # the rows scored before the deadline have their real scores
        if i not in cut:
            assert g == pytest.approx(want[i], abs=1e-5)
    # the longest rows are the ones cut (mini-batches run shortest first)
    n = lengths(r, TEXTS)
    assert min(n[i] for i in cut) >= max([n[i] for i in range(len(TEXTS)) if i not in cut], default=0)
    assert "batch_timeout_s=0.5" in str(recwarn.pop(UserWarning).message)


@pytest.mark.parametrize("batch_size", [1, 2, 3])
def test_an_exception_in_one_mini_batch_fails_only_its_rows(rm, batch_size, recwarn):
    """A device OOM in the first forward: that mini-batch's rows (the shortest ``batch_size``) score
    failure_score and are counted; the other mini-batches are scored; the next call is whole again."""
    model, tok = rm
    want = unbatched(RewardModelReward(model, tok), TEXTS)
    calls = []

    def oom_once(*_):
        calls.append(1)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    model.register_forward_pre_hook(oom_once)
    r = RewardModelReward(model, tok, batch_size=batch_size, failure_score=-3.0)
    got = r.score([P] * len(TEXTS), TEXTS).tolist()
    m = r.pop_metrics()
    n = lengths(r, TEXTS)
    failed = sorted(range(len(TEXTS)), key=lambda i: n[i])[:batch_size]
    assert [i for i, g in enumerate(got) if g == -3.0] == sorted(failed)
    assert all(g == pytest.approx(w, abs=1e-5) for i, (g, w) in enumerate(zip(got, want)) if i not in failed)
    assert m["reward_model/failures"] == batch_size and m["reward_model/timeouts"] == 0
    assert "OutOfMemoryError" in str(recwarn.pop(UserWarning).message)
    assert r.score([P] * len(TEXTS), TEXTS).tolist() == pytest.approx(want, abs=1e-5)
    assert r.pop_metrics()["reward_model/failures"] == 0


def test_a_non_finite_score_fails_its_row_not_the_batch(rm):
    """An fp16 overflow gives inf / NaN logits; a NaN reward would poison the weighted sum and the group's
    advantages, so that row scores failure_score and is counted."""
    model, tok = rm
    want = unbatched(RewardModelReward(model, tok), TEXTS[:3])

    def nan_row0(_mod, _args, out):
        out.logits[0, 0] = float("nan")
        return out

    model.register_forward_hook(nan_row0)
    r = RewardModelReward(model, tok, batch_size=8, failure_score=-1.0)
    with pytest.warns(UserWarning, match="1 non-finite scores"):
        got = r.score([P] * 3, TEXTS[:3]).tolist()
    assert got[0] == -1.0 and got[1:] == pytest.approx(want[1:], abs=1e-5)  # TEXTS[0] is the shortest: row 0
    assert r.pop_metrics()["reward_model/failures"] == 1


def test_a_long_input_is_truncated_to_the_models_position_table():
    """A learned-position model (GPT-2: 32 positions here) indexes past its table on a longer input;
    ``max_length`` (1024) is capped at the model's limit, so the input keeps its last 32 tokens."""
    from transformers import GPT2Config, GPT2ForSequenceClassification

    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    model = GPT2ForSequenceClassification(GPT2Config(
        vocab_size=len(tok), n_positions=32, n_embd=32, n_layer=1, n_head=2, num_labels=1,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)).eval()
    with pytest.warns(UserWarning, match=r"max_length=1024 is more than the reward model takes \(32 tokens"):
        r = RewardModelReward(model, tok, failure_score=-9.0)
    assert r.max_length == 32
    long = "step " * 100
    ids = tok(r.render(P, long), add_special_tokens=False, return_tensors="pt")["input_ids"]
    assert ids.shape[1] > 32
    with torch.no_grad():
        want = float(model(input_ids=ids[:, -32:]).logits[0, 0])
    got = r.score([P, P], ["5", long])
    assert float(got[1]) == pytest.approx(want, abs=1e-5)
    assert r.pop_metrics()["reward_model/failures"] == 0


def test_defaults_keep_normal_scoring_and_report_zero_failures(rm):
    model, tok = rm
    cfg = build_config(overrides=["rewards=[{type: reward_model, name_or_path: tiny, device: cpu}]"])
    e = cfg.rewards[0]
    assert e.batch_timeout_s == 300.0 and e.resolved_failure_score == "batch_min"
    r = RewardModelReward.from_config(e)
    assert r.batch_timeout_s == 300.0 and r.failure_score == "batch_min" and r.max_length == 1024
    assert r.score([P] * 3, TEXTS[:3]).tolist() == pytest.approx(unbatched(r, TEXTS[:3]), abs=1e-5)
    m = r.pop_metrics()
    assert (m["reward_model/calls"], m["reward_model/failures"], m["reward_model/timeouts"]) == (3, 0, 0)
    assert RewardModelReward(model, tok).batch_timeout_s == 300.0  # the constructor's default is the config's


def test_batch_timeout_s_and_failure_score_are_reward_model_keys():
    cfg = build_config(overrides=["rewards=[{type: reward_model, name_or_path: tiny, device: cpu, "
                                  "batch_timeout_s: 5, failure_score: -2.5}]"])
    r = RewardModelReward.from_config(cfg.rewards[0])
    assert (r.batch_timeout_s, r.failure_score) == (5.0, -2.5)
    cfg = build_config(overrides=["rewards=[{type: reward_model, name_or_path: tiny, "
                                  "batch_timeout_s: null}]"])
    assert cfg.rewards[0].batch_timeout_s is None
    with pytest.raises(ConfigError, match=r"rewards\[0\].batch_timeout_s"):
        build_config(overrides=["rewards=[{type: reward_model, name_or_path: tiny, batch_timeout_s: 0}]"])
    with pytest.raises(ConfigError, match=r"rewards\[0\].failure_score"):
        build_config(overrides=["rewards=[{type: reward_model, name_or_path: tiny, failure_score: .nan}]"])
    with pytest.raises(ConfigError, match="failure_score is not read by type: verifier"):
        build_config(overrides=["rewards=[{type: verifier, failure_score: 0}]"])


def test_bad_constructor_arguments_are_refused_by_name(rm):
    model, tok = rm
    with pytest.raises(ValueError, match="label_index=1 but the model's head has 1 label"):
        RewardModelReward(model, tok, label_index=1)
    with pytest.raises(ValueError, match="batch_timeout_s must be > 0"):
        RewardModelReward(model, tok, batch_timeout_s=0)
    with pytest.raises(ValueError, match="failure_score must be a finite number"):
        RewardModelReward(model, tok, failure_score=float("nan"))


def test_batch_min_default_never_lets_a_failed_row_outscore_a_scored_one(rm, monkeypatch):
    """With the default ``batch_min`` a row whose mini-batch raised scores the lowest score of the rows that
    were scored (a reward model's scale is its own: a fixed 0.0 would beat its negative scores, paying a
    policy for breaking the scorer); when nothing was scored every row gets 0.0."""
    model, tok = rm
    r = RewardModelReward(model, tok, batch_size=1)
    want = unbatched(r, TEXTS[:4])
    real = r._forward
    calls = {"n": 0}

    def flaky(seqs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated OOM")
        return real(seqs)

    monkeypatch.setattr(r, "_forward", flaky)
    got = r.score([P] * 4, TEXTS[:4]).tolist()
    failed = [i for i in range(4) if abs(got[i] - want[i]) > 1e-5]
    assert len(failed) == 1
    scored = [want[i] for i in range(4) if i not in failed]
    assert got[failed[0]] == pytest.approx(min(scored), abs=1e-6)
    monkeypatch.setattr(r, "_forward", lambda seqs: (_ for _ in ()).throw(RuntimeError("down")))
    assert r.score([P] * 2, TEXTS[:2]).tolist() == [0.0, 0.0]


def test_failure_score_values_are_checked_per_type():
    from rlvr.errors import ConfigError

    with pytest.raises(ConfigError, match="batch_min is the reward model's"):
        build_config(overrides=["rewards=[{type: verifier}, {type: judge, base_url: 'http://x/v1', model: m, "
                                "failure_score: batch_min}]"])
    with pytest.raises(ConfigError, match="failure_score"):
        build_config(overrides=["rewards=[{type: reward_model, name_or_path: tiny, failure_score: .nan}]"])
    cfg = build_config(overrides=["rewards=[{type: reward_model, name_or_path: tiny, failure_score: -5}]"])
    assert cfg.rewards[0].resolved_failure_score == -5.0
    cfg = build_config(overrides=["rewards=[{type: verifier}, {type: judge, base_url: 'http://x/v1', model: m}]"])
    assert cfg.rewards[1].resolved_failure_score == 0.0

"""Testbed v2 (issue 17 §2): chains with separators, position feedback, hard levels, correction
sequences in pre-training, the FAP template, the level table; v1 stays bit-for-bit reproducible."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random

import pytest

from rlvr.variants.fbos_rl.fap import build_fap_text
from rlvr.tasks.prompts import render_prompt
from rlvr.testbed.mixture import FAP_TEMPLATE, V2_CHARS, failed_attempt, v2_example
from rlvr.testbed.model import PRESETS, TestbedSpec, build_tokenizer, pretrain
from rlvr.testbed.task import ALPHABET, OPS, TestbedTask, chain_answer, first_wrong_position, make_example

V2_FIELDS = ("chain_steps", "hard_max_level", "hard_noise", "feedback_frac", "attempt_noise", "feedback_noise",
             "tool_frac")  # every field added after v1, left out of the hash at its default


def test_single_step_examples_draw_exactly_like_v1():
    for seed in range(20):
        a, b = random.Random(seed), random.Random(seed)
        op = b.choice("RC")  # v1: one op draw, then the letters
        s = "".join(b.choice(ALPHABET) for _ in range(6))
        assert make_example(a, 6, "RC") == (f"{op}:{s}", OPS[op](s))
        assert a.random() == b.random()  # same number of draws


def test_chain_answers_and_first_wrong_position_by_hand():
    assert chain_answer("RC", "abc") == "cba|dcb"
    assert chain_answer("CCR", "ij") == "ja|ab|ba"
    q, a = make_example(random.Random(1), 4, "RC", steps=3)
    assert len(q.split(":")[0]) == 3 and a.count("|") == 2 and len(a) == 3 * 4 + 2
    assert first_wrong_position("cba|dcb", "cba|dcb") is None
    assert first_wrong_position("cbx|dcb", "cba|dcb") == 3
    assert first_wrong_position("cba", "cba|dcb") == 4  # missing characters: wrong right after the prefix
    with pytest.raises(ValueError):
        make_example(random.Random(0), 3, "R", steps=0)


def test_position_feedback_and_task_knobs():
    t = TestbedTask(min_level=3, max_level=3, steps=2, feedback="position", train_size=5, eval_size=3)
    p = t.problems("train")[0]
    assert "|" in p.answer and p.question.count(":") == 1
    wrong = p.answer[:4] + ("a" if p.answer[4] != "a" else "b") + p.answer[5:]
    assert t.verify(p, wrong).feedback == "5"
    assert t.verify(p, p.answer).correct
    assert TestbedTask(min_level=3, max_level=3).verify(p, wrong).feedback == "letter 5 is wrong"  # v1 text
    with pytest.raises(ValueError, match="feedback"):
        TestbedTask(feedback="words")
    with pytest.raises(ValueError, match="steps"):
        TestbedTask(steps=0)


def test_task_config_accepts_v2_keys_and_names_bad_ones():
    from rlvr.config import build_config
    from rlvr.errors import ConfigError
    from rlvr.testbed.task import testbed_task_from_config

    cfg = build_config([], ["task.type=testbed", "task.config={level: 5, steps: 2, feedback: position}"])
    t = testbed_task_from_config(cfg.task)
    assert (t.min_level, t.max_level, t.steps, t.feedback) == (5, 5, 2, "position")
    bad = build_config([], ["task.type=testbed", "task.config={stepz: 2}"])
    with pytest.raises(ConfigError, match="stepz"):
        testbed_task_from_config(bad.task)


def test_v1_cache_keys_unchanged_and_v2_keys_differ():
    for name in ("small", "micro"):
        spec = PRESETS[name]
        assert not spec.is_v2
        v1 = {k: v for k, v in dataclasses.asdict(spec).items() if k not in V2_FIELDS}  # the pre-v2 field set
        assert spec.key() == hashlib.sha256(json.dumps(v1, sort_keys=True).encode()).hexdigest()[:10]
    assert PRESETS["v2"].is_v2 and PRESETS["v2"].key() != dataclasses.replace(PRESETS["v2"], feedback_frac=0.2).key()


def test_v2_tokenizer_extends_v1_ids():
    v1, v2 = build_tokenizer(), build_tokenizer(v2=True)
    assert len(v2) == len(v1) + len(V2_CHARS)
    assert all(v1.convert_tokens_to_ids(t) == v2.convert_tokens_to_ids(t) for t in v1.get_vocab())
    ids = v2("RC:abc=cbj|dcb!3=", add_special_tokens=False)["input_ids"]
    assert len(ids) == 17 and v2.unk_token_id not in ids


def test_mixture_noise_hits_only_the_first_step_and_hard_levels_are_noisier():
    spec = dataclasses.replace(PRESETS["v2"], feedback_frac=0.0)
    rng = random.Random(0)
    err = {"easy": [0, 0], "hard": [0, 0]}
    for _ in range(3000):
        prompt, ans = v2_example(rng, spec)
        chain, s = prompt[:-1].split(":")
        steps = ans.split("|")
        assert len(steps) == len(chain)
        for op, prev, nxt in zip(chain[1:], steps, steps[1:]):
            assert OPS[op](prev) == nxt  # later steps follow the (possibly wrong) first step exactly
        gold = OPS[chain[0]](s)
        bucket = "hard" if len(s) > spec.max_level else "easy"
        err[bucket][0] += sum(x != y for x, y in zip(steps[0], gold))
        err[bucket][1] += len(s)
    # a replaced letter is a uniform draw, so 1/10 of replacements keep the letter: rate ≈ 0.9·noise
    assert err["easy"][0] / err["easy"][1] == pytest.approx(0.9 * spec.noise, abs=0.02)
    assert err["hard"][0] / err["hard"][1] == pytest.approx(0.9 * spec.hard_noise, abs=0.04)


def test_correction_sequences_have_the_fap_form():
    spec = dataclasses.replace(PRESETS["v2"], feedback_frac=1.0, feedback_noise=0.0)
    rng = random.Random(3)
    tok = build_tokenizer(v2=True)
    for _ in range(200):
        prompt, ans = v2_example(rng, spec)
        head, k = prompt[:-1].rsplit("!", 1)
        q, attempt = head.split("=")
        chain, s = q.split(":")
        assert ans == chain_answer(chain, s) != attempt  # corrected, clean with feedback_noise 0
        assert int(k) == first_wrong_position(attempt, ans)
        # the FAP FBOS-RL builds from the same pieces is exactly this pre-training prompt
        fap = render_prompt(tok, [{"role": "user", "content": build_fap_text(q, attempt, k, FAP_TEMPLATE)}])
        assert fap == f"<|im_start|>{prompt}"
    frac = dataclasses.replace(spec, feedback_frac=0.3)
    n = sum("!" in v2_example(rng, frac)[0] for _ in range(2000))
    assert n / 2000 == pytest.approx(0.3, abs=0.04)
    for _ in range(50):
        assert failed_attempt(rng, "ab|ba", 0.0) != "ab|ba"


def test_fbos_fap_template_knob_renders_the_short_testbed_fap():
    from rlvr.config import build_config

    cfg = build_config(["fbos_rl", "testbed_v2"], [])
    assert cfg.fbos.fap_template == FAP_TEMPLATE
    assert cfg.model.name_or_path == "testbed:v2" and cfg.task.config["feedback"] == "position"


def test_micro2_pretrains_and_level_table_reports_pass_at_k_and_rescue():
    from rlvr.testbed.levels import level_table, markdown_table

    spec = dataclasses.replace(PRESETS["micro2"], steps=3, batch_size=8)
    model, tok, info = pretrain(spec, progress=False)
    assert info["spec"]["feedback_frac"] == 0.3 and len(tok) == 3 + 17 + len(V2_CHARS)
    rows = level_table(model, tok, [2, 3], steps=2, prompts=3, samples=6, ks=(1, 2), temperatures=(1.0, 1.2),
                       fap=True, group=4, rescue_samples=2)
    assert [r["level"] for r in rows] == [2, 3]
    for r in rows:
        for k in ("pass@1@T1", "pass@2@T1", "pass@1@T1.2", "pass@2@T1.2", "all_fail@4"):
            assert 0.0 <= r[k] <= 1.0
        assert r["pass@1@T1"] <= r["pass@2@T1"]
        assert r["all_fail/prompts"] == round(r["all_fail@4"] * 3) and "all_fail/pass@2@T1.2" in r
        assert r["rescue/prompts"] == round(r["all_fail@4"] * 3)
    assert "| 2 | 3 |" in markdown_table(rows)
    with pytest.raises(ValueError):
        level_table(model, tok, [2], samples=4, ks=(8,))
    with pytest.raises(ValueError, match="temperatures"):
        level_table(model, tok, [2], samples=4, ks=(1,), group=2, temperatures=())


def test_all_fail_pass_at_k_by_hand_leaves_the_selecting_samples_out():
    import math

    from rlvr.testbed.levels import all_fail_pass_at_k

    F, T = False, True
    t1 = [[F, F, T, F], [T, F, F, F], [F, F, F, F]]  # group 2: prompts 0 and 2 are all-fail; later samples [T,F], [F,F]
    t11 = [[T, T, T, T], [F, F, F, F], [F, F, T, F]]  # later samples [T,T], [T,F]
    got = all_fail_pass_at_k([t1, t11], (1.0, 1.1), 2, (1, 2, 3))
    assert got == {"all_fail/prompts": 2.0, "all_fail/pass@1@T1": 0.25, "all_fail/pass@2@T1": 0.5,
                   "all_fail/pass@1@T1.1": 0.75, "all_fail/pass@2@T1.1": 1.0}  # k = 3 > 4 − 2 samples: left out
    none = all_fail_pass_at_k([[[T, F, F]]], (1.0,), 1, (1,))
    assert none["all_fail/prompts"] == 0 and math.isnan(none["all_fail/pass@1@T1"])
    assert all_fail_pass_at_k([[[F, F]]], (1.0,), 2, (1,)) == {}


def test_levels_cli_rejects_bad_temperatures_and_k_before_loading():
    from rlvr.testbed.levels import main

    for argv in (["--temperatures", "1.0,abc"], ["--temperatures", "0"], ["--k", "65"], ["--k", "1", "--group", "0"]):
        with pytest.raises(SystemExit) as exc:
            main(["--model", "/no/such/model", *argv])
        assert exc.value.code == 2


def test_v2_two_half_loss_equals_the_one_pass_token_mean_and_its_gradient():
    import torch

    from rlvr.testbed.model import _batch, _v2_loss, build_model

    spec = PRESETS["micro2"]
    tok = build_tokenizer(v2=True)
    model = build_model(spec, tok)
    ids, lab = _batch(random.Random(0), dataclasses.replace(spec, batch_size=6), tok)
    full = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=lab).loss
    g_full = torch.autograd.grad(full, model.model.embed_tokens.weight)[0]
    model.zero_grad()
    halves = _v2_loss(model, ids, lab, tok.pad_token_id)
    assert float(halves) == pytest.approx(float(full), rel=1e-5)
    assert torch.allclose(model.model.embed_tokens.weight.grad, g_full, atol=1e-6)

"""Resumable, chunked testbed pre-training (issue 17 follow-up): a build split into chunks gives the
same weights as one uninterrupted build, checkpoints are tied to their spec, the ``v2`` preset (and its
cache key) is unchanged, and ``python -m rlvr.testbed.build`` pauses and resumes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import rlvr.testbed.model as tm
from rlvr.testbed.build import PAUSED_EXIT, main as build_main
from rlvr.testbed.model import PRESETS, PretrainPaused, _lr_factor, pretrain

MICRO2 = dataclasses.replace(PRESETS["micro2"], steps=12, batch_size=8)
MICRO = dataclasses.replace(PRESETS["micro"], steps=12, batch_size=8)


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("spec", [MICRO2, MICRO], ids=["v2-mixture", "v1-mixture"])
def test_chunked_pretraining_is_bit_identical_to_one_run(tmp_path, spec):
    whole, _, info = pretrain(spec, progress=False)
    paused_at = []
    for _ in range(3):  # three one-step chunks (max_seconds=0 pauses after the first step of each call)
        with pytest.raises(PretrainPaused) as e:
            pretrain(spec, progress=False, checkpoint_dir=tmp_path, max_seconds=0)
        paused_at.append(e.value.step)
    assert paused_at == [1, 2, 3]
    resumed, _, rinfo = pretrain(spec, progress=False, checkpoint_dir=tmp_path, save_every=5)
    assert _same_weights(whole, resumed)
    assert rinfo["final_loss"] == info["final_loss"] and rinfo["loss_curve"] == info["loss_curve"]


def test_a_killed_build_resumes_from_its_last_periodic_checkpoint(tmp_path, monkeypatch):
    whole, _, _ = pretrain(MICRO2, progress=False)
    calls = {"n": 0}
    real = tm._batch

    def dying(*a, **k):  # the 8th batch never arrives: the process "dies" during step 8
        calls["n"] += 1
        if calls["n"] == 8:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(tm, "_batch", dying)
    with pytest.raises(KeyboardInterrupt):
        pretrain(MICRO2, progress=False, checkpoint_dir=tmp_path, save_every=5)
    monkeypatch.setattr(tm, "_batch", real)
    assert '"step": 5' in (tmp_path / "state.json").read_text()
    resumed, _, _ = pretrain(MICRO2, progress=False, checkpoint_dir=tmp_path, save_every=5)
    assert _same_weights(whole, resumed)


def test_checkpoint_of_another_spec_and_max_seconds_without_a_folder_are_refused(tmp_path):
    with pytest.raises(PretrainPaused):
        pretrain(MICRO2, progress=False, checkpoint_dir=tmp_path, max_seconds=0)
    with pytest.raises(ValueError, match="spec key"):
        pretrain(dataclasses.replace(MICRO2, seed=1), progress=False, checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match="checkpoint_dir"):
        pretrain(MICRO2, progress=False, max_seconds=1)


def test_manual_lr_schedule_equals_the_lambdalr_schedule_it_replaced():
    spec = PRESETS["v2"]
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=spec.learning_rate)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(spec, s))
    for step in range(spec.steps):
        assert opt.param_groups[0]["lr"] == spec.learning_rate * _lr_factor(spec, step)
        opt.step()
        sched.step()


def test_v2_preset_and_cache_key_unchanged_and_v2l_only_trains_longer():
    v2 = PRESETS["v2"]
    assert v2 == tm.TestbedSpec(steps=1000, max_level=6, hard_max_level=8, hard_noise=0.45, chain_steps=2,
                                feedback_frac=0.25, feedback_noise=0.1)
    assert v2.key() == "be06f95ba0"  # the folder the v2 results were measured with (~/.cache/rlvr/testbed/v2-seed0-be06f95ba0)
    assert PRESETS["v2l"] == dataclasses.replace(v2, steps=2400) and PRESETS["v2l"].key() != v2.key()


def test_build_cli_pauses_then_finishes_and_cleans_up(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(tm.PRESETS, "micro2", MICRO2)
    assert build_main(["testbed:micro2", "--cache-dir", str(tmp_path), "--max-seconds", "0"]) == PAUSED_EXIT
    assert list(tmp_path.glob("*.partial/state.json"))
    assert build_main(["testbed:micro2", "--cache-dir", str(tmp_path)]) == 0
    assert "built:" in capsys.readouterr().out
    target = tm.testbed_cache_dir("testbed:micro2", tmp_path)
    assert (target / "config.json").is_file() and not list(tmp_path.glob("*.partial"))
    from transformers import AutoModelForCausalLM

    whole, _, _ = pretrain(MICRO2, progress=False)
    assert _same_weights(whole, AutoModelForCausalLM.from_pretrained(target))
    assert build_main(["testbed:nope", "--cache-dir", str(tmp_path)]) == 2


def test_testbed_v2l_recipe_is_testbed_v2_with_the_v2l_policy():
    from rlvr.config import build_config

    a, b = build_config(["grpo", "testbed_v2"], []), build_config(["grpo", "testbed_v2l"], [])
    assert (a.model.name_or_path, b.model.name_or_path) == ("testbed:v2", "testbed:v2l")
    assert a.task == b.task and a.fbos == b.fbos and a.ib_tpo == b.ib_tpo and a.learning_rate == b.learning_rate

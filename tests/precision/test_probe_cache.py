"""The bf16 probe's decision rule (a 1.2x margin, an undecided band resolved to fp32), its robustness to
timing noise, and its per-machine cache (key, atomic file, corrupt or foreign files, unwritable folder,
the override) — in-process, with the timing faked where the test is about the rule."""

from __future__ import annotations

import json
import random

import pytest
import torch

import rlvr.precision.policy as precision  # the policy module: the tests replace its globals
import rlvr.precision.probe as prec
from rlvr.precision import cache as precision_cache
from rlvr.precision import bf16_verdict, probe_cpu_bf16, resolve_precision

BF16_FLAGS = "avx2 fma avx512f avx512_bf16"


@pytest.fixture
def probe_env(monkeypatch, tmp_path):
    """A CPU that claims bf16 (the flags hook), an empty cache in ``tmp_path``, no override, no memo."""
    monkeypatch.delenv("RLVR_CPU_BF16", raising=False)
    monkeypatch.setenv("RLVR_CPU_FLAGS", BF16_FLAGS)
    monkeypatch.setenv("RLVR_CACHE_DIR", str(tmp_path / "cache"))
    prec._probe_hardware.cache_clear()
    yield tmp_path / "cache"
    prec._probe_hardware.cache_clear()


@pytest.mark.parametrize("ratio, native, word", [
    (4.0, True, ">= 1.2: bf16"), (1.2, True, ">= 1.2: bf16"), (1.19, False, "undecided"), (1.0, False, "undecided"),
    (0.85, False, "undecided"), (1 / 1.2, False, "<= 1/1.2"), (0.02, False, "<= 1/1.2")])
def test_verdict_needs_a_clear_margin_and_resolves_the_band_to_fp32(ratio, native, word):
    got, rule = bf16_verdict(ratio)
    assert got is native and word in rule


def _noisy_timer(true_ratio: float, seed: int):
    """A fake ``_best_of``: each ``torch.mm`` call takes 1 ms in fp32 and ``1 / true_ratio`` ms in bf16, slowed
    1-3x by "another process" with probability 0.4 (a heavily shared machine); the best of the calls counts,
    as in the real loop."""
    rng = random.Random(seed)

    def fake(a, b, repeats):
        base = 1e-3 if a.dtype == torch.float32 else 1e-3 / true_ratio
        return min(base * (rng.uniform(1, 3) if rng.random() < 0.4 else 1.0) for _ in range(repeats))

    return fake


@pytest.mark.parametrize("true_ratio, native", [(1.8, True), (1.0, False), (0.5, False)])
def test_median_of_interleaved_pairs_gives_one_answer_under_noise(monkeypatch, true_ratio, native):
    monkeypatch.setattr(prec, "_mm_operands", lambda m, k, n, dt: (torch.zeros(1, dtype=dt), torch.zeros(1, dtype=dt)))
    answers = set()
    for seed in range(50):
        monkeypatch.setattr(prec, "_best_of", _noisy_timer(true_ratio, seed))
        answers.add(bf16_verdict(prec._bf16_speed_ratio())[0])
    assert answers == {native}


def test_timing_runs_on_one_thread_and_restores_the_count_and_the_global_rng(monkeypatch):
    seen = []
    monkeypatch.setattr(prec, "_best_of", lambda a, b, r: seen.append(torch.get_num_threads()) or 1e-3)
    before_threads, rng = torch.get_num_threads(), torch.get_rng_state()
    prec._bf16_speed_ratio((8,), pairs=2)
    assert set(seen) == {1} and torch.get_num_threads() == before_threads
    assert torch.equal(torch.get_rng_state(), rng)  # a seeded run's stream is the same with or without a probe


def test_verdict_is_cached_per_machine_and_read_by_the_next_process(monkeypatch, probe_env):
    monkeypatch.setattr(prec, "_bf16_speed_ratio", lambda: 2.5)
    first = probe_cpu_bf16()
    assert (first.native, first.method, first.bf16_over_fp32) == (True, "flags+timing", 2.5)
    (path,) = (probe_env / "precision").glob("cpu-bf16-*.json")
    data = json.loads(path.read_text())
    assert data["native"] is True and data["key"]["flags"] == ["avx2", "avx512_bf16", "avx512f"]  # fma is no bf16 or vector-width flag
    assert data["key"]["torch"] == torch.__version__ and data["key"]["cpu_model"] == prec._cpu_model_name()
    assert first.cache_path == str(path) and "cached in" in first.reason
    prec._probe_hardware.cache_clear()  # a new process: the memo is empty, the file is not
    monkeypatch.setattr(prec, "_bf16_speed_ratio", lambda: pytest.fail("a cached machine is not timed again"))
    again = probe_cpu_bf16()
    assert (again.native, again.method, again.bf16_over_fp32) == (True, "cache", 2.5)
    assert "delete it to measure again" in again.reason


def test_probe_is_memoised_per_process(monkeypatch, probe_env):
    calls = []
    monkeypatch.setattr(prec, "_bf16_speed_ratio", lambda: calls.append(1) or 0.3)
    for _ in range(4):  # load_policy, apply_precision, the engine factory, distributed setup
        resolve_precision("auto", "cpu", log=False)
    assert len(calls) == 1 and prec._probe_hardware.cache_info().hits >= 3


def test_another_torch_build_or_cpu_is_measured_again(monkeypatch, probe_env):
    monkeypatch.setattr(prec, "_bf16_speed_ratio", lambda: 2.5)
    probe_cpu_bf16()
    prec._probe_hardware.cache_clear()
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    monkeypatch.setattr(prec, "_bf16_speed_ratio", lambda: 0.5)
    p = probe_cpu_bf16()
    assert (p.native, p.method) == (False, "flags+timing")
    assert len(list((probe_env / "precision").glob("cpu-bf16-*.json"))) == 2


@pytest.mark.parametrize("damage", ["not json {", '{"key": {"other": 1}, "native": true}', '{"native": "yes"}'])
def test_a_corrupt_or_foreign_cache_file_is_measured_over(monkeypatch, probe_env, damage):
    monkeypatch.setattr(prec, "_bf16_speed_ratio", lambda: 0.5)
    path = precision_cache.verdict_path(precision_cache.probe_key(
        prec._cpu_model_name(), set(BF16_FLAGS.split()), torch.__version__, torch.backends.cpu.get_cpu_capability()))
    path.parent.mkdir(parents=True)
    path.write_text(damage)
    p = probe_cpu_bf16()
    assert (p.native, p.method) == (False, "flags+timing")
    assert json.loads(path.read_text())["native"] is False  # replaced, whole


def test_an_unwritable_cache_folder_still_decides(monkeypatch, probe_env, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("RLVR_CACHE_DIR", str(blocker))  # a file where the folder should be
    monkeypatch.setattr(prec, "_bf16_speed_ratio", lambda: 2.0)
    p = probe_cpu_bf16()
    assert (p.native, p.cache_path) == (True, None) and "not cached" in p.reason


def test_flags_without_bf16_decide_without_timing_or_cache(monkeypatch, probe_env):
    monkeypatch.setenv("RLVR_CPU_FLAGS", "avx avx2 fma")
    monkeypatch.setattr(prec, "_bf16_speed_ratio", lambda: pytest.fail("no bf16 flags: no timing"))
    p = probe_cpu_bf16()
    assert (p.native, p.method) == (False, "flags") and not probe_env.exists()


def test_override_wins_over_a_cached_verdict(monkeypatch, probe_env):
    monkeypatch.setattr(prec, "_bf16_speed_ratio", lambda: 2.5)
    assert probe_cpu_bf16().native is True
    monkeypatch.setenv("RLVR_CPU_BF16", "0")
    assert (probe_cpu_bf16().native, probe_cpu_bf16().method) == (False, "override")


def test_module_entry_point_prints_the_auto_mode(monkeypatch, probe_env, capsys):
    monkeypatch.setattr(prec, "_bf16_speed_ratio", lambda: 1.5)
    assert precision.main([]) == 0 and capsys.readouterr().out.strip() == "bf16-master"
    assert precision.main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "bf16-master" and out["probe"]["cache_path"] and out["probe"]["bf16_over_fp32"] == 1.5

"""The precision policy (rlvr.precision): modes, the CPU probe and its override, logging once."""

from __future__ import annotations

import pytest
import torch

import rlvr.precision.policy as precision  # the policy module: the tests replace its globals
import rlvr.precision.probe as prec
from rlvr.config import build_config
from rlvr.errors import ConfigError
from rlvr.precision import canonical_precision, probe_cpu_bf16, resolve_precision


def test_canonical_names_and_old_torch_spellings():
    assert canonical_precision("auto") == "auto"
    assert canonical_precision("float32") == "fp32"
    assert canonical_precision("bfloat16") == "bf16-pure"  # what model.dtype=bfloat16 always did: bf16 weights
    assert canonical_precision("BF16") == "bf16"
    with pytest.raises(ValueError, match="unknown precision 'int8'.*auto, fp32, bf16"):
        canonical_precision("int8")


def test_config_default_is_auto_and_aliases_map():
    assert build_config().model.dtype == "auto"
    assert build_config(overrides=["model.dtype=float32"]).model.dtype == "fp32"
    assert build_config(overrides=["model.dtype=bfloat16"]).model.dtype == "bf16-pure"
    with pytest.raises(ConfigError, match="model.dtype"):
        build_config(overrides=["model.dtype=int8"])


@pytest.mark.parametrize("env, mode, param, compute", [("0", "fp32", torch.float32, torch.float32),
                                                        ("1", "bf16-master", torch.bfloat16, torch.bfloat16)])
def test_auto_on_cpu_follows_the_probe_override(monkeypatch, env, mode, param, compute):
    monkeypatch.setenv("RLVR_CPU_BF16", env)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    p = resolve_precision("auto", "cpu", log=False)
    assert p.mode == mode and p.param_dtype == param and p.compute_dtype == compute
    assert p.master_weights is (env == "1")  # bf16-master: the fp32 masters live in the optimizer
    assert not p.autocast  # neither mode autocasts
    assert p.probe is not None and p.probe.method == "override"
    assert p.reason.startswith("native bf16" if env == "1" else "no native bf16")
    if env == "1":
        assert "bf16-master" in p.reason and "fp32 masters" in p.reason  # the stderr line says why


def test_auto_on_a_native_bf16_cpu_under_torchrun_is_bf16(monkeypatch):
    """bf16-master is single-process (the trainer refuses it under torchrun), so auto falls back to bf16."""
    monkeypatch.setenv("RLVR_CPU_BF16", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    p = resolve_precision("auto", "cpu", log=False)
    assert p.mode == "bf16" and p.autocast and p.param_dtype == torch.float32
    assert "WORLD_SIZE=2" in p.reason and "not bf16-master" in p.reason


def test_auto_on_cpu_asks_the_probe(monkeypatch):
    """The decision follows the probe's verdict (mocked: no override, no timing)."""
    from rlvr.precision.probe import CpuBf16Probe

    monkeypatch.delenv("RLVR_CPU_BF16", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(precision, "probe_cpu_bf16", lambda: CpuBf16Probe(True, "flags+timing", "bf16 4.0x fp32"))
    p = resolve_precision("auto", "cpu", log=False)
    assert p.mode == "bf16-master" and p.reason.startswith("native bf16: bf16 4.0x fp32")
    monkeypatch.setattr(precision, "probe_cpu_bf16", lambda: CpuBf16Probe(False, "flags", "no avx512_bf16"))
    p = resolve_precision("auto", "cpu", log=False)
    assert p.mode == "fp32" and p.reason == "no native bf16: no avx512_bf16"


def test_explicit_modes_and_their_dtypes(monkeypatch):
    monkeypatch.setenv("RLVR_CPU_BF16", "0")
    assert resolve_precision("fp32", log=False).compute_dtype == torch.float32
    bf = resolve_precision("bf16", log=False)
    assert (bf.param_dtype, bf.compute_dtype, bf.autocast) == (torch.float32, torch.bfloat16, True)
    assert "no native bf16" in bf.reason  # asked for on a CPU without it: the reason says it is slow
    pure = resolve_precision("bfloat16", log=False)
    assert (pure.mode, pure.param_dtype, pure.autocast, pure.generation_dtype) == (
        "bf16-pure", torch.bfloat16, False, torch.bfloat16)
    with pytest.raises(ValueError, match="RLVR_CPU_BF16 must be 0 or 1"):
        monkeypatch.setenv("RLVR_CPU_BF16", "yes")
        probe_cpu_bf16()


def test_autocast_context_really_runs_bf16_matmuls(monkeypatch):
    monkeypatch.setenv("RLVR_CPU_BF16", "1")
    a = torch.randn(4, 4)
    with resolve_precision("bf16", log=False).autocast_context():
        assert (a @ a).dtype == torch.bfloat16
    with resolve_precision("fp32", log=False).autocast_context():
        assert (a @ a).dtype == torch.float32


def test_cuda_auto_uses_bf16_support_flag():
    assert resolve_precision("auto", "cuda", native_bf16=True, log=False).mode == "bf16"
    assert resolve_precision("auto", "cuda", native_bf16=False, log=False).mode == "fp32"
    assert resolve_precision("auto", "cuda", native_bf16=True, log=False).device_type == "cuda"


@pytest.fixture
def fresh_probe(monkeypatch, tmp_path):
    monkeypatch.delenv("RLVR_CPU_BF16", raising=False)
    monkeypatch.delenv("RLVR_CPU_FLAGS", raising=False)
    monkeypatch.setenv("RLVR_CACHE_DIR", str(tmp_path / "cache"))  # never the user's ~/.cache/rlvr
    prec._probe_hardware.cache_clear()
    yield
    prec._probe_hardware.cache_clear()


def test_probe_flags_without_bf16_say_no_without_timing(monkeypatch, fresh_probe):
    monkeypatch.setattr(prec, "_cpu_flags", lambda: {"avx", "avx2", "fma"})
    monkeypatch.setattr(prec, "_bf16_speed_ratio", lambda: pytest.fail("must not time when the flags say no"))
    p = probe_cpu_bf16()
    assert (p.native, p.method, p.flags) == (False, "flags", ())


@pytest.mark.parametrize("ratio, native", [(3.9, True), (0.02, False)])
def test_probe_flags_with_bf16_are_confirmed_by_timing(monkeypatch, fresh_probe, ratio, native):
    monkeypatch.setattr(prec, "_cpu_flags", lambda: {"avx512f", "avx512_bf16", "amx_bf16"})
    monkeypatch.setattr(prec, "_bf16_speed_ratio", lambda: ratio)
    p = probe_cpu_bf16()
    assert (p.native, p.method, p.flags, p.bf16_over_fp32) == (native, "flags+timing", ("amx_bf16", "avx512_bf16"), ratio)


def test_probe_without_flags_times(monkeypatch, fresh_probe):
    monkeypatch.setattr(prec, "_cpu_flags", lambda: None)
    monkeypatch.setattr(prec, "_bf16_speed_ratio", lambda: 2.0)
    assert (probe_cpu_bf16().native, probe_cpu_bf16().method) == (True, "timing")


def test_probe_on_this_machine_agrees_with_its_flags(fresh_probe):
    flags = prec._cpu_flags()
    p = probe_cpu_bf16()
    if flags is not None and not ({"avx512_bf16", "amx_bf16", "bf16"} & flags):
        assert not p.native and p.method == "flags"
    else:
        assert p.method in ("flags+timing", "timing")


def test_decision_is_logged_once(monkeypatch, capsys):
    monkeypatch.setenv("RLVR_CPU_BF16", "1")
    monkeypatch.setattr(precision, "_LOGGED", set())
    resolve_precision("auto")
    resolve_precision("auto")
    err = capsys.readouterr().err
    assert err.count("rlvr: precision bf16-master (model.dtype=auto, cpu)") == 1


def test_fsdp_kwargs_follow_the_mode():
    assert resolve_precision("bf16", log=False).fsdp_mixed_precision_kwargs() == {
        "param_dtype": torch.bfloat16, "reduce_dtype": torch.float32}
    assert resolve_precision("fp32", log=False).fsdp_mixed_precision_kwargs() == {}
    assert resolve_precision("bf16-pure", log=False).fsdp_mixed_precision_kwargs() == {}


def test_probe_and_benchmark_rates_share_one_timing_loop(monkeypatch):
    """The probe's ratio, ``matmul_rates`` and the benchmarks' model-shape rates all come from
    ``_best_of`` (one copy: benchmarks/bench_step.py, bench_vllm.py and machine.py import them)."""
    calls = []

    def fake(a, b, repeats):
        calls.append((a.shape[0], a.shape[1], b.shape[1], a.dtype))
        return 1e-3 if a.dtype == torch.float32 else 4e-3  # bf16 four times slower

    monkeypatch.setattr(prec, "_best_of", fake)
    assert prec._bf16_speed_ratio((32, 64)) == pytest.approx(0.25)
    assert {c[:3] for c in calls} == {(32, 32, 32)}  # 0.25 is decisive: the next size is not timed
    assert [c[3] for c in calls[:4]] == [torch.float32, torch.bfloat16, torch.bfloat16, torch.float32]  # interleaved
    calls.clear()
    r = prec.matmul_rates(4, 8, 16)
    assert r == {"float32": pytest.approx(2 * 4 * 8 * 16 / 1e-3 / 1e9), "bfloat16": pytest.approx(2 * 4 * 8 * 16 / 4e-3 / 1e9)}
    calls.clear()
    mr = prec.model_matmul_rates(hidden=8, inter=32, rows=4)
    assert [c[:3] for c in calls] == [(4, 8, 32), (4, 32, 8), (4, 8, 8)]
    assert mr["hidden_to_inter"] == pytest.approx(2 * 4 * 8 * 32 / 1e-3 / 1e9)
    assert mr["best"] == max(mr["hidden_to_inter"], mr["inter_to_hidden"], mr["hidden_to_hidden"])


def test_best_mm_seconds_times_a_real_product():
    assert 0 < prec._best_mm_seconds(16, 16, 16, torch.float32, 2) < 5


def test_bad_rlvr_cpu_bf16_is_a_configuration_error_before_any_model_loads(monkeypatch, tmp_path, capsys):
    """Issue 25 (environment variables rlvr reads): a bad value was a ValueError traceback after the
    model loaded; it is a configuration error (exit 2) from the config checks."""
    from rlvr.cli import main

    monkeypatch.setenv("RLVR_CPU_BF16", "yes")
    code = main(["train", "--config", "grpo", f"logging.output_dir={tmp_path}", "model.name_or_path=/nonexistent/x"])
    err = capsys.readouterr().err
    assert code == 2 and "RLVR_CPU_BF16 must be 0 or 1" in err and "/nonexistent" not in err, err

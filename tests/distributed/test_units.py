"""Pure pieces of rlvr.distributed, without processes: prompt sharding, metric reduction, config split."""

from __future__ import annotations

import math

import pytest

from rlvr.config import build_config
from rlvr.distributed import RankPromptLoader, reduce_metric_dicts, reduction_for
from rlvr.distributed.env import init_distributed, set_cpu_threads
from rlvr.distributed.setup import local_config, use_fsdp
from rlvr.errors import ConfigError
from rlvr.trainer.data import PromptLoader


def test_ranks_draw_disjoint_slices_of_the_one_process_draw():
    problems = list(range(40))
    one = PromptLoader(problems, seed=3)
    ranks = [RankPromptLoader(PromptLoader(problems, seed=3), r, 2) for r in range(2)]
    for _ in range(6):  # several rounds, crossing an epoch boundary (6 x 8 > 40)
        want = one.next(8)
        got = [lo.next(4) for lo in ranks]
        assert got[0] + got[1] == want
        assert not set(got[0]) & set(got[1])
    assert ranks[0].state_dict() == ranks[1].state_dict() == one.state_dict()


def test_rank_loader_state_round_trips_and_checks_rank():
    lo = RankPromptLoader(PromptLoader(list(range(10)), seed=0), 1, 2)
    lo.next(3)
    st = lo.state_dict()
    again = RankPromptLoader(PromptLoader(list(range(10)), seed=0), 1, 2)
    again.load_state_dict(st)
    assert again.next(2) == lo.next(2)
    with pytest.raises(ValueError, match="rank 2"):
        RankPromptLoader(PromptLoader([1], seed=0), 2, 2)


def test_metric_reductions_by_name():
    assert reduction_for("loss/total") == "sum" and reduction_for("epa/loss/policy") == "sum"
    assert reduction_for("loss/total", loss_is_partial=False) == "mean"
    assert reduction_for("actor/ratio/max") == "max" and reduction_for("timing/step_s") == "max"
    assert reduction_for("actor/ratio/min") == "min" and reduction_for("perf/num_tokens") == "sum"
    assert reduction_for("prompts/truncated_total") == "sum" and reduction_for("reward/mean") == "mean"
    rows = [
        {"reward/mean": 0.25, "loss/total": 0.5, "actor/ratio/max": 1.1, "timing/step_s": 2.0,
         "perf/tokens_per_s": 10.0, "only/rank0": 3.0, "x/min": math.nan},
        {"reward/mean": 0.75, "loss/total": -0.25, "actor/ratio/max": 1.3, "timing/step_s": 1.0,
         "perf/tokens_per_s": 30.0, "x/min": 2.0},
    ]
    out = reduce_metric_dicts(rows)
    assert out["reward/mean"] == 0.5 and out["loss/total"] == 0.25 and out["actor/ratio/max"] == 1.3
    assert out["timing/step_s"] == 2.0 and out["perf/tokens_per_s"] == 40.0
    assert out["perf/tokens_per_s_per_rank"] == 20.0 and out["only/rank0"] == 3.0 and out["x/min"] == 2.0


def test_local_config_divides_the_global_batch_and_names_the_fix():
    cfg = build_config(["grpo"], ["num_generations=4", "generation_batch_size=32"])
    assert local_config(cfg, 1) is cfg
    two = local_config(cfg, 2)
    assert two.generation_batch_size == 16 and two.prompts_per_generation == 4
    with pytest.raises(ConfigError, match=r"multiple of 3; use generation_batch_size=24"):
        local_config(cfg, 3)
    spg = build_config(["grpo"], ["num_generations=4", "generation_batch_size=16", "steps_per_generation=2"])
    with pytest.raises(ConfigError, match="steps_per_generation=2"):
        local_config(spg, 4)
    assert use_fsdp(cfg, 2) and not use_fsdp(cfg, 1)
    assert not use_fsdp(build_config(["grpo"], ["distributed.fsdp=false"]), 2)


def test_single_process_env_and_threads(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    import torch

    before = torch.get_num_threads()
    try:
        env = init_distributed("cpu", num_threads=1)
        assert env.world_size == 1 and env.backend is None and env.is_main and env.threads == 1
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert set_cpu_threads(0, 1) == 2
        assert set_cpu_threads(1, 1) == 1
        with pytest.raises(ValueError, match="nccl needs device=cuda"):
            init_distributed("cpu", backend="nccl")
    finally:
        torch.set_num_threads(before)


def test_python_dash_m_rlvr_is_the_cli(tmp_path, monkeypatch, capsys):
    """``python -m rlvr`` (what ``torchrun -m rlvr`` runs) is ``rlvr.cli.main``."""
    import runpy
    import sys

    monkeypatch.setattr(sys, "argv", ["rlvr", "plot", str(tmp_path / "missing")])
    with pytest.raises(SystemExit) as exc:
        runpy.run_module("rlvr", run_name="__main__")
    assert exc.value.code != 0


class _TwoRanks:
    """A stand-in for DataParallel.sum on rank 0 of 2: adds the other rank's values, given in order."""

    def __init__(self, other_values):
        self.other = other_values
        self.calls = 0

    def sum(self, values):
        other = self.other(self.calls)
        self.calls += 1
        return [a + b for a, b in zip(values, other)]


def test_global_std_is_the_std_of_all_ranks_rows():
    import torch

    from rlvr.distributed.stats import global_std

    a, b = torch.tensor([0.0, 1.0, 1.0, 3.0], dtype=torch.float64), torch.tensor([2.0, 5.0], dtype=torch.float64)
    both = torch.cat([a, b])
    mean = float(both.mean())
    dp = _TwoRanks(lambda k: [float(b.numel()), float(b.sum())] if k == 0 else [float(((b - mean) ** 2).sum())])
    assert global_std(a, dp) == pytest.approx(float(both.std()), rel=1e-12)
    dp = _TwoRanks(lambda k: [float(b.numel()), float(b.sum())] if k == 0 else [float(((b - mean) ** 2).sum())])
    assert global_std(a, dp, unbiased=False) == pytest.approx(float(both.std(unbiased=False)), rel=1e-12)
    empty = _TwoRanks(lambda k: [0.0, 0.0] if k == 0 else [0.0])
    assert global_std(torch.tensor([4.0]), empty) == 0.0  # one value in the whole job


def test_fsdp_mixed_precision_follows_the_precision_policy():
    import torch

    from rlvr.distributed.fsdp import mixed_precision_for
    from rlvr.precision import resolve_precision

    bf16 = resolve_precision("bf16", "cuda", log=False)
    mp = mixed_precision_for(torch.device("cuda", 0), bf16)
    assert mp.param_dtype == torch.bfloat16 and mp.reduce_dtype == torch.float32
    assert mixed_precision_for(torch.device("cpu"), resolve_precision("bf16", "cpu", log=False)) is None  # fp32 on CPU
    assert mixed_precision_for(torch.device("cuda", 0), resolve_precision("fp32", "cuda", log=False)) is None


def test_checkpoint_modules_import_without_a_cycle():
    """``dist_checkpoint`` must not need ``checkpoint`` (which dispatches to it): both share
    ``checkpoint_state``. A fresh interpreter importing ``dist_checkpoint`` first would otherwise
    half-initialise one of them."""
    import subprocess
    import sys

    code = ("import sys, rlvr.trainer.dist_checkpoint as d; "
            "assert 'rlvr.trainer.checkpoint' not in sys.modules, 'dist_checkpoint imports checkpoint'; "
            "import rlvr.trainer.checkpoint as c; assert c.load_distributed is d.load_distributed")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_both_checkpoint_writers_store_the_rollout_round():
    """The next round's sampling seed comes from ``rollout_round``; the torchrun checkpoint used to drop
    it, so a resumed job re-drew round 1's seed (the LoRA resume test in test_lora_fsdp.py caught it)."""
    from types import SimpleNamespace

    from rlvr.trainer.checkpoint_state import restore_counters, trainer_counters
    from rlvr.trainer.run_state import RunState

    src = SimpleNamespace(run_state=RunState(global_step=5, generation_round=3, rollout_round=4, weight_version=5,
                                             num_tokens=77, consecutive_nonfinite=1))
    dst = SimpleNamespace(run_state=RunState(), generation_sync=SimpleNamespace(version=5))
    restore_counters(dst, trainer_counters(src))
    d = dst.run_state
    assert (d.global_step, d.generation_round, d.rollout_round, d.weight_version, d.num_tokens,
            d.consecutive_nonfinite) == (5, 3, 4, 5, 77, 1)
    assert dst.generation_sync.version == -1  # the engine's weights are stale after a load
    old = {"global_step": 2, "generation_round": 2, "num_tokens": 9}  # a file from before rollout_round
    restore_counters(dst, old)
    assert d.rollout_round == 2 and d.weight_version == 2

"""``torchrun --nproc_per_node 2 -m rlvr train``: a 3-step GRPO run on the tiny model (gloo, FSDP2),
and a batch geometry the world size cannot split, refused before any model loads."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from .conftest import metric_rows, run_torchrun, tiny_run_args


@pytest.mark.slow  # ~20 s of interpreter start-up under load; local_config's error is unit-tested
def test_indivisible_global_batch_is_a_config_error_on_every_rank(tmp_path):
    proc = run_torchrun(["-m", "rlvr", "train", "--config", "grpo", "num_generations=4", "generation_batch_size=12",
                         f"logging.output_dir={tmp_path}", "model.name_or_path=/nonexistent/never-loaded"])
    assert proc.returncode != 0
    assert proc.stderr.count("configuration error: generation_batch_size=12") == 2, proc.stderr[-3000:]
    assert "use generation_batch_size=8" in proc.stderr


@pytest.mark.slow  # ~20 s; the recipe-family run (tests/distributed/test_recipes.py) is the default smoke
def test_two_rank_grpo_run_logs_each_step_once_and_exports_the_model(tiny_folder, tmp_path):
    out = tmp_path / "run"
    proc = run_torchrun(["-m", "rlvr", "train", "--config", "grpo", *tiny_run_args(tiny_folder, out)])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "2 processes" in proc.stderr and "1 CPU thread(s) per process" in proc.stderr and "FSDP2" in proc.stderr
    rows = metric_rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3]  # rank 0 writes, once per step
    assert all(r["actor/num_loss_tokens"] > 0 and "loss/total" in r for r in rows)
    assert proc.stdout.count("rlvr: finished 3 steps") == 1  # printed by rank 0 only
    weights = load_file(str(out / "final" / "model.safetensors"))
    assert weights and all(not k.startswith("policy.") for k in weights)

"""A 3-step ``torchrun --nproc_per_node 2`` run of each built-in recipe family on the tiny model
(grpo, dapo, mu_grpo_small, uec_rl, ib_tpo, fbos_rl; FSDP2, gloo) in one process group: every run
completes and rank 0 logs each step exactly once. Two GRPO variants add the job-wide reward std
(``scale_rewards=batch``) with a sharded reference model (``beta > 0``), and the replicated policy
(``distributed.fsdp=false``) with μ = 2, and generation on the gathered FSDP module
(``distributed.generation_weights=gathered``)."""

from __future__ import annotations

from .conftest import result_line, run_torchrun

FAMILIES = ["grpo", "dapo", "mu_grpo_small", "uec_rl", "ib_tpo", "fbos_rl", "grpo+batch_std+kl", "grpo+replicated+mu2",
            "grpo+gathered"]


def test_each_recipe_family_runs_on_two_ranks(tiny_folder, tmp_path):
    proc = run_torchrun(["tests/distributed/recipes_worker.py", str(tiny_folder), str(tmp_path)], timeout=600)
    res = result_line(proc)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert res.pop("gathered_equals_copy") is True  # generating on the gathered module == on the synced copy
    assert res == {name: [1, 2, 3] for name in FAMILIES}

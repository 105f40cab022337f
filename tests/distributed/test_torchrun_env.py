"""``torchrun --nproc_per_node 2`` on an environment (issue 26 item 4): the ``feedback`` environment's
two-turn episodes train on the tiny model under FSDP2 (gloo), the logged ``env/*`` metrics are the
job's (one row per step, over both ranks' episodes), and ``--resume`` from a 2-rank checkpoint goes on."""

from __future__ import annotations

import math

from .conftest import metric_rows, run_torchrun, tiny_run_args

ENV = ["env.type=feedback", "env.max_retries=1", "env.max_turns=2", "save_steps=1"]


# In the default suite (issue 26: the environment tests pass in `make test`): two launches of two
# processes, ~40 s on 2 cores.
def test_two_rank_feedback_env_run_reduces_env_metrics_and_resumes(tiny_folder, tmp_path):
    out = tmp_path / "run"
    proc = run_torchrun(["-m", "rlvr", "train", "--config", "grpo", *tiny_run_args(tiny_folder, out, *ENV, "max_steps=2")])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "2 processes" in proc.stderr
    rows = metric_rows(out)
    assert [r["step"] for r in rows] == [1, 2]  # rank 0 writes the job's row once per step
    for r in rows:
        assert 1.0 <= r["env/turns_mean"] <= 2.0 and r["env/model_tokens"] > 0
        # finish shares are rank means of per-rank shares (equal rows per rank): still a distribution
        shares = [v for k, v in r.items() if k.startswith("env/finish/")]
        assert shares and math.isclose(sum(shares), 1.0, abs_tol=1e-6), shares
        assert r["actor/num_loss_tokens"] > 0  # summed over ranks: model tokens only
    assert (out / "checkpoint-2").is_dir()
    proc = run_torchrun(["-m", "rlvr", "train", "--config", "grpo", "--resume",
                         *tiny_run_args(tiny_folder, out, *ENV, "max_steps=3")])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resumed from" in proc.stderr
    rows = metric_rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3] and 1.0 <= rows[-1]["env/turns_mean"] <= 2.0

"""Issue 25 item 4.9: under torchrun the reward-failure counts are the job's. When only rank 1's reward
calls failed, rank 0's summary said "0 errors"; the counts are now summed over ranks round by round."""

from __future__ import annotations

from .conftest import REPO, run_torchrun, tiny_run_args


def test_summary_counts_every_ranks_reward_failures(tiny_folder, tmp_path):
    out = tmp_path / "run"
    reward = f"task.reward_fn={REPO / 'tests' / 'distributed' / 'toy_reward.py'}:even_length_failing_on_rank_1"
    proc = run_torchrun(["-m", "rlvr", "train", "--config", "grpo", *tiny_run_args(tiny_folder, out, reward, "max_steps=1")])
    # 16 completions a round, 8 per rank; rank 1's 8 failed: half the job's calls (not more: exit 0)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr.count("verifier: 16 calls, 8 errors, 0 timeouts (50% failed)") == 1, proc.stderr[-4000:]

"""Issue 25 item 4.8: a reward function that always fails stops the run after REWARD_FAILURE_ROUNDS
rounds in which every call failed, with a checkpoint and a message (exit 1), instead of training every
step on zeros and exiting 1 only at the end."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlvr.errors import RewardFailureError
from rlvr.testing import small_config
from rlvr.trainer.lifecycle import REWARD_FAILURE_ROUNDS, RewardFailureWatch
from rlvr.trainer.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reward_worker_tasks import AlwaysRaises  # noqa: E402


def test_always_failing_reward_stops_after_the_first_failed_rounds_with_a_checkpoint(tmp_path, tiny, capsys):
    factory, tok = tiny
    cfg = small_config(tmp_path, "max_steps=50", "reward_timeout_s=0", "save_steps=0")
    tr = Trainer(cfg, factory(0), tok, AlwaysRaises())
    with pytest.warns(UserWarning, match="reward function failed"):
        with pytest.raises(RewardFailureError, match="every reward call failed in 2 generation rounds") as info:
            tr.train()
    assert info.value.exit_code == 1
    assert "reward service unreachable" in str(info.value) and "--resume" in str(info.value)
    # round 1's update (zero advantages) is all that ran; round 2 stopped before its update, not 50 steps;
    # the checkpoint is of the state before round 2 (a resumed run generates it again)
    assert tr.scorer.calls_total == REWARD_FAILURE_ROUNDS * 8 and tr.global_step == 1
    assert tr.generation_round == REWARD_FAILURE_ROUNDS - 1
    ckpt = tmp_path / "checkpoint-1"
    assert ckpt.is_dir() and str(ckpt) in str(info.value) and tr.last_checkpoint == ckpt
    err = capsys.readouterr().err
    assert "run stopped (every reward call failed)" in err and "16 calls, 16 errors" in err


def test_a_round_with_one_success_resets_the_count():
    w = RewardFailureWatch(limit=2)
    assert not w.round_done(8, 8, 0)
    assert not w.round_done(8, 7, 0)  # one call scored: not a dead reward function
    assert not w.round_done(0, 0, 0)  # nothing scored: no evidence either way
    assert not w.round_done(8, 4, 4)
    assert w.round_done(8, 0, 8) and w.rounds == 2
    assert (w.calls, w.errors, w.timeouts) == (32, 19, 12)

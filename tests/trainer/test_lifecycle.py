"""Run lifecycle (issue 12, items 6 and 8): SIGINT/SIGTERM write a checkpoint and stop with 130/143,
save_total_limit, corrupt checkpoints skipped on resume, checkpoint file modes follow the umask, and
the summary printed at the end of every run."""

from __future__ import annotations

import json
import os
import signal
import stat

import pytest
import torch

from rlvr.testing import ToyTask, small_config
from rlvr.trainer.checkpoint import latest_checkpoint, load_checkpoint
from rlvr.trainer.lifecycle import RunInterrupted
from rlvr.trainer.run_dir import checkpoint_problems, find_resumable
from rlvr.trainer.trainer import Trainer


def _trainer(tmp_path, tiny, *overrides, task=None):
    factory, tok = tiny
    cfg = small_config(tmp_path, "reward_timeout_s=0", "logging.tensorboard=false", *overrides)
    return Trainer(cfg, factory(0), tok, task or ToyTask())


def _steps(out):
    return [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_during_an_update_finishes_it_writes_a_checkpoint_and_resumes_identically(tmp_path, tiny, signum, code):
    ref = _trainer(tmp_path / "ref", tiny, "max_steps=4")
    ref.train()
    tr = _trainer(tmp_path / "run", tiny, "max_steps=4")
    tr.callbacks.append(lambda t, m: os.kill(os.getpid(), signum) if t.global_step == 2 else None)
    with pytest.raises(RunInterrupted) as info:
        tr.train()
    assert info.value.exit_code == code and info.value.step == 2
    ck = tmp_path / "run" / "checkpoint-2"
    assert info.value.checkpoint == ck and checkpoint_problems(ck) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    again = _trainer(tmp_path / "run", tiny, "max_steps=4")
    load_checkpoint(again, latest_checkpoint(tmp_path / "run"))
    again.train()
    for k, v in ref.model.state_dict().items():
        assert torch.equal(v, again.model.state_dict()[k]), k
    assert _steps(tmp_path / "run") == [1, 2, 3, 4]


class _SignalInSampler:
    """Wraps a sampler; sends ``signum`` to this process in the middle of draw number ``at``."""

    def __init__(self, inner, signum, at):
        self.inner, self.signum, self.at, self.n = inner, signum, at, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def sample(self, *a, **k):
        self.n += 1
        if self.n == self.at:
            os.kill(os.getpid(), self.signum)
            raise AssertionError("the signal should have abandoned the generation round")
        return self.inner.sample(*a, **k)


def test_signal_during_generation_abandons_the_round_and_checkpoints_the_state_before_it(tmp_path, tiny):
    ref = _trainer(tmp_path / "ref", tiny, "max_steps=3", "save_steps=1")
    ref.train()
    tr = _trainer(tmp_path / "run", tiny, "max_steps=3")
    tr.sampler = _SignalInSampler(tr.sampler, signal.SIGTERM, at=2)  # in round 2, after step 1
    with pytest.raises(RunInterrupted) as info:
        tr.train()
    assert info.value.step == 1 and info.value.exit_code == 143
    got = json.loads((tmp_path / "run" / "checkpoint-1" / "trainer_state.json").read_text())
    want = json.loads((tmp_path / "ref" / "checkpoint-1" / "trainer_state.json").read_text())
    for k in ("global_step", "generation_round", "loader", "rng"):
        assert got[k] == want[k], k


def test_save_total_limit_keeps_the_newest_checkpoints(tmp_path, tiny):
    _trainer(tmp_path, tiny, "max_steps=5", "save_steps=1", "save_total_limit=2").train()
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-5"]


@pytest.mark.parametrize("damage, needle", [
    (lambda ck: (ck / "model.safetensors").write_bytes((ck / "model.safetensors").read_bytes()[:5000]),
     "model.safetensors: truncated"),
    (lambda ck: (ck / "optimizer.pt").unlink(), "optimizer.pt: missing"),
    (lambda ck: (ck / "trainer_state.json").write_text('{"global_step": 3,'), "trainer_state.json: corrupt JSON"),
    (lambda ck: (ck / "optimizer.pt").write_bytes((ck / "optimizer.pt").read_bytes()[:100]), "optimizer.pt: corrupt"),
])
def test_a_damaged_latest_checkpoint_is_named_and_resume_falls_back(tmp_path, tiny, damage, needle):
    _trainer(tmp_path, tiny, "max_steps=3", "save_steps=1").train()
    damage(tmp_path / "checkpoint-3")
    ck, skipped = find_resumable(tmp_path)
    assert ck == tmp_path / "checkpoint-2" and latest_checkpoint(tmp_path) == ck
    assert skipped[0][0] == tmp_path / "checkpoint-3"
    assert any(needle in p for p in skipped[0][1]), skipped


def test_checkpoint_files_follow_the_umask(tmp_path, tiny):
    old = os.umask(0o022)
    try:
        _trainer(tmp_path, tiny, "max_steps=1", "save_steps=1").train()
    finally:
        os.umask(old)
    for folder in (tmp_path / "checkpoint-1", tmp_path / "final"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755, folder
        for f in folder.iterdir():
            assert stat.S_IMODE(f.stat().st_mode) == 0o644, f


def test_every_run_ends_with_a_summary(tmp_path, tiny, capsys):
    # one round (a second with every call failing would stop the run: test_reward_failure_stop.py)
    tr = _trainer(tmp_path, tiny, "max_steps=1", task=ToyTask(fail_on={f"train-{i}" for i in range(16)}))
    tr.train()
    err = capsys.readouterr().err
    assert "rlvr: run finished: 1 step (1 -> 1)" in err
    assert "reward/mean 0.000 -> 0.000" in err
    assert "verifier: 8 calls, 8 errors, 0 timeouts (100% failed)" in err
    assert f"model: {tmp_path / 'final'}" in err and "checkpoint: none written" in err
    assert tr.summary.failed_fraction == 1.0


def test_disk_full_while_saving_names_the_file_and_leaves_nothing_half_written(tmp_path, tiny, monkeypatch):
    import errno

    import rlvr.trainer.checkpoint as ckpt_mod
    from rlvr.trainer.checkpoint_state import CheckpointWriteError

    tr = _trainer(tmp_path, tiny, "max_steps=1")

    def full(obj, f, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt_mod.torch, "save", full)
    with pytest.raises(CheckpointWriteError, match=r"checkpoint-1 \(optimizer\.pt\): No space left on device"):
        tr.save(tmp_path / "checkpoint-1")
    assert list(tmp_path.iterdir()) == []  # the temporary folder is gone


@pytest.mark.parametrize("where", ["safetensors", "torch.save"])
def test_disk_full_as_the_writers_really_report_it_is_a_named_checkpoint_error(tmp_path, tiny, monkeypatch, where):
    # on a full disk safetensors raises SafetensorError and torch.save a RuntimeError, neither an OSError:
    # both escaped save_checkpoint as a raw traceback (seen on a 600 kB tmpfs) instead of the named error
    import rlvr.trainer.checkpoint as ckpt_mod
    from safetensors import SafetensorError

    from rlvr.trainer.checkpoint_state import CheckpointWriteError

    tr = _trainer(tmp_path, tiny, "max_steps=1")
    if where == "safetensors":
        def full(*a, **k):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

        monkeypatch.setattr(tr.model, "save_pretrained", full)
        match = r"checkpoint-1 \(model\.safetensors\): .*No space left on device.* MB free on that disk"
    else:
        def full(obj, f, *a, **k):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

        monkeypatch.setattr(ckpt_mod.torch, "save", full)
        match = r"checkpoint-1 \(optimizer\.pt\): .*unexpected pos.* MB free on that disk"
    with pytest.raises(CheckpointWriteError, match=match):
        tr.save(tmp_path / "checkpoint-1")
    assert list(tmp_path.iterdir()) == []  # the temporary folder is gone

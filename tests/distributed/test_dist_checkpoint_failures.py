"""A failed ``torchrun`` checkpoint save (:func:`rlvr.trainer.dist_checkpoint.save_distributed`), in a one-rank
gloo group in this process: every way the write can fail — DCP's ``CheckpointException`` (a ``BaseException``
wrapping the rank's ``OSError``), safetensors' ``SafetensorError``, ``torch.save``'s ``RuntimeError``, the
final rename — is one named :class:`CheckpointWriteError`, the previous checkpoint at that path stays
whole and unchanged, and no staging folder is left behind."""

from __future__ import annotations

import errno
import hashlib

import pytest

from rlvr.testing import ToyTask, small_config
from rlvr.trainer.checkpoint_state import CheckpointWriteError
from rlvr.trainer.run_dir import checkpoint_problems

from fault_injection import fail_staging_rename


@pytest.fixture
def one_rank_group(tmp_path):
    import torch.distributed as dist

    from rlvr.distributed.env import DistEnv

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        yield DistEnv(backend="gloo")
    finally:
        dist.destroy_process_group()


def _digests(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _enospc(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")


def _fail_distcp(real):
    def create_stream(self, path, mode):
        if str(path).endswith(".distcp"):
            _enospc()
        return real(self, path, mode)
    return create_stream


def _fail_metadata(real):
    def create_stream(self, path, mode):
        if ".metadata" in str(path):
            _enospc()
        return real(self, path, mode)
    return create_stream


def _inject(where, monkeypatch, tr):
    import torch.distributed.checkpoint.filesystem as fs
    from safetensors import SafetensorError

    import rlvr.trainer.checkpoint_state as cs
    import rlvr.trainer.dist_checkpoint as dc

    if where in ("distcp", "metadata"):
        real = fs.FileSystem.create_stream
        monkeypatch.setattr(fs.FileSystem, "create_stream", (_fail_distcp if where == "distcp" else _fail_metadata)(real))
        return r"rank 0, dcp/ \(sharded model and optimizer\): rank 0: No space left on device"
    if where == "safetensors":
        def full(*a, **k):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        monkeypatch.setattr(tr.model, "save_pretrained", full)
        return r"rank 0, model.safetensors and tokenizer .*No space left on device"
    if where == "torch.save":
        real = dc.torch.save

        def full(obj, f, *a, **k):  # DCP serialises through torch.save too: fail only the scheduler file
            if str(f).endswith("scheduler.pt"):
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
            return real(obj, f, *a, **k)
        monkeypatch.setattr(dc.torch, "save", full)
        return r"rank 0, scheduler.pt: RuntimeError: .*unexpected pos"
    if where == "rename":
        fail_staging_rename(monkeypatch, cs)
        return r"rank 0, the rename into place: Input/output error"
    raise AssertionError(where)


@pytest.mark.parametrize("where", ["distcp", "metadata", "safetensors", "torch.save", "rename"])
def test_a_failed_distributed_save_is_named_and_keeps_the_previous_checkpoint(where, tmp_path, tiny, one_rank_group,
                                                                              monkeypatch):
    from rlvr.distributed import DataParallel
    from rlvr.trainer.trainer import Trainer

    factory, tok = tiny
    cfg = small_config(tmp_path / "run", "reward_timeout_s=0", "logging.tensorboard=false", "max_steps=1")
    tr = Trainer(cfg, factory(0), tok, ToyTask(), dp=DataParallel(one_rank_group, fsdp=False, pad_token_id=0),
                 run_config=cfg)
    run = tmp_path / "run"
    ck = tr.save(run / "checkpoint-1")
    assert (ck / "dcp" / ".metadata").is_file() and checkpoint_problems(ck) == []
    before = _digests(ck)
    match = _inject(where, monkeypatch, tr)
    with pytest.raises(CheckpointWriteError, match=r"could not write checkpoint .*checkpoint-1 \(" + match):
        tr.save(ck)  # replacing it
    with pytest.raises(CheckpointWriteError, match=match):
        tr.save(run / "checkpoint-2")
    monkeypatch.undo()
    assert _digests(ck) == before and checkpoint_problems(ck) == []
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint-1"]  # no staging folder, no checkpoint-2

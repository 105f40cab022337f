"""Leftovers of a save killed with ``kill -9`` (``.checkpoint-N.tmp-*``, ``.final.tmp-*``, a checkpoint
moved aside while being replaced): a start or resume removes them, or puts back the only whole copy,
and touches nothing else; staging folders of a live process are left alone (:mod:`rlvr.util.staging`)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlvr.util.staging import _host, aside_name, parse
from rlvr.testing import ToyTask, small_config
from rlvr.trainer.checkpoint import latest_checkpoint, load_checkpoint
from rlvr.trainer.run_dir import checkpoint_problems, clean_stale_temporaries, rotate_checkpoints
from rlvr.trainer.trainer import Trainer

from cli_fixtures import train_tiny
from fault_injection import fail_staging_rename


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture
def live_pid():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p.pid
    p.kill()
    p.wait()


def _plant(folder: Path, name: str) -> Path:
    d = folder / name
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"\0" * 4096)  # half a checkpoint
    return d


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _trainer(out, tiny, *overrides):
    factory, tok = tiny
    cfg = small_config(out, "reward_timeout_s=0", "logging.tensorboard=false", "save_steps=1", *overrides)
    return Trainer(cfg, factory(0), tok, ToyTask())


def test_resume_removes_a_killed_saves_leftovers_keeps_checkpoints_and_resumes_exactly(tmp_path, tiny, live_pid, capsys):
    ref = _trainer(tmp_path / "ref", tiny, "max_steps=4")
    ref.train()
    run = tmp_path / "run"
    _trainer(run, tiny, "max_steps=2").train()
    before = {n: _digests(run / n) for n in ("checkpoint-1", "checkpoint-2")}
    host, dead = _host(), _dead_pid()
    stale = [_plant(run, n) for n in (
        ".checkpoint-3.tmp-k2j4_x9a",               # mkdtemp's name before owners were recorded
        f".checkpoint-3.tmp-{host}-{dead}-ab12cd",  # its process is gone
        f".final.tmp-{host}-{dead}-ef34gh",
        f".checkpoint-1.del-{host}-{dead}-00ff",   # save_total_limit was deleting it
        f".checkpoint-2.old-{host}-{dead}-11aa",   # replaced: checkpoint-2 itself is in place
    )]
    kept = [_plant(run, n) for n in (
        f".checkpoint-4.tmp-{host}-{live_pid}-zz99",  # a live process is writing it
        ".mydata.tmp-abc123",                         # not a run folder's name
        "checkpoint-x.tmp-abc",
    )]
    (run / ".checkpoint-5.tmp-file").write_text("a file, not a staging folder")

    tr = _trainer(run, tiny, "max_steps=4")
    load_checkpoint(tr, latest_checkpoint(run))
    assert tr.global_step == 2
    tr.train()

    assert not any(p.exists() for p in stale), [p.name for p in stale if p.exists()]
    assert all(p.is_dir() for p in kept) and (run / ".checkpoint-5.tmp-file").is_file()
    assert "removed 5 leftover folders of interrupted saves" in capsys.readouterr().err
    for n, digests in before.items():  # the real checkpoints are untouched
        assert _digests(run / n) == digests and checkpoint_problems(run / n) == []
    sa, sb = ref.model.state_dict(), tr.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)  # resume is still exact


def test_a_checkpoint_moved_aside_by_a_killed_replace_is_put_back_and_resumed(tmp_path, capsys):
    assert train_tiny(tmp_path, "save_steps=1") == 0
    run = tmp_path / "run"
    ck2 = run / "checkpoint-2"
    want = _digests(ck2)
    # kill -9 between save_checkpoint's two renames while it re-saved checkpoint-2: the old copy is aside,
    # the new one whole in its staging folder, and checkpoint-2 itself missing
    aside = run / f".checkpoint-2.old-{_host()}-{_dead_pid()}-1234abcd"
    os.replace(ck2, aside)
    _plant(run, f".checkpoint-2.tmp-{_host()}-{_dead_pid()}-5678")
    capsys.readouterr()
    assert train_tiny(tmp_path, "save_steps=1", "max_steps=3", "--resume") == 0
    err = capsys.readouterr().err
    assert "checkpoint-2 was missing after a save interrupted while replacing it" in err
    assert f"resumed from {ck2} at step 2" in err, err
    assert _digests(ck2) == want and not aside.exists()
    assert not [p.name for p in run.iterdir() if p.name.startswith(".")]


def test_rotation_renames_before_deleting_so_a_kill_leaves_no_half_checkpoint(tmp_path, monkeypatch):
    import rlvr.trainer.run_dir as run_dir

    for n in (1, 2, 3):
        _plant(tmp_path, f"checkpoint-{n}")
    monkeypatch.setattr(run_dir.shutil, "rmtree", lambda *a, **k: None)  # killed before deleting anything
    rotate_checkpoints(tmp_path, 1)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3"]
    hidden = sorted(parse(p.name)["kind"] for p in tmp_path.iterdir() if p.name.startswith("."))
    assert hidden == ["del", "del"]
    monkeypatch.undo()
    dead = _dead_pid()
    for p in tmp_path.glob(".*"):  # the process was then killed: its id is gone
        p.rename(p.with_name(p.name.replace(f"-{os.getpid()}-", f"-{dead}-")))
    restored, removed = clean_stale_temporaries(tmp_path)
    assert restored == [] and len(removed) == 2  # a folder on its way to deletion is never put back
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3"]


def test_cleanup_leaves_a_live_processes_moved_aside_checkpoint(tmp_path, live_pid):
    aside = _plant(tmp_path, f".final.old-{_host()}-{live_pid}-aa")  # another process is mid-replace
    assert clean_stale_temporaries(tmp_path) == ([], [])
    assert aside.is_dir() and not (tmp_path / "final").exists()
    assert parse(aside_name(tmp_path / "final").name)["pid"] == str(os.getpid())


def test_default_model_conversion_removes_only_stale_staging_folders(tmp_path, monkeypatch, live_pid):
    import rlvr.models.loading as models  # the loader module, whose globals load_policy reads

    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(models, "find_default_gguf", lambda: gguf)
    monkeypatch.setattr(models, "convert_gguf_to_folder", lambda g, out: (Path(out) / "config.json").write_text("{}"))
    cache = tmp_path / "cache"
    cache.mkdir()
    name = models.DEFAULT_MODEL_CACHE_NAME
    old_legacy = _plant(cache, f".{name}.tmp-old123")
    os.utime(old_legacy, (0, 0))  # untouched for decades
    stale = [old_legacy, _plant(cache, f".{name}.tmp-{_host()}-{_dead_pid()}-ab")]
    kept = [_plant(cache, f".{name}.tmp-new456"),  # no owner recorded, changed just now: may be converting
            _plant(cache, f".{name}.tmp-{_host()}-{live_pid}-cd"), _plant(cache, ".other.tmp-old789")]
    os.utime(kept[-1], (0, 0))
    assert models.ensure_default_model(cache) == cache / name
    assert not any(p.exists() for p in stale) and all(p.is_dir() for p in kept)


def test_export_removes_a_killed_exports_staging_folder(tmp_path, monkeypatch):
    import rlvr.lora as lora

    src = tmp_path / "adapter"
    src.mkdir()
    (src / lora.ADAPTER_CONFIG).write_text("{}")

    class Saves:
        def save_pretrained(self, folder, **kw):
            (Path(folder) / "config.json").write_text("{}")

    monkeypatch.setattr(lora, "load_adapter_policy", lambda *a, **k: (Saves(), Saves()))
    stale = _plant(tmp_path, f".merged.tmp-{_host()}-{_dead_pid()}-ab")
    out = lora.export_merged(src, tmp_path / "merged", None)
    assert (out / "config.json").is_file() and not stale.exists()


def test_a_failed_rename_while_replacing_a_checkpoint_puts_the_old_one_back(tmp_path, tiny, monkeypatch):
    import rlvr.trainer.checkpoint_state as cs
    from rlvr.trainer.checkpoint_state import CheckpointWriteError

    tr = _trainer(tmp_path, tiny, "max_steps=1")
    ck = tr.save(tmp_path / "checkpoint-1")
    want = _digests(ck)
    fail_staging_rename(monkeypatch, cs)
    with pytest.raises(CheckpointWriteError, match=r"checkpoint-1 \(the rename into place\): Input/output error"):
        tr.save(ck)
    monkeypatch.undo()
    assert _digests(ck) == want and checkpoint_problems(ck) == []  # was left moved aside, checkpoint-1 missing
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-1"]

"""Damaged checkpoints and checkpoints of another model (issue 25, items 4.3 and 4.6): bytes changed in
place (same length) are found by the checksums written at save time and the resume falls back to the
previous checkpoint, naming the file; older checkpoints without checksums are checked by content (zip
CRCs, finite weights); every checkpoint damaged, another architecture, or a LoRA / full-model mix is
one line and exit 2."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlvr import cli
from rlvr.errors import ConfigError
from rlvr.trainer.checksums import CHECKSUM_FILE, write_checksums
from rlvr.trainer.run_dir import find_resumable

from cli_fixtures import TINY, no_model_loads  # noqa: F401 (a fixture)

RUN = [*TINY, "save_steps=1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-step tiny run with checkpoint-1 and checkpoint-2 (made once; tests copy it)."""
    out = tmp_path_factory.mktemp("integrity") / "run"
    assert cli.main(["train", *RUN, f"logging.output_dir={out}"]) == 0
    return out


@pytest.fixture
def run(trained, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(trained, dst)
    return dst


def _flip(path, at=None):
    """Damage one byte in place: the length stays the same."""
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if at is None else at
    data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def _rlvr_lines(err):
    return [line for line in err.splitlines() if line.startswith("rlvr:")]


def _resume(run, *extra):
    return cli.main(["train", *RUN, f"logging.output_dir={run}", "max_steps=3", *extra])


def test_checksums_are_written_in_sha256sum_format(run):
    listing = (run / "checkpoint-2" / CHECKSUM_FILE).read_text().splitlines()
    names = {line.split("  ", 1)[1] for line in listing}
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"} <= names
    if shutil.which("sha256sum"):
        assert subprocess.run(["sha256sum", "--quiet", "-c", CHECKSUM_FILE], cwd=run / "checkpoint-2").returncode == 0


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt"])
def test_same_length_damage_is_found_and_resume_falls_back_naming_the_file(run, name):
    f = run / "checkpoint-2" / name
    size = f.stat().st_size
    _flip(f, at=size - 3)  # the last tensor's bytes: every structural check still passes
    assert f.stat().st_size == size
    ck, skipped = find_resumable(run)
    assert ck == run / "checkpoint-1"
    assert skipped[0][0] == run / "checkpoint-2"
    assert f"{name}: damaged (its sha256 differs from the one written at save time)" in skipped[0][1]


def test_a_resume_past_a_damaged_checkpoint_warns_and_continues_from_the_previous(run, capsys):
    _flip(run / "checkpoint-2" / "model.safetensors", at=(run / "checkpoint-2" / "model.safetensors").stat().st_size - 3)
    assert _resume(run, "--resume") == 0
    err = capsys.readouterr().err
    assert f"skipping {run / 'checkpoint-2'}: incomplete or corrupt (model.safetensors: damaged" in err
    assert f"resumed from {run / 'checkpoint-1'} at step 1" in err
    final = load_file(str(run / "final" / "model.safetensors"))
    assert all(bool(torch.isfinite(t).all()) for t in final.values())


def test_every_checkpoint_damaged_exits_2_and_keeps_the_run(run, capsys, no_model_loads):
    for n in (1, 2):
        _flip(run / f"checkpoint-{n}" / "optimizer.pt")
    before = (run / "metrics.jsonl").read_text()
    assert _resume(run, "--resume") == 2
    err = capsys.readouterr().err
    assert "none of the 2 checkpoints" in _rlvr_lines(err)[-1] and "optimizer.pt: damaged" in err
    assert (run / "metrics.jsonl").read_text() == before  # no silent restart from step 1


def test_an_old_checkpoint_without_checksums_is_checked_by_content(run):
    for n in (1, 2):
        (run / f"checkpoint-{n}" / CHECKSUM_FILE).unlink()
    assert find_resumable(run)[0] == run / "checkpoint-2"  # still loads
    ck2 = run / "checkpoint-2"
    weights = load_file(str(ck2 / "model.safetensors"))
    key = next(k for k, t in weights.items() if t.is_floating_point())
    weights[key] = weights[key].clone()
    weights[key].view(-1)[0] = float("nan")
    save_file(weights, str(ck2 / "model.safetensors"), metadata={"format": "pt"})
    ck, skipped = find_resumable(run)
    assert ck == run / "checkpoint-1"
    assert f"model.safetensors: damaged (tensor {key!r} holds NaN or infinite values)" in skipped[0][1]
    _flip(run / "checkpoint-1" / "optimizer.pt")
    ck, skipped = find_resumable(run)
    assert ck is None and any("optimizer.pt: damaged (CRC mismatch" in p for p in skipped[1][1]), skipped


# ---------------------------------------------------------------- 4.6: another model in the checkpoint
def test_resume_force_from_another_architecture_is_one_line_exit_2(run, capsys):
    ck = run / "checkpoint-2"
    weights = load_file(str(ck / "model.safetensors"))
    for k in list(weights):
        if weights[k].dim() == 2:
            weights[k] = torch.zeros(weights[k].shape[0] + 1, weights[k].shape[1])  # a wider model
    save_file(weights, str(ck / "model.safetensors"), metadata={"format": "pt"})
    write_checksums(ck)  # a whole checkpoint, of another model
    assert _resume(run, "--resume", "force") == 2
    err = capsys.readouterr().err
    lines = _rlvr_lines(err)
    assert len([line for line in lines if "architecture" in line]) == 1 and "size mismatch" not in err, err
    assert "tensors differ in shape" in lines[-1] and str(ck) in lines[-1]


@pytest.mark.parametrize("mix", ["lora_into_full", "full_into_lora"])
def test_resume_force_mixing_lora_and_full_checkpoints_is_one_line_exit_2(run, capsys, no_model_loads, mix):
    extra = []
    if mix == "lora_into_full":
        (run / "checkpoint-2" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
        write_checksums(run / "checkpoint-2")
        needle = "holds a LoRA adapter, but this run trains the full model"
    else:
        extra, needle = ["model.lora.r=4"], "holds a full model (no adapter_config.json), but this run trains a LoRA adapter"
    assert _resume(run, *extra, "--resume", "force") == 2
    (line,) = [x for x in _rlvr_lines(capsys.readouterr().err) if "configuration error" in x]
    assert needle in line and str(run / "checkpoint-2") in line


def test_check_weights_fit_names_missing_and_unexpected_tensors_in_one_line(tmp_path):
    from rlvr.trainer.checkpoint import check_weights_fit

    model = {"a.weight": torch.zeros(2, 2), "b.weight": torch.zeros(2)}
    with pytest.raises(ConfigError, match=r"1 tensors missing \(e.g. \['b.weight'\]\), 1 unexpected \(e.g. \['c'\]\)"):
        check_weights_fit(tmp_path, {"a.weight": torch.zeros(2, 2), "c": torch.zeros(1)}, model)
    check_weights_fit(tmp_path, {"a.weight": torch.ones(2, 2), "b.weight": torch.ones(2)}, model)  # fits: no error

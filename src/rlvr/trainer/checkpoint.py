"""Checkpoints: written atomically, read without unpickling untrusted data.

Layout of ``checkpoint-N/``: the policy as a Hugging Face folder (``model.safetensors``, config,
tokenizer), ``precision.json`` (the precision the run resolved, :mod:`rlvr.precision.record`; ``final/`` has it
too), ``optimizer.pt`` and ``scheduler.pt`` (tensors and plain containers only, read with
``torch.load(weights_only=True)``), ``trainer_state.json`` (step, generation round, loader position,
RNG states, schedule state, config, content hashes of the task's data files), and, when the run was
between the optimizer updates of one generation batch (μ > 1), ``pending.safetensors`` +
``pending.json`` (that batch, :mod:`rlvr.rollout_io`) with the index of the next update; the
dynamic-sampling carry as ``carry-K.*``; schedule tensors as ``schedule.safetensors``; the sha256 of
every file as ``checksums.sha256`` (verified before a resume, :mod:`rlvr.trainer.checksums`).
The folder is assembled under a temporary name and renamed into place, so a kill at any moment leaves
either the previous checkpoint or the new one, never half of one. Nothing is ever unpickled on load.

Identical continuation (issue 3): a run killed at any point and resumed from its latest checkpoint
repeats at most the update in progress and then computes exactly what the uninterrupted run computes:
generation rounds are seeded by round index (``Trainer.sampling_params``), a pending generation batch
is re-planned from the schedule and RNG state saved just before it was first planned, and the
updates already done are skipped.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from rlvr.errors import ConfigError
from rlvr.lora import is_adapter_folder, is_peft_model, load_adapter_weights, write_base_model_spec
from rlvr.precision.record import RECORD_FILE, write_precision_record
from rlvr.util.staging import make_staging_dir
from rlvr.trainer.checkpoint_state import (
    CHECKPOINT_VERSION,
    STATE_FILE,
    WRITE_ERRORS,
    CheckpointWriteError,
    capture_rng_state,
    data_fingerprint,
    describe_write_error,
    free_space_note,
    load_reward_state,
    load_round_state,
    require_complete,
    restore_counters,
    restore_rng_state,
    reward_state,
    save_round_state,
    swap_into_place,
    trainer_counters,
)
from rlvr.trainer.checksums import CHECKSUM_FILE, write_checksums
from rlvr.trainer.dist_checkpoint import is_distributed_checkpoint, load_distributed
from rlvr.trainer.run_dir import apply_umask, find_resumable

IGNORED_ON_RESUME = ("max_steps", "logging", "save_steps", "eval", "max_idle_rounds", "vllm")
"""Config keys (and sections) that may change between a run and its resumption (``vllm``: where and how the
server runs, not what it computes)."""


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict) and d:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def resume_differences(saved_state: dict[str, Any], cfg: Any) -> list[str]:
    """Human-readable differences that make resuming from ``saved_state`` unsafe under ``cfg``.

    Compares the saved config with ``cfg`` key by key (dotted paths; ``IGNORED_ON_RESUME`` sections
    left out) and the saved data-file hashes with the files' current contents.

    Returns:
        one line per difference, e.g. ``"learning_rate: 1e-06 -> 1e-05"`` or
        ``"task.path (/d/train.jsonl): file contents changed"``; empty when resuming is safe.
    """
    saved = {k: v for k, v in _flatten(saved_state.get("config", {})).items()
             if k.split(".")[0] not in IGNORED_ON_RESUME}
    now = {k: v for k, v in _flatten(cfg.model_dump(mode="json")).items() if k.split(".")[0] not in IGNORED_ON_RESUME}
    missing = object()
    lines = []
    for k in sorted(set(saved) | set(now)):
        a, b = saved.get(k, missing), now.get(k, missing)
        if a != b:
            lines.append(f"{k}: {'(absent)' if a is missing else json.dumps(a)} -> {'(absent)' if b is missing else json.dumps(b)}")
    old_data = saved_state.get("data", {})
    new_data = data_fingerprint(cfg.task)
    for k in sorted(set(old_data) | set(new_data)):
        if old_data.get(k) != new_data.get(k):
            where = getattr(cfg.task, k.split(".", 1)[1], None)
            what = "file contents changed" if k in old_data and k in new_data else (
                "file is missing now" if k in old_data else "file was not recorded in the checkpoint")
            lines.append(f"{k} ({where}): {what}")
    return lines


def save_checkpoint(trainer: Any, path: str | Path, *, hf_folder: bool = False) -> Path:
    """Atomically write ``trainer``'s full state to ``path`` (replacing an older one there).

    With ``hf_folder`` only the model and tokenizer are written (an export for ``rlvr eval`` or
    ``from_pretrained``), still atomically.

    Returns:
        the final path.

    Raises:
        CheckpointWriteError: the disk is full or not writable; names the file being written. The
            temporary folder is removed, so nothing half-written is left (an older checkpoint at
            ``path`` stays as it was).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_staging_dir(path)
    stage = "model.safetensors"  # the file being written, for the error message
    try:
        trainer.model.save_pretrained(tmp, safe_serialization=True)  # a PeftModel writes its adapter only
        stage = "tokenizer files"
        trainer.tokenizer.save_pretrained(tmp)
        stage = RECORD_FILE
        write_precision_record(tmp, trainer.precision)  # what --resume and rlvr eval follow
        if is_peft_model(trainer.model):
            write_base_model_spec(trainer.model, tmp)
        if not hf_folder:
            stage = "optimizer.pt"
            torch.save(trainer.optimizer.state_dict(), tmp / "optimizer.pt")
            stage = "scheduler.pt"
            torch.save(trainer.scheduler.state_dict(), tmp / "scheduler.pt")
            stage = f"{STATE_FILE} and the round state"
            state = {
                "version": CHECKPOINT_VERSION,
                **trainer_counters(trainer),
                "loader": trainer.loader.state_dict(),
                "rng": capture_rng_state(),
                "config": trainer.run_config.model_dump(mode="json"),
                "data": data_fingerprint(trainer.cfg.task),
            }
            state.update(save_round_state(trainer, tmp))
            state.update(reward_state(trainer))
            (tmp / STATE_FILE).write_text(json.dumps(state))
            stage = CHECKSUM_FILE
            write_checksums(tmp)  # verified before a resume picks this checkpoint (run_dir.checkpoint_problems)
        stage = ".complete"
        with open(tmp / ".complete", "w") as f:
            f.flush()
            os.fsync(f.fileno())
        apply_umask(tmp)  # mkdtemp makes 0700 and some writers 0600: follow the user's umask instead
        stage = "the rename into place"
        swap_into_place(tmp, path)
    except WRITE_ERRORS as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(
            f"could not write checkpoint {path} ({stage}): {describe_write_error(exc)}"
            f"{free_space_note(path.parent)}; the partial folder was removed, so nothing half-written is left"
        ) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The whole ``checkpoint-N`` folder with the largest N under ``output_dir``, or None; newer ones
    that are incomplete or corrupt are skipped (see :func:`rlvr.trainer.run_dir.find_resumable`)."""
    return find_resumable(output_dir)[0]


def check_weights_fit(path: Path, weights: dict[str, torch.Tensor], model_sd: dict[str, torch.Tensor]) -> None:
    """Refuse, in one line, a full-model checkpoint that is not of this run's model: a LoRA adapter
    folder, other tensor names, or other shapes (another architecture: ``--resume force`` after
    ``model.name_or_path`` changed), instead of ``load_state_dict``'s line per mismatched tensor.

    Raises:
        ConfigError: naming the checkpoint, what differs, a count and the first example (exit 2).
    """
    if not weights and is_adapter_folder(path):
        raise ConfigError(f"--resume: checkpoint {path} holds a LoRA adapter, but this run trains the full model "
                          "(model.lora.r=0): resume it with the same model.lora.* settings")
    missing = [k for k in model_sd if k not in weights and "lm_head" not in k]  # tied heads are not stored separately
    unexpected = [k for k in weights if k not in model_sd]
    wrong = [k for k in weights if k in model_sd and tuple(weights[k].shape) != tuple(model_sd[k].shape)]
    if wrong:
        k = wrong[0]
        raise ConfigError(f"--resume: checkpoint {path} is of another model architecture than this run's: "
                          f"{len(wrong)} of {len(model_sd)} tensors differ in shape, e.g. {k!r} (checkpoint "
                          f"{list(weights[k].shape)}, this run {list(model_sd[k].shape)}); was model.name_or_path changed?")
    if missing or unexpected:
        raise ConfigError(f"--resume: checkpoint {path} does not match this run's model (another architecture?): "
                          f"{len(missing)} tensors missing (e.g. {missing[:3]}), {len(unexpected)} unexpected "
                          f"(e.g. {unexpected[:3]})")


def load_checkpoint(trainer: Any, path: str | Path) -> dict[str, Any]:
    """Restore model weights, optimizer, scheduler, loader position and RNG states from ``path``.

    Returns:
        the saved ``trainer_state.json`` contents.

    Raises:
        FileNotFoundError: ``path`` is not a complete checkpoint.
        ConfigError: its weights are not of this run's model (:func:`check_weights_fit`; for LoRA
            :func:`rlvr.lora.load_adapter_weights`), or hold NaN / infinite values once loaded (exit 2).
    """
    from safetensors.torch import load_file

    path = Path(path)
    state = require_complete(path)
    if is_distributed_checkpoint(path):  # written under torchrun: DCP, loadable onto any world size
        return load_distributed(trainer, path, state)
    if trainer.world_size > 1:
        raise RuntimeError(
            f"{path} was written by a single-process run; resuming it under torchrun is not supported "
            "(resume it with plain `rlvr train --resume`, or start the job from its model folder)"
        )
    if is_peft_model(trainer.model):
        load_adapter_weights(trainer.model, path)  # LoRA: the base is unchanged, only adapters were saved
    else:
        weights: dict[str, torch.Tensor] = {}
        for f in sorted(path.glob("model*.safetensors")):
            weights.update(load_file(str(f)))
        check_weights_fit(path, weights, trainer.model.state_dict())
        trainer.model.load_state_dict(weights, strict=False)
    nonfinite = [n for n, p in trainer.model.named_parameters() if p.is_floating_point() and not bool(torch.isfinite(p).all())]
    if nonfinite:
        raise ConfigError(f"--resume: checkpoint {path}: the loaded weights hold NaN or infinite values "
                          f"({len(nonfinite)} tensors, e.g. {nonfinite[0]!r}): resume from an earlier checkpoint-N")
    trainer.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    trainer.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    restore_counters(trainer, state)  # the engine's weights then predate the loaded ones: pushed before generating
    trainer.loader.load_state_dict(state["loader"])
    load_reward_state(trainer, state)
    load_round_state(trainer, path, state)
    restore_rng_state(state["rng"])
    return state


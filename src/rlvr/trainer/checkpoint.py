"""Checkpoints: written atomically, read without unpickling untrusted data.

Layout of ``checkpoint-N/``: the policy as a Hugging Face folder (``model.safetensors``, config,
tokenizer), ``optimizer.pt`` and ``scheduler.pt`` (tensors and plain containers only, read with
``torch.load(weights_only=True)``), ``trainer_state.json`` (step, generation round, loader position,
RNG states, schedule state, config, content hashes of the task's data files), and, when the run was
between the optimizer updates of one generation batch (μ > 1), ``pending.safetensors`` +
``pending.json`` (that batch, :mod:`rlvr.rollout_io`) with the index of the next update; the
dynamic-sampling carry as ``carry-K.*``; schedule tensors as ``schedule.safetensors``.
The folder is assembled under a temporary name and renamed into place, so a kill at any moment leaves
either the previous checkpoint or the new one, never half of one. Nothing is ever unpickled on load.

Identical continuation (issue 3): a run killed at any point and resumed from its latest checkpoint
repeats at most the update in progress and then computes exactly what the uninterrupted run computes:
generation rounds are seeded by round index (``Trainer.sampling_params``), a pending generation batch
is re-planned from the schedule and RNG state saved just before it was first planned, and the
updates already done are skipped.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlvr.errors import RlvrError
from rlvr.lora import is_peft_model, load_adapter_weights, write_base_model_spec
from rlvr.trainer.run_dir import apply_umask, find_resumable

STATE_FILE = "trainer_state.json"
CHECKPOINT_VERSION = 2
IGNORED_ON_RESUME = ("max_steps", "logging", "save_steps", "eval", "max_idle_rounds", "vllm")
"""Config keys (and sections) that may change between a run and its resumption (``vllm``: where and how the
server runs, not what it computes)."""


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy and torch global RNG states as JSON-serialisable lists."""
    py = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state().tolist(),
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore a state captured by :func:`capture_rng_state`."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def pending_round_state(trainer: Any, batch: Any) -> dict[str, Any]:
    """What a checkpoint needs to re-plan ``batch`` identically: call just before ``schedule.plan``.

    Returns:
        ``{"batch", "schedule_state", "rng", "plan_step", "next_index": 0, "num_opt_batches": None}``.
    """
    return {
        "batch": batch,
        "schedule_state": copy.deepcopy(trainer.schedule.state_dict()),
        "rng": capture_rng_state(),
        "plan_step": trainer.global_step,
        "next_index": 0,
        "num_opt_batches": None,
    }


def file_digest(path: str | Path) -> str:
    """``sha256:<hex>`` of a file's bytes, or of a folder's files (relative names and bytes, sorted)."""
    h = hashlib.sha256()
    p = Path(path)
    files = sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
    for f in files:
        if p.is_dir():
            h.update(str(f.relative_to(p)).encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return "sha256:" + h.hexdigest()


def data_fingerprint(task_cfg: Any) -> dict[str, str]:
    """Content hashes of the task's local data files: ``{"task.path": digest, "task.eval_path": ...}``.

    Only keys whose value names an existing local file or folder are included (hub datasets and
    generated reasoning-gym data are covered by the config comparison instead).
    """
    out: dict[str, str] = {}
    for key in ("path", "eval_path"):
        value = getattr(task_cfg, key, None)
        if value and Path(value).expanduser().exists():
            out[f"task.{key}"] = file_digest(Path(value).expanduser())
    return out


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
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    stage = "model.safetensors"  # the file being written, for the error message
    try:
        trainer.model.save_pretrained(tmp, safe_serialization=True)  # a PeftModel writes its adapter only
        stage = "tokenizer files"
        trainer.tokenizer.save_pretrained(tmp)
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
                "global_step": trainer.global_step,
                "generation_round": trainer.generation_round,
                "rollout_round": getattr(trainer, "rollout_round", trainer.generation_round),
                "weight_version": getattr(trainer, "weight_version", trainer.global_step),
                "num_tokens": trainer.num_tokens,
                "consecutive_nonfinite": getattr(trainer, "consecutive_nonfinite", 0),
                "loader": trainer.loader.state_dict(),
                "rng": capture_rng_state(),
                "config": getattr(trainer, "run_config", trainer.cfg).model_dump(mode="json"),
                "data": data_fingerprint(trainer.cfg.task),
            }
            state.update(_save_round_state(trainer, tmp))
            (tmp / STATE_FILE).write_text(json.dumps(state))
        stage = ".complete"
        with open(tmp / ".complete", "w") as f:
            f.flush()
            os.fsync(f.fileno())
        apply_umask(tmp)  # mkdtemp makes 0700 and some writers 0600: follow the user's umask instead
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(
            f"could not write checkpoint {path} ({stage}): {exc.strerror or exc}; the partial folder was removed, "
            f"so nothing half-written is left"
        ) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


class CheckpointWriteError(RlvrError):
    """A checkpoint could not be written (disk full, read-only); the message names the file. Exit code 1."""


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The whole ``checkpoint-N`` folder with the largest N under ``output_dir``, or None; newer ones
    that are incomplete or corrupt are skipped (see :func:`rlvr.trainer.run_dir.find_resumable`)."""
    return find_resumable(output_dir)[0]


def load_checkpoint(trainer: Any, path: str | Path) -> dict[str, Any]:
    """Restore model weights, optimizer, scheduler, loader position and RNG states from ``path``.

    Returns:
        the saved ``trainer_state.json`` contents.

    Raises:
        FileNotFoundError: ``path`` is not a complete checkpoint.
    """
    from safetensors.torch import load_file

    from rlvr.trainer.dist_checkpoint import is_distributed_checkpoint, load_distributed

    path = Path(path)
    if not (path / ".complete").exists() or not (path / STATE_FILE).exists():
        raise FileNotFoundError(f"{path} is not a complete rlvr checkpoint (missing .complete or {STATE_FILE})")
    if is_distributed_checkpoint(path):  # written under torchrun: DCP, loadable onto any world size
        return load_distributed(trainer, path)
    if getattr(trainer, "world_size", 1) > 1:
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
        missing, unexpected = trainer.model.load_state_dict(weights, strict=False)
        missing = [k for k in missing if "lm_head" not in k]  # tied heads are not stored separately
        if missing or unexpected:
            raise RuntimeError(f"checkpoint {path} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    trainer.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    trainer.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    state = json.loads((path / STATE_FILE).read_text())
    trainer.global_step = int(state["global_step"])
    trainer.generation_round = int(state["generation_round"])
    trainer.rollout_round = int(state.get("rollout_round", state["generation_round"]))
    trainer.weight_version = int(state.get("weight_version", trainer.global_step))
    if getattr(trainer, "generation_sync", None) is not None:
        trainer.generation_sync.version = -1  # the engine's weights predate the loaded ones: push before generating
    trainer.num_tokens = int(state["num_tokens"])
    trainer.consecutive_nonfinite = int(state.get("consecutive_nonfinite", 0))
    trainer.loader.load_state_dict(state["loader"])
    _load_round_state(trainer, path, state)
    restore_rng_state(state["rng"])
    return state


def _split_schedule_state(sched: dict[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    tensors = sched.get("tensors") or {}
    plain = {k: v for k, v in sched.items() if k != "tensors"}
    return plain, {k: v.detach().contiguous().clone() for k, v in tensors.items()}


def _save_round_state(trainer: Any, folder: Path) -> dict[str, Any]:
    """Write the pending generation batch, dynamic-sampling carry and schedule state; return the JSON part."""
    from safetensors.torch import save_file

    from rlvr.rollout_io import save_rollouts

    out: dict[str, Any] = {}
    pending = getattr(trainer, "pending_round", None)
    n = pending.get("num_opt_batches") if pending else None
    if pending is not None and n is not None and pending["next_index"] < n:
        save_rollouts(pending["batch"], folder, "pending")
        sched = pending["schedule_state"]
        out["pending"] = {"next_index": int(pending["next_index"]), "num_opt_batches": int(n),
                          "plan_step": int(pending["plan_step"]), "rng": pending["rng"]}
    else:
        sched = trainer.schedule.state_dict() if hasattr(trainer.schedule, "state_dict") else {}
    plain, tensors = _split_schedule_state(sched or {})
    out["schedule"] = plain
    if tensors:
        save_file(tensors, str(folder / "schedule.safetensors"))
        out["schedule_tensors"] = sorted(tensors)
    carry = getattr(trainer, "_carry", None) or []
    for k, b in enumerate(carry):
        save_rollouts(b, folder, f"carry-{k}")
    out["num_carry"] = len(carry)
    pipe = getattr(trainer, "_pipeline", None)  # max_async_level > 0: rounds generated ahead (trainer/overlap.py)
    if pipe is not None:
        st = pipe.state()
        for k, (b, _, _) in enumerate(st["ready"]):
            save_rollouts(b, folder, f"queued-{k}")
        out["async"] = {"round_index": st["round_index"], "started": st["started"],
                        "metrics": [m for _, m, _ in st["ready"]], "sources": [src for _, _, src in st["ready"]]}
    return out


def _load_round_state(trainer: Any, path: Path, state: dict[str, Any]) -> None:
    from safetensors.torch import load_file

    from rlvr.rollout_io import load_rollouts

    sched = dict(state.get("schedule", {}))
    if state.get("schedule_tensors"):
        sched["tensors"] = load_file(str(path / "schedule.safetensors"))
    problems = getattr(getattr(trainer, "loader", None), "problems", None) or []
    by_uid = {getattr(p, "uid", None): p for p in problems}
    trainer._carry = [load_rollouts(path, f"carry-{k}", problems_by_uid=by_uid) for k in range(int(state.get("num_carry", 0)))]
    pipe, a = getattr(trainer, "_pipeline", None), state.get("async")
    if pipe is not None and a is not None:
        ready = [(load_rollouts(path, f"queued-{k}", problems_by_uid=by_uid), m, int(src))
                 for k, (m, src) in enumerate(zip(a["metrics"], a["sources"]))]
        pipe.load_state({"ready": ready, "round_index": a["round_index"], "started": a["started"]})
    p = state.get("pending")
    if p:
        trainer._resume_round = {
            "batch": load_rollouts(path, "pending", problems_by_uid=by_uid), "schedule_state": sched,
            "rng": p["rng"], "plan_step": int(p["plan_step"]), "next_index": int(p["next_index"]),
            "num_opt_batches": int(p["num_opt_batches"]),
        }
    else:
        trainer._resume_round = None
        if hasattr(trainer.schedule, "load_state_dict"):
            trainer.schedule.load_state_dict(sched)

"""What every checkpoint writer shares: file names, version, RNG capture, data fingerprints, the
completeness check and the per-process round state (pending batch, carry, schedule, async queue).

Both writers import from here — :mod:`rlvr.trainer.checkpoint` (one process) and
:mod:`rlvr.trainer.dist_checkpoint` (a ``torchrun`` job, per rank) — so neither imports the other's
internals (``checkpoint`` dispatches to ``dist_checkpoint``; nothing points back).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlvr.errors import RlvrError
from rlvr.util.staging import aside_name

__all__ = [
    "STATE_FILE", "CHECKPOINT_VERSION", "capture_rng_state", "restore_rng_state", "pending_round_state",
    "file_digest", "data_fingerprint", "require_complete", "save_round_state", "load_round_state",
    "trainer_counters", "restore_counters", "CheckpointWriteError", "WRITE_ERRORS", "describe_write_error",
    "free_space_note", "swap_into_place", "reward_state", "load_reward_state",
]

STATE_FILE = "trainer_state.json"
CHECKPOINT_VERSION = 2


class CheckpointWriteError(RlvrError):
    """A checkpoint could not be written (disk full, read-only); the message names the checkpoint, the file
    or stage, and the cause. The previous checkpoint at that path, if any, is left as it was. Exit code 1."""


def _write_errors() -> tuple[type[BaseException], ...]:
    """What a full or read-only disk raises while a checkpoint is written: ``OSError`` from plain writes,
    ``SafetensorError`` from safetensors (``I/O error: No space left on device``, not an OSError),
    ``RuntimeError`` from ``torch.save`` (``[enforce fail at inline_container.cc] unexpected pos``, which
    names no cause: hence :func:`free_space_note`), and ``CheckpointException`` from
    ``torch.distributed.checkpoint.save``: every rank's failure (an ``OSError`` of its ``.distcp`` writes or
    of rank 0's ``.metadata``) is gathered and raised on every rank, wrapped in that class, which is a
    ``BaseException``, not an ``Exception`` (torch/distributed/checkpoint/utils.py, ``_DistWrapper``)."""
    from safetensors import SafetensorError
    from torch.distributed.checkpoint.api import CheckpointException

    return (OSError, SafetensorError, RuntimeError, CheckpointException)


WRITE_ERRORS = _write_errors()


def describe_write_error(exc: BaseException) -> str:
    """One line for a :data:`WRITE_ERRORS` exception: ``strerror`` (and the file) of an ``OSError``; for a
    DCP ``CheckpointException`` the ranks that failed and each one's cause, not its multi-line traceback."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        return "; ".join(f"rank {r}: {describe_write_error(e)}" for r, (e, _) in sorted(failures.items()))
    if isinstance(exc, OSError):
        return exc.strerror + (f": {exc.filename}" if exc.filename else "") if exc.strerror else str(exc)
    return f"{type(exc).__name__}: {exc}"


def free_space_note(folder: Path) -> str:
    """``" (12.0 MB free on that disk)"``, or "" where the free space cannot be read."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return ""
    return f" ({free / 1e6:.1f} MB free on that disk)"


def swap_into_place(tmp: Path, path: Path) -> None:
    """Rename the finished folder ``tmp`` to ``path``, replacing an older one there: it is moved aside
    first (``.<name>.old-*``, :func:`rlvr.util.staging.aside_name`), and moved back if the rename fails, so
    ``path`` holds the old or the new folder, never nothing. A kill between the two renames leaves the old
    one aside, which :func:`rlvr.trainer.run_dir.clean_stale_temporaries` puts back on the next start.

    Raises:
        OSError: a rename failed (``path`` is then as it was).
    """
    old = None
    if path.exists():
        old = aside_name(path)
        os.replace(path, old)
    try:
        os.replace(tmp, path)
    except BaseException:
        if old is not None:
            os.replace(old, path)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def require_complete(path: Path) -> dict[str, Any]:
    """The ``trainer_state.json`` of the complete checkpoint at ``path``.

    Raises:
        FileNotFoundError: ``path`` lacks ``.complete`` or ``trainer_state.json`` (a folder whose writer
            was killed before the rename, or not a checkpoint).
    """
    if not (path / ".complete").exists() or not (path / STATE_FILE).exists():
        raise FileNotFoundError(f"{path} is not a complete rlvr checkpoint (missing .complete or {STATE_FILE})")
    return json.loads((path / STATE_FILE).read_text())


def trainer_counters(trainer: Any) -> dict[str, int]:
    """The progress counters of ``trainer.run_state`` (:meth:`RunState.counters
    <rlvr.trainer.run_state.RunState.counters>`), as both checkpoint writers store them in ``trainer_state.json``:
    ``global_step``, ``generation_round``, ``rollout_round`` (seeds the next round's sampling: a resume
    that lost it would draw other rollouts), ``weight_version``, ``num_tokens``, ``consecutive_nonfinite``."""
    return trainer.run_state.counters()


def restore_counters(trainer: Any, state: dict[str, Any]) -> None:
    """Set ``trainer.run_state``'s counters from a saved state (older files: ``rollout_round`` defaults to
    ``generation_round``, ``weight_version`` to ``global_step``); the engine's weights then count as
    stale (``generation_sync.version = -1``: pushed before the next round)."""
    trainer.run_state.load_counters(state)
    if trainer.generation_sync is not None:
        trainer.generation_sync.version = -1


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


def _split_schedule_state(sched: dict[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    tensors = sched.get("tensors") or {}
    plain = {k: v for k, v in sched.items() if k != "tensors"}
    return plain, {k: v.detach().contiguous().clone() for k, v in tensors.items()}


def save_round_state(trainer: Any, folder: Path) -> dict[str, Any]:
    """Write the pending generation batch, dynamic-sampling carry and schedule state; return the JSON part."""
    from safetensors.torch import save_file

    from rlvr.rollout_io import save_rollouts

    out: dict[str, Any] = {}
    rs = trainer.run_state
    pending = rs.pending_round
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
    carry = rs.carry
    for k, b in enumerate(carry):
        save_rollouts(b, folder, f"carry-{k}")
    out["num_carry"] = len(carry)
    pipe = rs.pipeline  # max_async_level > 0: rounds generated ahead (trainer/overlap.py)
    if pipe is not None:
        st = pipe.state()
        for k, (r, _) in enumerate(st["ready"]):
            save_rollouts(r.batch, folder, f"queued-{k}")
        out["async"] = {"round_index": st["round_index"], "started": st["started"],
                        "metrics": [r.metrics for r, _ in st["ready"]], "sources": [src for _, src in st["ready"]],
                        "signals": [None if r.signal is None else dataclasses.asdict(r.signal) for r, _ in st["ready"]]}
    return out


def load_round_state(trainer: Any, path: Path, state: dict[str, Any]) -> None:
    from safetensors.torch import load_file

    from rlvr.rollout_io import load_rollouts

    sched = dict(state.get("schedule", {}))
    if state.get("schedule_tensors"):
        sched["tensors"] = load_file(str(path / "schedule.safetensors"))
    problems = getattr(getattr(trainer, "loader", None), "problems", None) or []
    by_uid = {getattr(p, "uid", None): p for p in problems}
    rs = trainer.run_state
    rs.carry = [load_rollouts(path, f"carry-{k}", problems_by_uid=by_uid) for k in range(int(state.get("num_carry", 0)))]
    pipe, a = rs.pipeline, state.get("async")
    if pipe is not None and a is not None:
        from rlvr.trainer.idle import RoundSignal
        from rlvr.trainer.prepare import RoundResult

        signals = a.get("signals") or [None] * len(a["sources"])
        ready = [(RoundResult(load_rollouts(path, f"queued-{k}", problems_by_uid=by_uid), m,
                              None if sig is None else RoundSignal(**sig)), int(src))
                 for k, (m, src, sig) in enumerate(zip(a["metrics"], a["sources"], signals))]
        pipe.load_state({"ready": ready, "round_index": a["round_index"], "started": a["started"]})
    p = state.get("pending")
    if p:
        rs.resume_round = {
            "batch": load_rollouts(path, "pending", problems_by_uid=by_uid), "schedule_state": sched,
            "rng": p["rng"], "plan_step": int(p["plan_step"]), "next_index": int(p["next_index"]),
            "num_opt_batches": int(p["num_opt_batches"]),
        }
    else:
        rs.resume_round = None
        if hasattr(trainer.schedule, "load_state_dict"):
            trainer.schedule.load_state_dict(sched)


def reward_state(trainer: Any) -> dict[str, Any]:
    """``{"rewards": ...}``: the scorer's state (a ``rewards:`` list's running normalisation,
    :meth:`rlvr.rewards.combine.CombinedScorer.state_dict`), or ``{}`` for a scorer without one."""
    sd = getattr(trainer.scorer, "state_dict", None)
    return {"rewards": sd()} if sd is not None else {}


def load_reward_state(trainer: Any, state: dict[str, Any]) -> None:
    """Give the scorer its :func:`reward_state` back (a checkpoint without one leaves it as built)."""
    if "rewards" in state and hasattr(trainer.scorer, "load_state_dict"):
        trainer.scorer.load_state_dict(state["rewards"])

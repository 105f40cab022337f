"""The run directory: refusing to mix two runs in one, ``--overwrite``, checkpoint rotation
(``save_total_limit``), checking that a checkpoint is whole before resuming from it, and file modes
that follow the user's umask.

Interpretation (issue 12, items 5 and 6): TRL refuses a non-empty ``output_dir`` only through
``overwrite_output_dir``; here a folder that already holds a run's training files (metrics,
checkpoints, ``final/``) is refused unless ``--resume`` (continue it) or ``--overwrite`` (delete
exactly those files) says what to do, because appending a second run's rows to the first one's
``metrics.jsonl`` silently mixes them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import zipfile
from pathlib import Path
from typing import Callable

from rlvr.errors import OutputDirError
from rlvr.util.staging import aside_name, may_remove, parse, remove_stale
from rlvr.util.text import plural

STATE_FILE = "trainer_state.json"  # same name as rlvr.trainer.checkpoint.STATE_FILE
RUN_FILES = ("metrics.jsonl", "completions.jsonl", "config.yaml", "tb", "final")
"""A run's training artefacts in its output dir, besides ``checkpoint-*`` (``eval_*.json`` and plots
are not: ``rlvr eval --tag before`` may write into the folder before the first ``rlvr train``)."""


def run_artefacts(output_dir: str | Path) -> list[Path]:
    """The training artefacts of an earlier run in ``output_dir`` (sorted; empty when none).

    Counts ``metrics.jsonl`` and ``completions.jsonl`` only when non-empty, ``checkpoint-N`` folders
    (complete or not) and their temporaries, ``final/``, ``tb/`` and ``config.yaml``.
    """
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = []
    for name in RUN_FILES:
        p = out / name
        if p.is_dir() or (p.is_file() and (p.suffix != ".jsonl" or p.stat().st_size > 0)):
            found.append(p)
    found += [p for p in out.glob("checkpoint-*") if p.is_dir()]
    found += [p for p in out.glob(".checkpoint-*") if p.is_dir()] + [p for p in out.glob(".final.*") if p.is_dir()]
    return sorted(set(found))


def refuse_restart_of_finished_run(output_dir: str | Path) -> None:
    """``--resume`` found no ``checkpoint-N`` in ``output_dir``: refuse when the folder holds a
    finished run (``final/``), which a start from scratch would overwrite together with its
    ``metrics.jsonl`` rows; a run stopped before its first checkpoint (no ``final/``) may restart.

    Interpretation: ``save_steps`` defaults to 0, so a finished run usually has ``final/`` but no
    checkpoint; ``--resume max_steps=<more>`` on it used to restart silently from step 1, losing the
    trained model and its metrics ("nothing already written is lost").

    Raises:
        OutputDirError: naming the folder and the ways out (exit 2, before any model loads).
    """
    out = Path(output_dir)
    if (out / "final").is_dir():
        raise OutputDirError(
            f"--resume: {out} holds a finished run (final/) but no checkpoint-N to continue from (save_steps=0 "
            f"writes none; set save_steps=N to make a run resumable). Starting from scratch would overwrite its "
            f"final/ and metrics.jsonl, so rlvr refuses: start over with --overwrite instead of --resume, or train "
            f"on from its weights in a new folder with model.name_or_path={out / 'final'} logging.output_dir=NEW_DIR"
        )


def describe(paths: list[Path], limit: int = 6) -> str:
    """``"metrics.jsonl, checkpoint-4/, final/"`` (folders with a slash; at most ``limit`` names)."""
    names = [p.name + ("/" if p.is_dir() else "") for p in paths]
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def remove_run_artefacts(output_dir: str | Path) -> list[Path]:
    """``--overwrite``: delete the files :func:`run_artefacts` lists, nothing else; return them."""
    gone = run_artefacts(output_dir)
    for p in gone:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    return gone


def forget_failed_start(output_dir: str | Path) -> list[Path]:
    """A start that failed before its first step (a tracker that cannot log in, a tokenizer without a chat
    template, a full disk) in a folder that held no run: delete what it wrote (``config.yaml``, ``tb/``,
    empty ``metrics.jsonl`` / ``completions.jsonl``), so the next start is not refused as "already holds a
    run". The caller knows the folder held no run before this start; nothing is deleted once a step was
    logged or a checkpoint or ``final/`` was written (then the run's files are kept for ``--resume``).

    Returns:
        the paths deleted.
    """
    out = Path(output_dir)
    if not out.is_dir() or any(out.glob("checkpoint-*")) or (out / "final").exists():
        return []
    rows = [out / "metrics.jsonl", out / "completions.jsonl"]
    if any(p.is_file() and p.stat().st_size > 0 for p in rows):
        return []
    gone = [p for p in (*rows, out / "config.yaml", out / "tb") if p.exists() and not p.is_symlink()]
    for p in gone:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return gone


def check_writable_dir(output_dir: str | Path, key: str = "logging.output_dir") -> Path:
    """Create ``output_dir`` if needed and prove it can be written (a probe file is made and removed).

    Returns:
        the folder.

    Raises:
        OutputDirError: it is a file, cannot be created, or is not writable (read-only mount,
            permissions, disk full); the message names the path and the reason.
    """
    p = Path(output_dir).expanduser()
    if p.exists() and not p.is_dir():
        raise OutputDirError(f"{key}={str(output_dir)!r} is a file, not a folder: choose another {key}")
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".rlvr-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OutputDirError(f"{key}={str(output_dir)!r} is not writable: {exc.strerror or exc}") from None
    return p


def _safetensors_problem(f: Path) -> str | None:
    """Why ``f`` is not a whole safetensors file (header unreadable, or shorter than it declares)."""
    size = f.stat().st_size
    try:
        with open(f, "rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                return f"{f.name}: truncated ({size} bytes)"
            n = struct.unpack("<Q", raw)[0]
            if n > size - 8:
                return f"{f.name}: truncated ({size} bytes, header alone declares {n + 8})"
            header = json.loads(fh.read(n))
    except (OSError, ValueError) as exc:
        return f"{f.name}: unreadable safetensors header ({exc})"
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if size < 8 + n + end:
        return f"{f.name}: truncated ({size} of {8 + n + end} bytes)"
    return None


def _distributed_problems(p: Path, state: dict) -> list[str]:
    """The parts of a ``torchrun`` checkpoint: DCP metadata, and per rank its state and the files it names."""
    problems = []
    if not (p / "dcp" / ".metadata").is_file():
        problems.append("dcp/.metadata: missing (the sharded model and optimizer were not finished)")
    for r in range(int(state.get("world_size", 1) or 1)):
        d = p / f"rank-{r}"
        try:
            rs = json.loads((d / "rank_state.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            problems.append(f"rank-{r}/rank_state.json: missing")
            continue
        except (OSError, ValueError) as exc:
            problems.append(f"rank-{r}/rank_state.json: corrupt JSON ({exc})")
            continue
        needed = ["pending.safetensors", "pending.json"] if rs.get("pending") else []
        needed += ["schedule.safetensors"] if rs.get("schedule_tensors") else []
        for k in range(int(rs.get("num_carry", 0) or 0)):
            needed += [f"carry-{k}.safetensors", f"carry-{k}.json"]
        problems += [f"rank-{r}/{n}: missing" for n in needed if not (d / n).is_file()]
    return problems


def checkpoint_problems(path: str | Path) -> list[str]:
    """What makes ``path`` an unusable checkpoint: empty when it looks whole.

    Checks the structure first: the ``.complete`` marker; ``trainer_state.json`` parses; the
    optimizer and scheduler files exist and are whole zip archives (``torch.save``'s format); every
    ``*.safetensors`` file is as long as its header declares; the files the state refers to
    (pending batch, schedule tensors, carry) exist; every ``*.json`` parses. Then, when all that holds,
    the bytes: every file against the ``checksums.sha256`` written at save time, or for an older
    checkpoint without one the zip CRCs and finite weights (:mod:`rlvr.trainer.checksums`).

    Returns:
        one line per problem, each naming the file, e.g. ``"model.safetensors: truncated (10 of 99 bytes)"``.
    """
    p = Path(path)
    problems: list[str] = []
    if not (p / ".complete").exists():
        problems.append(".complete: missing (the checkpoint was never finished)")
    state: dict = {}
    try:
        state = json.loads((p / STATE_FILE).read_text(encoding="utf-8"))
        if not isinstance(state, dict):
            problems.append(f"{STATE_FILE}: not a JSON object")
            state = {}
    except FileNotFoundError:
        problems.append(f"{STATE_FILE}: missing")
    except (OSError, ValueError) as exc:
        problems.append(f"{STATE_FILE}: corrupt JSON ({exc})")
    distributed = (p / "dcp").is_dir()  # written under torchrun (rlvr.trainer.dist_checkpoint)
    if distributed:
        problems += _distributed_problems(p, state)
    for name in ("scheduler.pt",) if distributed else ("optimizer.pt", "scheduler.pt"):
        f = p / name
        if not f.is_file():
            problems.append(f"{name}: missing")
        elif not zipfile.is_zipfile(f):
            problems.append(f"{name}: corrupt or truncated ({f.stat().st_size} bytes)")
    weights = list(p.glob("*.safetensors"))
    if not any(f.name.startswith(("model", "adapter")) for f in weights) and not any(p.glob("*.distcp")):
        problems.append("model.safetensors: missing (no model weights)")
    for f in sorted(weights):
        why = _safetensors_problem(f)
        if why:
            problems.append(why)
    needed = []
    if distributed:
        state = {}  # the pending batch, schedule tensors and carry live in rank-R/ (checked above)
    if state.get("pending"):
        needed += ["pending.safetensors", "pending.json"]
    if state.get("schedule_tensors"):
        needed.append("schedule.safetensors")
    for k in range(int(state.get("num_carry", 0) or 0)):
        needed += [f"carry-{k}.safetensors", f"carry-{k}.json"]
    problems += [f"{n}: missing" for n in needed if not (p / n).is_file()]
    for f in sorted(p.glob("*.json")):
        if f.name == STATE_FILE:
            continue
        try:
            json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            problems.append(f"{f.name}: corrupt JSON ({exc})")
    if not problems:  # whole in structure: now the bytes (rlvr.trainer.checksums)
        from rlvr.trainer.checksums import checksum_problems, legacy_content_problems

        damaged = checksum_problems(p)
        problems += legacy_content_problems(p) if damaged is None else damaged
    return problems


def checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """``checkpoint-N`` folders under ``output_dir`` as ``(N, path)``, newest first."""
    found = []
    for p in Path(output_dir).glob("checkpoint-*"):
        try:
            found.append((int(p.name.split("-", 1)[1]), p))
        except ValueError:
            continue
    return sorted(found, reverse=True)


def find_resumable(output_dir: str | Path) -> tuple[Path | None, list[tuple[Path, list[str]]]]:
    """The newest whole checkpoint under ``output_dir`` and the newer ones skipped as broken.

    Returns:
        ``(path or None, [(skipped checkpoint, its problems), ...])``, skipped newest first.
    """
    skipped = []
    for _, p in checkpoints(output_dir):
        problems = checkpoint_problems(p)
        if not problems:
            return p, skipped
        skipped.append((p, problems))
    return None, skipped


def rotate_checkpoints(output_dir: str | Path, keep: int | None) -> list[Path]:
    """``save_total_limit``: delete all but the newest ``keep`` ``checkpoint-N`` folders (TRL's rule,
    without its exception for a best model, which rlvr does not track). ``None`` keeps all.

    Returns:
        the folders deleted.
    """
    if not keep:
        return []
    old = [p for _, p in checkpoints(output_dir)][keep:]
    for p in old:
        gone = aside_name(p, "del")  # renamed first: a kill mid-deletion leaves no half checkpoint-N
        try:
            os.replace(p, gone)
        except OSError:
            gone = p
        shutil.rmtree(gone, ignore_errors=True)
    return old


_RUN_FOLDER = re.compile(r"^(checkpoint-\d+|final)$")
"""The folders of a run dir that are written through a staging folder (checkpoint.py, dist_checkpoint.py)."""


def clean_stale_temporaries(output_dir: str | Path, log: Callable[[str], None] | None = None
                            ) -> tuple[list[Path], list[Path]]:
    """Tidy the staging folders a killed save left in ``output_dir`` (see :mod:`rlvr.util.staging`).

    1. A kill between moving ``checkpoint-N`` (or ``final``) aside and renaming its replacement in leaves
       the name missing and its previous contents in ``.checkpoint-N.old-*``: that folder is renamed back
       (the newest one if there are several), so nothing already written is lost.
    2. The other ``.checkpoint-N.{tmp,old,del}-*`` and ``.final.{tmp,old,del}-*`` folders are deleted:
       half-written checkpoints, replaced ones, ones on their way to deletion.

    When it is safe (interpretation, as rlvr calls it): every staging folder of a run dir is made by the
    process that owns the dir: one ``rlvr train``, or rank 0 of a ``torchrun`` job (other ranks write into
    the folder rank 0 made and broadcast). So the caller is rank 0 (or the only process), before its first
    save; nothing of its own is then in flight. A folder whose name says it belongs to a live process on
    this host (a second process writing the same dir, which rlvr refuses without ``--resume``) is still
    left alone; names of older rlvr versions (no owner in them) and of another host are removed, since a
    second job writing one run dir from another node is not supported. Only folders directly in
    ``output_dir`` with exactly these names are touched (never ``checkpoint-N`` itself, never recursively).

    Args:
        output_dir: the run dir.
        log: called with one line naming what was restored or removed (nothing when nothing was).

    Returns:
        ``(restored, removed)`` folders.
    """
    out = Path(output_dir)
    if not out.is_dir():
        return [], []

    def ours(info: dict[str, str]) -> bool:
        return bool(_RUN_FOLDER.match(info["name"]))

    restored = []
    asides: dict[str, list[Path]] = {}
    for p in out.iterdir():
        info = parse(p.name)
        if info and ours(info) and info["kind"] == "old" and p.is_dir() and not p.is_symlink():
            asides.setdefault(info["name"], []).append(p)
    for name, found in asides.items():
        target = out / name
        found = [p for p in found if may_remove(p, owned_by_caller=True)]
        if found and not target.exists():
            newest = max(found, key=lambda q: q.stat().st_mtime)
            os.replace(newest, target)
            restored.append(target)
    removed = remove_stale(out, ours, owned_by_caller=True)
    if log is not None and restored:
        log(f"rlvr: {', '.join(p.name for p in restored)} was missing after a save interrupted while replacing it: "
            f"put the previous version back in {out}")
    if log is not None and removed:
        log(f"rlvr: removed {plural(len(removed), 'leftover folder')} of interrupted saves "
            f"in {out}: {', '.join(p.name for p in removed)}")
    return restored, removed


def current_umask() -> int:
    """The process umask (read by setting and restoring it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(root: str | Path) -> None:
    """Give ``root`` and everything under it the modes a plain ``open``/``mkdir`` would have under
    the user's umask (0666/0777 minus it): ``tempfile.mkdtemp`` and some writers create 0700/0600."""
    mask = current_umask()
    root = Path(root)
    os.chmod(root, 0o777 & ~mask)
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o777 & ~mask)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o666 & ~mask)

"""Staging folders of atomic folder writes: their names, who owns them, and removing stale ones.

Every folder rlvr writes atomically (checkpoints, ``final/``, the converted default model, the testbed
cache, ``rlvr export``) is assembled in a hidden sibling ``.<name>.tmp-<host>-<pid>-<random>`` and
renamed into place; a folder being replaced is first moved aside to ``.<name>.old-<host>-<pid>-<random>``,
one being deleted to ``.<name>.del-...``.
A ``kill -9`` (or a power cut) in the middle leaves such a folder behind, possibly gigabytes of weights.
The owner's host and process id in the name let a later process tell a leftover from a write still in
progress: on the same host, a staging folder whose process is gone is stale; one of a live process is not
touched (:func:`is_stale`). Names without an owner (written by rlvr before this module) or from another
host carry no such proof; callers decide (an age limit, or an argument why nothing else can be writing).

The one atomic *file* write (:func:`write_text_atomic`: a per-process temporary name, then ``os.replace``)
lives here too, for the eval report, ``rlvr compare``'s result and piece files and the precision cache.

Imports only the standard library (layer 0: used by ``models``, ``lora``, ``testbed``, ``precision.cache``,
``eval``, ``compare`` and the trainer).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Callable

KINDS = ("tmp", "old", "del")
_HOST_CHARS = re.compile(r"[^A-Za-z0-9.]")
_OWNED = re.compile(r"^\.(?P<name>.+?)\.(?P<kind>tmp|old|del)-(?P<host>[A-Za-z0-9.]+)-(?P<pid>\d+)-[A-Za-z0-9_]+$")
_LEGACY = re.compile(r"^\.(?P<name>.+?)\.(?P<kind>tmp|old|del)-[A-Za-z0-9_]+$")  # mkdtemp's / ".old-<pid>" names


def _host() -> str:
    """This machine's name as it appears in staging names (only letters, digits and dots)."""
    return _HOST_CHARS.sub("", socket.gethostname()) or "host"


def _prefix(target: Path, kind: str) -> str:
    return f".{target.name}.{kind}-{_host()}-{os.getpid()}-"


def make_staging_dir(target: str | os.PathLike) -> Path:
    """Create (mode 0700, as ``tempfile.mkdtemp``) the staging folder of ``target``, beside it.

    Returns:
        ``<target's parent>/.<target name>.tmp-<host>-<pid>-<random>``.
    """
    target = Path(target)
    return Path(tempfile.mkdtemp(prefix=_prefix(target, "tmp"), dir=target.parent))


def publish_folder(target: str | os.PathLike, write: Callable[[Path], None], *,
                   done_file: str = "config.json", mode: int = 0o755) -> Path:
    """Build a cache folder once and rename it into place: ``write(staging)`` fills a fresh staging folder
    (:func:`make_staging_dir`, then ``chmod mode``: an ordinary folder, not mkdtemp's 0700), which is renamed
    to ``target``. A concurrent builder that renamed first wins: when the rename fails but ``target`` already
    holds ``done_file``, its folder is used and ours is dropped. The staging folder never outlives the call.

    Used for the converted default model and the testbed cache (built once, never replaced); a folder that is
    replaced in place (a checkpoint) goes through :func:`rlvr.trainer.checkpoint_state.swap_into_place`.

    Returns:
        ``target``.

    Raises:
        whatever ``write`` raises; ``OSError`` when the rename fails and no complete ``target`` is there.
    """
    target = Path(target)
    tmp = make_staging_dir(target)
    try:
        os.chmod(tmp, mode)
        write(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / done_file).is_file():  # not a lost race: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def aside_name(target: str | os.PathLike, kind: str = "old") -> Path:
    """Where ``target`` is moved aside (not created): ``.<name>.<kind>-<host>-<pid>-<random>`` beside it.

    ``kind="old"``: while its replacement is renamed into place (the only whole copy until then, so a
    cleanup may put it back, :func:`rlvr.trainer.run_dir.clean_stale_temporaries`); ``"del"``: on its way
    to deletion (``save_total_limit``), so a kill during the deletion leaves a hidden leftover, never a
    half-deleted ``checkpoint-N`` that looks like a checkpoint.
    """
    if kind not in KINDS:
        raise ValueError(f"aside_name: kind must be one of {KINDS}, got {kind!r}")
    target = Path(target)
    return target.with_name(_prefix(target, kind) + secrets.token_hex(4))


def parse(name: str) -> dict[str, str] | None:
    """``{"name", "kind", "host", "pid"}`` of a staging folder name (``host``/``pid`` empty for a legacy
    name without an owner), or None when ``name`` is not one."""
    m = _OWNED.match(name)
    if m:
        return m.groupdict()
    m = _LEGACY.match(name)
    if m:
        return {**m.groupdict(), "host": "", "pid": ""}
    return None


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def is_stale(path: str | os.PathLike, *, max_age_s: float | None = None) -> bool:
    """Whether the staging folder ``path`` is a leftover that may be removed.

    Stale: its owner ran on this host and is gone (no process with that id); or, when ``max_age_s`` is
    given, nothing in it changed for ``max_age_s`` seconds (the folder's mtime: files created or removed
    in it). A folder of a live process on this host (including this process) is never stale, whatever its
    age. A legacy or another host's folder is stale only by age.
    """
    p = Path(path)
    info = parse(p.name)
    if info is None:
        return False
    if info["pid"] and info["host"] == _host():
        return not _pid_alive(int(info["pid"]))
    if max_age_s is None:
        return False
    try:
        return time.time() - p.stat().st_mtime > max_age_s
    except OSError:
        return False


def may_remove(path: str | os.PathLike, *, max_age_s: float | None = None, owned_by_caller: bool = False) -> bool:
    """Whether a staging folder may be removed (or, for an ``old`` one, put back): :func:`is_stale`, or
    ``owned_by_caller`` and its name names no owner on this host (see :func:`remove_stale`)."""
    info = parse(Path(path).name)
    if info is None:
        return False
    same_host_owner = bool(info["pid"]) and info["host"] == _host()
    return is_stale(path, max_age_s=max_age_s) or (owned_by_caller and not same_host_owner)


def remove_stale(folder: str | os.PathLike, accept: Callable[[dict[str, str]], bool], *,
                 max_age_s: float | None = None, owned_by_caller: bool = False) -> list[Path]:
    """Delete the stale staging folders directly under ``folder`` whose parsed name ``accept`` takes.

    Args:
        folder: where to look (not recursive; a missing folder is fine).
        accept: ``parse(name) -> bool``, e.g. only ``checkpoint-N`` and ``final`` of a run dir.
        max_age_s: see :func:`is_stale`.
        owned_by_caller: the caller knows no other process writes staging folders here except live ones
            on this host (e.g. rank 0 of a job before its first save, in its own run dir): legacy and
            other-host names are then removed too; live owners on this host are still left alone.

    Returns:
        the folders removed (a folder that vanished meanwhile, or cannot be removed, is skipped).
    """
    gone = []
    root = Path(folder)
    if not root.is_dir():
        return gone
    for p in sorted(root.iterdir()):
        info = parse(p.name)
        if info is None or not accept(info) or not p.is_dir() or p.is_symlink():
            continue
        if not may_remove(p, max_age_s=max_age_s, owned_by_caller=owned_by_caller):
            continue
        try:
            shutil.rmtree(p)
        except OSError:  # vanished meanwhile (another cleanup), or not ours to remove
            continue
        gone.append(p)
    return gone


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a per-process temporary file and ``os.replace``, so a
    reader (or a kill at any moment) sees the old file or the new one, never half of one. Creates the
    parent folder; a failed write removes its temporary file.

    Raises:
        OSError: the folder cannot be created or written (e.g. a full disk, a read-only home).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise

"""The per-machine cache of the CPU bf16 verdict (:func:`rlvr.precision.probe_cpu_bf16`).

One small JSON per machine and torch build, so every ``rlvr`` command on a machine resolves
``model.dtype=auto`` the same way (issue 30: three commands of one ``make demo`` once got two answers
from a timing taken anew by each):

* **where**: ``$RLVR_CACHE_DIR/precision/cpu-bf16-<hash>.json``; ``RLVR_CACHE_DIR`` defaults to
  ``~/.cache/rlvr`` (the folder rlvr's converted models and testbed already live under).
* **key**: the CPU model name, its bf16-related and vector flags, the machine type, torch's version and
  CPU capability (:func:`probe_key`). A new torch build or another CPU has another key, so it is timed anew;
  the file stores its key and a file whose key differs (a hash collision, a hand edit) is ignored.
* **written atomically** (a per-process temporary name, then ``os.replace``), and the first measurement is
  taken under an exclusive ``flock`` of ``<file>.lock``: processes started together (``rlvr compare --jobs 2``)
  wait for the first one's verdict instead of timing side by side and loading each other's cores.
* a cache that cannot be read or written (read-only home) is not an error: the verdict is then measured per
  process, and the reason line says it was not cached.

Delete the file to have the machine measured again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any, Iterator

from rlvr.util.staging import write_text_atomic

__all__ = ["CACHE_ENV", "cache_root", "probe_key", "verdict_path", "read_verdict", "write_verdict", "probe_lock"]

CACHE_ENV = "RLVR_CACHE_DIR"
"""Environment variable: rlvr's cache folder for the precision verdict (default ``~/.cache/rlvr``)."""

CACHE_VERSION = 1
"""Bumped when the probe's method changes, so verdicts of an older method are measured again."""


def cache_root() -> Path:
    """``$RLVR_CACHE_DIR`` (user-expanded) or ``~/.cache/rlvr``; not created here."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path("~/.cache/rlvr").expanduser()


def probe_key(cpu_model: str, flags: set[str] | None, torch_version: str, capability: str) -> dict[str, Any]:
    """What a cached verdict is valid for: this CPU model with these flags under this torch build.

    Args:
        cpu_model: ``/proc/cpuinfo``'s ``model name`` (or ``platform.processor()``).
        flags: the CPU's feature flags, or None where they cannot be read (only the bf16-related and vector
            flags enter the key: ``avx*``, ``amx*``, ``bf16``, ``sve*``, ``neon``/``asimd*``).
        torch_version: ``torch.__version__``.
        capability: ``torch.backends.cpu.get_cpu_capability()``.
    """
    keep = None if flags is None else sorted(
        f for f in flags if f.startswith(("avx", "amx", "sve", "asimd")) or f in ("bf16", "neon"))
    return {"version": CACHE_VERSION, "cpu_model": cpu_model, "machine": platform.machine(), "flags": keep,
            "torch": torch_version, "capability": capability}


def verdict_path(key: dict[str, Any]) -> Path:
    """The JSON file of ``key``'s verdict under :func:`cache_root`."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "precision" / f"cpu-bf16-{digest}.json"


def read_verdict(key: dict[str, Any]) -> dict[str, Any] | None:
    """The cached verdict of ``key`` (``native``, ``bf16_over_fp32``, ``rule``, ``decided_at``, ...), or None
    when there is none, it cannot be read or parsed, or it was stored for another key."""
    try:
        data = json.loads(verdict_path(key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("native"), bool):
        return None
    return data


def write_verdict(key: dict[str, Any], verdict: dict[str, Any]) -> tuple[Path | None, str]:
    """Store ``verdict`` for ``key`` atomically.

    Returns:
        ``(path, "")`` when written, ``(None, why)`` when the cache folder cannot be written (not raised:
        the verdict stands for this process regardless).
    """
    path = verdict_path(key)
    try:
        write_text_atomic(path, json.dumps({"key": key, **verdict}, indent=2) + "\n")
    except OSError as exc:
        return None, f"{exc.strerror or exc}: {path.parent}"
    return path, ""


@contextlib.contextmanager
def probe_lock(key: dict[str, Any]) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``<verdict file>.lock`` while the verdict is measured.

    Yields True when the lock is held; False where it cannot be taken (no ``fcntl``, an unwritable cache
    folder): the measurement then runs unlocked.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield False
        return
    lock = verdict_path(key).with_suffix(".lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fh = open(lock, "a")
    except OSError:
        yield False
        return
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        yield True
    finally:
        fh.close()  # closing the file releases the lock

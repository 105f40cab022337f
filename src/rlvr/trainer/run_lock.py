"""One trainer per run directory: an exclusive ``flock`` on ``OUTPUT_DIR/.rlvr-train.lock`` held for the
run's lifetime.

Interpretation (issue 25, item 4.1): two ``rlvr train`` processes writing one ``logging.output_dir`` at
once interleave their ``metrics.jsonl`` rows and overwrite each other's checkpoints and ``final/``; an
``--overwrite`` or ``--resume`` of a run that is still training deletes or mixes its files. A lock taken
before anything in the folder is touched refuses the second process with the holder's pid and host.

Why ``flock`` and not a pid file: the kernel releases an ``flock`` when its holder dies (also on
``kill -9`` or an out-of-memory kill), so a lock file left behind by a dead run never blocks the next
one, and no pid has to be probed for liveness (pids are reused; another host's pids cannot be probed at
all). The pid and host written into the file only serve the message. The holder removes the file before
it lets go of the lock, and a process that took the lock checks that the file it locked is still the
one at the path (else it tries again), so removing it cannot let two processes hold the lock at once
(the usual lock-file protocol); a killed holder's file stays behind, unlocked, and is reused. On network
file systems ``flock`` is as reliable as the server's lock support (NFSv4: yes).

Not locked: ``rlvr eval`` into a run dir (it writes only its own ``eval_*.json`` and may run next to the
trainer, e.g. to score a checkpoint while the run goes on), ``rlvr plot`` and ``rlvr export`` (readers).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from rlvr.errors import OutputDirError

LOCK_FILE = ".rlvr-train.lock"


def _same_file(fh, path: Path) -> bool:
    """Whether the open file ``fh`` is still the file at ``path`` (not removed or replaced since it was opened)."""
    try:
        a, b = os.fstat(fh.fileno()), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _holder(fh) -> str:
    """``"pid 123 on host h (since 2026-01-01 10:00:00 UTC)"`` from the lock file, or a fallback."""
    try:
        fh.seek(0)
        info = json.loads(fh.read() or "{}")
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(info["started"])))
        return f"pid {int(info['pid'])} on host {info['host']} (since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (its pid could not be read from the lock file)"


class RunDirLock:
    """An exclusive, non-blocking ``flock`` on ``output_dir/.rlvr-train.lock`` (see the module docstring).
    Interpretation: the lock-file protocol of ``flock(1)`` users and of the ``filelock`` package, with the
    holder's identity written into the file for the refusal message.

    Use as ``with RunDirLock(out): ...`` or :meth:`acquire` / :meth:`release`. Acquiring twice is a no-op.

    Args:
        output_dir: the run directory (created when ``acquire`` is called and it does not exist).

    Raises:
        OutputDirError: from :meth:`acquire`, when another process holds the lock (exit 2); the message
            names the folder, the holder's pid and host, and the ways out.
    """

    def __init__(self, output_dir: str | Path) -> None:
        self.dir = Path(output_dir)
        self.path = self.dir / LOCK_FILE
        self._fh = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fh is not None

    def acquire(self) -> "RunDirLock":
        """Take the lock, or raise :class:`~rlvr.errors.OutputDirError` naming its holder."""
        if self._fh is not None:
            return self
        self.dir.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                fh = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 (kept open: the lock lives with it)
            except OSError as exc:
                raise OutputDirError(f"logging.output_dir={str(self.dir)!r} is not writable (its lock file "
                                     f"{LOCK_FILE} cannot be made): {exc.strerror or exc}") from None
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                who = _holder(fh)
                fh.close()
                raise OutputDirError(
                    f"logging.output_dir {self.dir} is in use: an rlvr train is running there, {who}. Two trainers "
                    f"in one folder would mix their metrics and overwrite each other's checkpoints, and --overwrite "
                    f"or --resume would delete or mix the running one's files: wait for it to finish or stop it, or "
                    f"choose another logging.output_dir"
                ) from None
            except OSError:
                fh.close()
                raise
            if _same_file(fh, self.path):
                break
            fh.close()  # the holder released and removed the file between our open and flock: take the new one
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}))
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        """Remove the lock file (still holding the lock, so nobody else holds this file) and release it."""
        if self._fh is not None:
            try:
                with contextlib.suppress(OSError):
                    self.path.unlink()
                fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            finally:
                self._fh.close()
                self._fh = None

    def __enter__(self) -> "RunDirLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

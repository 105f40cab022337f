"""One trainer per run directory: an exclusive ``flock`` on ``OUTPUT_DIR/.rlvr-train.lock`` held for the
run's lifetime.

Interpretation (issue 25, item 4.1): two ``rlvr train`` processes writing one ``logging.output_dir`` at
once interleave their ``metrics.jsonl`` rows and overwrite each other's checkpoints and ``final/``; an
``--overwrite`` or ``--resume`` of a run that is still training deletes or mixes its files. A lock taken
before anything in the folder is touched refuses the second process with the holder's pid and host.

Why ``flock`` and not a pid file: the kernel releases an ``flock`` when its holder dies (also on
``kill -9`` or an out-of-memory kill), so a lock file left behind by a dead run never blocks the next
one, and no pid has to be probed for liveness (pids are reused; another host's pids cannot be probed at
all). The pid and host written into the file only serve the message. The file is never deleted: deleting
a lock file while another process waits on it would let two processes hold "the" lock at once. On
network file systems ``flock`` is as reliable as the server's lock support (NFSv4: yes).

Not locked: ``rlvr eval`` into a run dir (it writes only its own ``eval_*.json`` and may run next to the
trainer, e.g. to score a checkpoint while the run goes on), ``rlvr plot`` and ``rlvr export`` (readers).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from rlvr.errors import OutputDirError

LOCK_FILE = ".rlvr-train.lock"


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
        fh = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 (kept open: the lock lives with it)
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = _holder(fh)
            fh.close()
            raise OutputDirError(
                f"logging.output_dir {self.dir} is in use: an rlvr train is running there, {who}. Two trainers in "
                f"one folder would mix their metrics and overwrite each other's checkpoints, and --overwrite or "
                f"--resume would delete or mix the running one's files: wait for it to finish or stop it, or "
                f"choose another logging.output_dir"
            ) from None
        except OSError:
            fh.close()
            raise
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}))
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        """Release the lock (the file stays; see the module docstring)."""
        if self._fh is not None:
            try:
                fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            finally:
                self._fh.close()
                self._fh = None

    def __enter__(self) -> "RunDirLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

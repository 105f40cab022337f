"""The ``local`` backend's per-run users: a small pool of uids, one claimed per run, and the
cleanup that ends everything a uid left behind (when the caller is root).

Each run claims a uid of :func:`uid_pool` with an exclusive ``fcntl.flock`` on its lock file in
:data:`LOCK_DIR` (a root-owned ``0700`` folder), so two runs — in different processes or in threads
of one — never share a uid. The program runs as that uid and gid with no other groups. That gives
the run three properties a shared user (``nobody``) cannot:

* **all of the run can be found**: every process whose real, effective or saved uid is the run's
  (a ``/proc/<pid>/status`` scan) belongs to it, whatever it did to its environment, session or
  process group (a ``setsid`` daemon started with ``execve(..., {})`` included);
* ``RLIMIT_NPROC`` (counted per user) is a cap on the run's own processes, and ``kill(-1)`` from
  the program only reaches the run's own processes;
* everything it wrote to the shared writable places (:data:`CLEAN_ROOTS`: ``/tmp``, ``/var/tmp``,
  ``/dev/shm``, ...) is found by owner and removed, with its System V IPC objects.

:func:`clean_uid` does all of that; :class:`UidLease` calls it at the end of the run, before it
releases the lock, and when it claims a uid whose last holder did not finish (a crashed run may
have left processes).

Interpretation (issue 37): cgroups would give the same "kill the whole run" without uids, but
need a delegated cgroup tree that a container or a laptop rarely has; a uid per run needs only root.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import os
import pwd
import random
import shutil
import signal
import stat
import time

from rlvr.sandbox.base import SandboxUnavailable

__all__ = ["CLEAN_ROOTS", "DEFAULT_POOL", "LOCK_DIR", "POOL_ENV", "UidLease", "clean_uid", "claim_uid",
           "kill_uid", "pool_status", "processes_of", "remove_files_of", "remove_ipc_of", "uid_pool"]

POOL_ENV = "RLVR_SANDBOX_UIDS"
"""Environment variable naming the pool as ``FIRST-LAST`` (inclusive), e.g. ``61000-61063``."""

DEFAULT_POOL = range(61000, 61064)
"""64 uids below systemd's dynamic-user range (61184-65519); uids with a ``passwd`` entry are skipped."""

LOCK_DIR = "/run/lock/rlvr-sandbox-uids" if os.path.isdir("/run/lock") else "/tmp/rlvr-sandbox-uids"
"""Folder of the per-uid lock files (created ``0700``, owned by root)."""

CLEAN_ROOTS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")
"""Shared writable places searched for a finished run's files (missing ones are skipped). Only
entries owned by the run's uid are removed, and only world-writable folders are searched below the
top (the only folders another user can create files in)."""


def uid_pool() -> list[int]:
    """The uids runs may claim: :data:`POOL_ENV` or :data:`DEFAULT_POOL`, minus uids that have a
    ``passwd`` entry (a real user's processes must never be killed as a run's leftovers).

    Raises:
        SandboxUnavailable: :data:`POOL_ENV` is not ``FIRST-LAST`` with ``1000 <= FIRST <= LAST < 65534``.
    """
    text = os.environ.get(POOL_ENV, "").strip()
    if text:
        try:
            first, last = (int(x) for x in text.split("-"))
        except ValueError:
            first = last = -1
        if not 1000 <= first <= last < 65534:
            raise SandboxUnavailable(f"{POOL_ENV} must be FIRST-LAST with 1000 <= FIRST <= LAST < 65534 (e.g. "
                                     f"61000-61063), got {text!r}")
        uids = range(first, last + 1)
    else:
        uids = DEFAULT_POOL
    return _without_users(uids.start, uids.stop)


@functools.lru_cache(maxsize=8)
def _without_users(start: int, stop: int) -> list[int]:
    return [u for u in range(start, stop) if not _has_passwd_entry(u)]  # ~70 us per passwd look-up: once


def _has_passwd_entry(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def _lock_dir() -> str:
    """:data:`LOCK_DIR`, created if missing; refused unless it is a real folder owned by root that
    nobody else may write (another user could otherwise hold or swap the lock files)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(LOCK_DIR, 0o700)
    st = os.lstat(LOCK_DIR)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
        raise SandboxUnavailable(f"sandbox backend local: {LOCK_DIR} must be a folder owned by root (it holds "
                                 "the per-run uid locks); remove it and retry")
    if st.st_mode & 0o077:
        os.chmod(LOCK_DIR, 0o700)
    return LOCK_DIR


def _try_lock(uid: int) -> int | None:
    fd = os.open(os.path.join(_lock_dir(), f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def claim_uid(wait_s: float) -> tuple[int, int]:
    """Claim a free uid of the pool: ``(uid, lock_fd)``; the lock holds until ``lock_fd`` is closed
    (by this process and by every process it was passed to).

    Tries the pool from a random start; when every uid is busy, retries until ``wait_s`` passed.
    ``flock`` locks belong to an open file, so threads of one process exclude each other too.

    Raises:
        SandboxUnavailable: the pool is empty, or every uid stayed busy for ``wait_s`` seconds.
    """
    pool = uid_pool()
    if not pool:
        raise SandboxUnavailable(f"sandbox backend local: no free uid in the pool (every uid of {POOL_ENV} or "
                                 f"{DEFAULT_POOL.start}-{DEFAULT_POOL.stop - 1} has a passwd entry)")
    deadline = time.monotonic() + wait_s
    while True:
        start = random.randrange(len(pool))
        for uid in pool[start:] + pool[:start]:
            fd = _try_lock(uid)
            if fd is not None:
                return uid, fd
        if time.monotonic() >= deadline:
            raise SandboxUnavailable(f"sandbox backend local: all {len(pool)} sandbox uids stayed busy for "
                                     f"{wait_s:g} s (more concurrent runs than {POOL_ENV} has uids)")
        time.sleep(0.01)


def processes_of(uid: int) -> list[int]:
    """Live (not zombie) processes whose real, effective, saved or file-system uid is ``uid``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{name}/status", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            text = os.read(fd, 2048)  # State and Uid are among the first lines
        except OSError:
            continue
        finally:
            os.close(fd)
        state = text.find(b"\nState:\t")
        if state >= 0 and text[state + 8:state + 9] in (b"Z", b"X"):
            continue
        at = text.find(b"\nUid:\t")
        if at >= 0 and uid in (int(x) for x in text[at + 6:text.find(b"\n", at + 6)].split()):
            out.append(int(name))
    return out


def kill_uid(uid: int, rounds: int = 200) -> bool:
    """SIGKILL every process of ``uid`` until a scan finds none; True when none is left.

    A process that forks during a scan is found by the next one; ``RLIMIT_NPROC`` caps how many
    there can be, and a killed process cannot fork, so this ends."""
    me = os.getpid()
    for _ in range(rounds):
        pids = [p for p in processes_of(uid) if p != me]
        if not pids:
            return True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)
    return not processes_of(uid)


def remove_files_of(uid: int, roots: tuple[str, ...] = CLEAN_ROOTS, depth: int = 6) -> int:
    """Remove every entry owned by ``uid`` in ``roots`` (folders with all they hold); returns how many.

    Below the top, only world-writable folders are searched: ``uid`` cannot have created anything
    in another folder it does not own. Symbolic links are removed, never followed."""
    removed = 0
    seen = set()
    for root in roots:
        real = os.path.realpath(root)
        if real in seen or not os.path.isdir(real):
            continue
        seen.add(real)
        removed += _remove_below(real, uid, depth)
    return removed


def _remove_below(folder: str, uid: int, depth: int) -> int:
    removed = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid == uid:
            with contextlib.suppress(OSError):
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed += 1
        elif stat.S_ISDIR(st.st_mode) and st.st_mode & 0o002 and depth > 0:
            removed += _remove_below(entry.path, uid, depth - 1)
    return removed


_IPC_RMID = 0
_IPC_KINDS = (("shm", "shmctl"), ("sem", "semctl"), ("msg", "msgctl"))


def remove_ipc_of(uid: int) -> int:
    """Remove the System V shared memory segments, semaphore sets and message queues owned or
    created by ``uid`` (``/proc/sysvipc``); returns how many. POSIX ones live in ``/dev/shm`` and
    ``/dev/mqueue`` (:func:`remove_files_of`)."""
    removed = 0
    libc = None
    for kind, call in _IPC_KINDS:
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                rows = f.read().splitlines()
        except OSError:
            continue
        if len(rows) < 2:
            continue
        head = rows[0].split()
        for row in rows[1:]:
            cols = dict(zip(head, row.split()))
            ids = {int(cols.get(k, -1)) for k in ("uid", "cuid")}
            if uid not in ids:
                continue
            libc = libc or ctypes.CDLL(None, use_errno=True)
            ident = int(cols["shmid" if kind == "shm" else "semid" if kind == "sem" else "msqid"])
            args = (ident, 0, _IPC_RMID) if kind == "sem" else (ident, _IPC_RMID, None)
            if getattr(libc, call)(*args) == 0:
                removed += 1
    return removed


def clean_uid(uid: int, folder: str | None = None) -> bool:
    """End everything of ``uid``: its processes, then its files (and ``folder``), then its IPC
    objects. True when no process of ``uid`` is left."""
    gone = kill_uid(uid)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
    remove_files_of(uid)
    remove_ipc_of(uid)
    return gone


class UidLease:
    """One run's claim on a pool uid, cleaned before use and after.

    The lock file records whether the last holder finished its clean-up (``clean``, written only
    when no process of the uid was left); a claim finding anything else (a run that crashed, or a
    caller killed mid-run) cleans the uid first.

    Raises:
        SandboxUnavailable: see :func:`claim_uid`.
    """

    def __init__(self, wait_s: float) -> None:
        self.uid, self.fd = claim_uid(wait_s)
        try:
            state = os.pread(self.fd, 16, 0)
            os.pwrite(self.fd, b"dirty", 0)
            if state != b"clean":
                clean_uid(self.uid)  # a crashed earlier run may have left processes or files
        except BaseException:
            self.release()
            raise

    def release(self, folder: str | None = None) -> None:
        """Clean the uid (and ``folder``), mark it clean when no process is left, then drop the lock
        (idempotent)."""
        if self.fd < 0:
            return
        try:
            if clean_uid(self.uid, folder):
                os.pwrite(self.fd, b"clean", 0)
        finally:
            os.close(self.fd)
            self.fd = -1


def pool_status() -> dict:
    """For ``rlvr doctor``: the pool, how many uids are busy now, and processes of free uids (leftovers).

    Needs root (the lock folder is root's); returns ``{"error": ...}`` otherwise."""
    try:
        pool = uid_pool()
        busy, leftovers = 0, {}
        for uid in pool:
            fd = _try_lock(uid)
            if fd is None:
                busy += 1
                continue
            try:
                pids = processes_of(uid)
                if pids:
                    leftovers[uid] = pids
            finally:
                os.close(fd)
    except (OSError, SandboxUnavailable) as exc:
        return {"error": str(exc)}
    first = DEFAULT_POOL if not os.environ.get(POOL_ENV) else os.environ[POOL_ENV]
    return {"pool": str(first if isinstance(first, str) else f"{first.start}-{first.stop - 1}"),
            "size": len(pool), "busy": busy, "leftovers": leftovers, "lock_dir": LOCK_DIR}

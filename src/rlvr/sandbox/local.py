"""The ``local`` backend: a plain subprocess with resource limits. NOT a security boundary.

What it does: the program runs in a new session with a fresh temporary directory as working
directory and ``HOME``, a minimal environment (no inherited variable, so no API key or token of the
caller), hard ``setrlimit`` limits (address space, CPU, file size, open files; processes when the
caller is root), under a small **supervisor** process (:data:`SUPERVISOR`, the one ``Popen``
starts) that forks the program and ends the whole run when the program exits or when the caller
dies (``PR_SET_PDEATHSIG``; the program itself dies with the supervisor the same way).

When the caller is root, each run gets **its own uid** from a small pool
(:mod:`rlvr.sandbox.local_uids`, claimed with ``flock``): the program runs as that uid (no groups),
and the run is "every process of that uid". At the end — and at the deadline, the output cap, the
program's exit, or the death of the caller — every process of the uid is killed (a ``setsid``
daemon with an empty environment included), then its files in ``/tmp``, ``/var/tmp``, ``/dev/shm``
and its System V IPC objects are removed, then the uid is released. ``RLIMIT_NPROC`` becomes a
per-run cap and ``kill(-1)`` only reaches the run itself.

When the caller is not root, the supervisor is a child subreaper (``PR_SET_CHILD_SUBREAPER``):
orphaned descendants (double forks, ``setsid`` daemons) are re-parented to it, and it kills every
descendant when the run ends. The process group and the run's marker variable are killed too, as
a backstop. What it cannot stop: the program runs as the caller, so it can kill the supervisor
first and then leave a daemon behind, or signal the caller.

What it does NOT do in either case: hide the file system (the program reads whatever its user may
read), or block the network (it can reach the loopback and the internet). Use ``bwrap`` for
untrusted code.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Mapping

from rlvr.sandbox.base import (
    LAUNCHER, Limits, RunResult, SandboxUnavailable, classify, decode, marked_pids, minimal_env, pump,
    python_for_sandbox,
)
from rlvr.sandbox.local_uids import UidLease, kill_uid, processes_of

PROGRAM_NAME = "main.py"

UID_WAIT_S = 30.0
"""Seconds a run waits for a free uid of the pool before it is a ``sandbox_error``."""

SUPERVISOR = r"""
import ctypes, os, resource, signal, sys
_uid, _parent, _lock = (int(x) for x in sys.argv[1].split(","))
_libc = ctypes.CDLL(None, use_errno=True)
_me = os.getpid()
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
def _run_pids():
    rows = {}
    for n in os.listdir("/proc"):
        if n.isdigit():
            try:
                with open("/proc/%s/stat" % n, "rb") as f:
                    s = f.read()
            except OSError:
                continue
            fields = s[s.rfind(b")") + 2:].split()
            if fields[0] not in (b"Z", b"X"):
                rows[int(n)] = int(fields[1])
    if _uid >= 0:
        out = []
        for pid in rows:
            try:
                with open("/proc/%d/status" % pid, "rb") as f:
                    t = f.read()
            except OSError:
                continue
            at = t.find(b"\nUid:\t")
            if at >= 0 and _uid in [int(x) for x in t[at + 6:t.find(b"\n", at + 6)].split()]:
                out.append(pid)
        return out
    kids, todo = [], [_me]
    while todo:
        p = todo.pop()
        for c, pp in rows.items():
            if pp == p and c != _me:
                kids.append(c)
                todo.append(c)
    return kids
def _reap():
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return
def _kill_all():
    for _ in range(500):
        pids = _run_pids()
        if not pids:
            break
        for p in pids:
            try:
                os.kill(p, 9)
            except OSError:
                pass
        _reap()
    _reap()
def _die(*_):
    _kill_all()
    os.kill(_me, 9)
signal.signal(signal.SIGTERM, _die)
_libc.prctl(36, 1, 0, 0, 0)
_libc.prctl(1, signal.SIGTERM, 0, 0, 0)
if os.getppid() != _parent:
    _die()
_pid = os.fork()
if _pid == 0:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if _lock >= 0:
        os.close(_lock)
    if _uid >= 0:
        os.setgroups([])
        os.setgid(_uid)
        os.setuid(_uid)
    _libc.prctl(1, 9, 0, 0, 0)
    if os.getppid() != _me:
        os._exit(137)
    sys.argv = ["-c"] + sys.argv[2:]
    exec(compile(@LAUNCHER@, "<string>", "exec"), {"__builtins__": __builtins__, "__name__": "__launcher__"})
else:
    _null = os.open(os.devnull, os.O_RDWR)
    for _fd in (0, 1, 2):
        os.dup2(_null, _fd)
    while True:
        try:
            _status = os.waitpid(_pid, 0)[1]
            break
        except ChildProcessError:
            _status = 0
            break
    if _uid < 0:
        _kill_all()
    if os.WIFSIGNALED(_status):
        _sig = os.WTERMSIG(_status)
        if _sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(_sig, signal.SIG_DFL)
        os.kill(_me, _sig)
    os._exit(os.waitstatus_to_exitcode(_status) if os.WIFEXITED(_status) else 1)
""".replace("@LAUNCHER@", repr(LAUNCHER))
"""The process ``Popen`` starts (``python -I -c SUPERVISOR UID,PARENT,LOCKFD LIMITS main.py``), as the
caller. It asks for ``SIGTERM`` when its parent thread dies (``PR_SET_PDEATHSIG``) and becomes a
child subreaper, forks the program — which drops to ``UID`` (when ``>= 0``), asks for ``SIGKILL``
when the supervisor dies and runs :data:`~rlvr.sandbox.base.LAUNCHER` in the same interpreter (no
second interpreter start) — then waits for it. When the program exits, or on ``SIGTERM``, it kills
every process of the run (``UID``'s processes; without a uid, its descendants), reaps them and exits
with the program's status (dying of the same signal when the program did); with a uid, the caller
kills the run after a normal exit, so the supervisor does so only on ``SIGTERM``. It holds the uid's lock
(``LOCKFD``) so the uid stays claimed while it cleans up after a dead caller. Interpretation:
``prctl`` from the forked child rather than ``preexec_fn``, which is unsafe in a threaded parent."""


def write_files(folder: str, program: str, files: Mapping[str, str | bytes] | None, owner: int | None) -> None:
    """Write ``program`` as :data:`PROGRAM_NAME` and ``files`` (relative names) into ``folder``.

    Raises:
        ValueError: a file name that is absolute or leaves the folder (``../x``).
    """
    items = dict(files or {})
    items[PROGRAM_NAME] = program
    for name, content in items.items():
        path = os.path.normpath(os.path.join(folder, name))
        if os.path.isabs(name) or not path.startswith(folder + os.sep):
            raise ValueError(f"sandbox file name {name!r} must be relative and stay inside the sandbox folder")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(content.encode() if isinstance(content, str) else content)
    if owner is not None:
        for root, dirs, names in os.walk(folder):
            for n in [*dirs, *names, None]:
                os.chown(os.path.join(root, n) if n else root, owner, owner)


def kill_run(proc: subprocess.Popen, token: str, uid: int | None = None, rounds: int = 5) -> None:
    """End the run: every process of ``uid`` and the supervisor's process group (when ``uid`` is
    given), else the supervisor's own clean-up (``SIGTERM``, waited for up to a second) and then, as
    a backstop, the process group and every process carrying the run's marker, until none is left."""
    if uid is not None:
        kill_uid(uid)  # the whole run but the supervisor (root, in the process group)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)
    for _ in range(rounds):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        left = [p for p in marked_pids(token) if p != os.getpid()]
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not left:
            return
        time.sleep(0.01)


def run_local(program: str, *, stdin: str | bytes = "", files=None, limits: Limits,
              python: str | None = None) -> RunResult:
    """Run ``program`` with the ``local`` backend (see the module docstring for what that means).

    Returns:
        A :class:`RunResult`; ``sandbox_error`` when the interpreter cannot start or (root) no uid
        of the pool became free within :data:`UID_WAIT_S`.

    Raises:
        SandboxUnavailable: no interpreter the program's user can run; a bad uid pool setting.
        ValueError: a bad file name in ``files``.
    """
    t0 = time.monotonic()
    drop = os.geteuid() == 0
    exe = python_for_sandbox(python, drop)
    token = secrets.token_hex(8)
    lease = None
    if drop:
        try:
            lease = UidLease(UID_WAIT_S)
        except SandboxUnavailable as exc:
            if "busy" not in str(exc):
                raise
            return RunResult("sandbox_error", None, "", "", time.monotonic() - t0, "local", str(exc))
    uid = lease.uid if lease else None
    folder = tempfile.mkdtemp(prefix="rlvr-sandbox-")
    try:
        write_files(folder, program, files, uid)
        lock_fd = lease.fd if lease else -1
        try:
            proc = subprocess.Popen(
                [exe, "-I", "-c", SUPERVISOR, f"{uid if uid is not None else -1},{os.getpid()},{lock_fd}",
                 *limits.launcher_args(nproc=drop), PROGRAM_NAME],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=folder,
                env=minimal_env(token, folder), start_new_session=True, close_fds=True,
                pass_fds=(lock_fd,) if lock_fd >= 0 else ())
        except OSError as exc:
            return RunResult("sandbox_error", None, "", "", time.monotonic() - t0, "local",
                             f"cannot start {exe}: {exc}")
        data = stdin.encode() if isinstance(stdin, str) else stdin
        end = lambda: kill_run(proc, token, uid)  # noqa: E731
        try:
            # as root the run's uid holds every process of the run, even one that left the tree
            pids = (lambda: processes_of(uid)) if uid is not None else None
            got = pump(proc, data, limits, kill=end, on_exit=end, run_pids=pids)
        finally:
            end()
            if proc.poll() is None:
                proc.wait()
        out, err = decode(got.stdout), decode(got.stderr)
        status, detail = classify(got.returncode, err, timed_out=got.timed_out, over_output=got.over_output,
                                  over_memory=got.over_memory)
        return RunResult(status, got.returncode, out, err, time.monotonic() - t0, "local", detail)
    finally:
        if lease is not None:
            lease.release(folder)
        shutil.rmtree(folder, ignore_errors=True)

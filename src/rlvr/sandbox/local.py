"""The ``local`` backend: a plain subprocess with resource limits. NOT a security boundary.

What it does: the program runs in a new session (its own process group) with a fresh temporary
directory as working directory and ``HOME``, a minimal environment (no inherited variable, so no
API key or token of the caller), hard ``setrlimit`` limits (address space, CPU, file size, open
files; processes when the caller is root), and — when the caller is root — as user ``nobody``
(:data:`~rlvr.sandbox.base.SANDBOX_UID`), so it cannot signal the trainer. At the deadline, at the
output cap and when the program exits, its process group is killed and every process still carrying
the run's marker variable is killed too (a double-forked daemon that called ``setsid``), then reaped;
the directory is removed.

What it does NOT do: hide the file system (the program reads whatever its user may read: the
caller's files when the caller is not root), block the network (it can reach the loopback and the
internet), or stop a process that clears its environment and leaves the process group. Use
``bwrap`` for untrusted code.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Mapping

from rlvr.sandbox.base import (
    LAUNCHER, SANDBOX_UID, Limits, RunResult, classify, decode, marked_pids, minimal_env, pump, python_for_sandbox,
)

PROGRAM_NAME = "main.py"


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


def kill_run(proc: subprocess.Popen, token: str, rounds: int = 5) -> None:
    """SIGKILL the run's process group and every process carrying its marker, until none is left."""
    for _ in range(rounds):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        left = [p for p in marked_pids(token) if p != os.getpid()]
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not left:
            return
        time.sleep(0.01)


def run_local(program: str, *, stdin: str | bytes = "", files=None, limits: Limits,
              python: str | None = None) -> RunResult:
    """Run ``program`` with the ``local`` backend (see the module docstring for what that means).

    Raises:
        SandboxUnavailable: no interpreter the program's user can run.
        ValueError: a bad file name in ``files``.
    """
    t0 = time.monotonic()
    drop = os.geteuid() == 0
    exe = python_for_sandbox(python, drop)
    token = secrets.token_hex(8)
    folder = tempfile.mkdtemp(prefix="rlvr-sandbox-")
    try:
        write_files(folder, program, files, SANDBOX_UID if drop else None)
        user = dict(user=SANDBOX_UID, group=SANDBOX_UID, extra_groups=[]) if drop else {}
        try:
            proc = subprocess.Popen(
                [exe, "-I", "-c", LAUNCHER, *limits.launcher_args(nproc=drop), PROGRAM_NAME],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=folder,
                env=minimal_env(token, folder), start_new_session=True, close_fds=True, **user)
        except OSError as exc:
            return RunResult("sandbox_error", None, "", "", time.monotonic() - t0, "local",
                             f"cannot start {exe}: {exc}")
        data = stdin.encode() if isinstance(stdin, str) else stdin
        try:
            got = pump(proc, data, limits, kill=lambda: kill_run(proc, token), on_exit=lambda: kill_run(proc, token))
        finally:
            kill_run(proc, token)
            if proc.poll() is None:
                proc.wait()
        out, err = decode(got.stdout), decode(got.stderr)
        status, detail = classify(got.returncode, err, timed_out=got.timed_out, over_output=got.over_output)
        return RunResult(status, got.returncode, out, err, time.monotonic() - t0, "local", detail)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

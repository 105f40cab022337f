"""What every sandbox backend shares: the result type, the limits, the in-sandbox launcher that sets
them, the pipe pump that enforces the wall-clock and output limits, and the status rules.

A run's ``status`` (see :data:`STATUSES`) is decided in this order: ``sandbox_error`` (the backend
could not start the program), ``timeout`` (wall clock, or ``RLIMIT_CPU``'s ``SIGXCPU``),
``output_limit`` (stdout or stderr past ``output_bytes``), ``memory`` (the program died of
``MemoryError`` under ``RLIMIT_AS``), ``killed`` (a signal the sandbox did not send), ``error``
(non-zero exit), ``ok``.
"""

from __future__ import annotations

import math
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

from rlvr.errors import ConfigError

STATUSES = ("ok", "error", "timeout", "memory", "output_limit", "killed", "sandbox_error")
"""Every value :attr:`RunResult.status` takes."""

MARKER_ENV = "RLVR_SANDBOX_RUN"
"""Environment variable every sandboxed process starts with (value: a per-run token). The local
backend finds the processes of a run that left its process group by it; tests count leftovers by it."""

SANDBOX_UID = 65534
"""The user (``nobody``) programs run as when the caller is root: ``RLIMIT_NPROC`` is not enforced
for root, and an unprivileged program cannot signal the trainer."""


class SandboxUnavailable(ConfigError):
    """A sandbox backend cannot run programs here (binary missing, user namespaces disabled, service
    unreachable). The message names the backend and the fix. A :class:`~rlvr.errors.ConfigError`:
    the CLI exits 2, before any model loads, when the backend was chosen explicitly."""


@dataclass(frozen=True)
class RunResult:
    """The outcome of one sandboxed program run.

    Attributes:
        status: one of :data:`STATUSES` (see the module docstring for the order of the rules).
        returncode: the program's exit status; negative for a signal (``-9`` = SIGKILL), ``None``
            when it never started (``sandbox_error``) or the http service gave none.
        stdout, stderr: decoded as UTF-8 with invalid bytes replaced (U+FFFD), each at most
            ``output_bytes`` bytes before decoding.
        wall_s: seconds from start to the end of cleanup, as measured by the caller's clock.
        backend: the backend that ran it (``bwrap``, ``local``, ``http``).
        detail: why the sandbox failed (``sandbox_error``) or which limit ended the run, else ``""``.
    """

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    backend: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        """``status == "ok"``."""
        return self.status == "ok"


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run (each set as both soft and hard ``setrlimit`` limit inside the
    sandbox, so the program cannot raise them).

    Attributes:
        timeout_s: wall-clock seconds (the parent kills the whole run at the deadline); also sets
            ``RLIMIT_CPU`` to ``ceil(timeout_s) + 1`` CPU seconds as a backstop.
        memory_mb: ``RLIMIT_AS`` in MiB (address space, so it counts reserved as well as used memory).
        output_bytes: cap on stdout and on stderr, each; the run is killed when one passes it.
        disk_mb: ``RLIMIT_FSIZE`` (largest file) in MiB; under ``bwrap`` also the size of the tmpfs.
        nproc: ``RLIMIT_NPROC``, processes and threads (under ``bwrap`` counted in the sandbox's own
            user namespace; under ``local`` per user, so only enforced when the caller is root).
        nofile: ``RLIMIT_NOFILE``, open file descriptors.

    Raises:
        ConfigError: a limit is not positive (names it).
    """

    timeout_s: float = 5.0
    memory_mb: int = 512
    output_bytes: int = 1 << 20
    disk_mb: int = 16
    nproc: int = 32
    nofile: int = 64

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "output_bytes", "disk_mb", "nproc", "nofile"):
            value = getattr(self, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not value > 0 or not math.isfinite(value):
                raise ConfigError(f"sandbox limit {name} must be a positive number, got {value!r}")

    def launcher_args(self, nproc: bool = True) -> list[str]:
        """The limits as the launcher's first argument (``AS,FSIZE,NOFILE,NPROC,CPU``; NPROC ``0`` = unset)."""
        vals = [self.memory_mb << 20, self.disk_mb << 20, self.nofile, self.nproc if nproc else 0,
                math.ceil(self.timeout_s) + 1]
        return [",".join(str(int(v)) for v in vals)]


LAUNCHER = r"""
import os, resource as r, sys
lim = [int(x) for x in sys.argv[1].split(",")]
for k, v in zip((r.RLIMIT_AS, r.RLIMIT_FSIZE, r.RLIMIT_NOFILE, r.RLIMIT_NPROC, r.RLIMIT_CPU), lim):
    if v:
        r.setrlimit(k, (v, v))
r.setrlimit(r.RLIMIT_CORE, (0, 0))
sys.argv = sys.argv[2:]
sys.path.insert(0, os.getcwd())
with open(sys.argv[0], "rb") as f:
    code = compile(f.read(), sys.argv[0], "exec")
del os, r, lim, k, v, f
exec(code, {"__name__": "__main__", "__file__": sys.argv[0], "__builtins__": __builtins__})
"""
"""Runs first inside the sandbox, in the program's interpreter (``python -I -c LAUNCHER LIMITS
prog.py``): sets the limits as hard limits, then runs the program as ``__main__`` (one interpreter
start instead of two; ``exec`` of the compiled file rather than ``runpy``, whose imports cost ~25 ms
a run). Interpretation: a launcher instead of ``preexec_fn`` because under ``bwrap`` the limits
must be set inside the sandbox's user namespace (``RLIMIT_NPROC`` is then counted per sandbox), and
``preexec_fn`` is unsafe in a threaded parent."""


def minimal_env(token: str, home: str) -> dict[str, str]:
    """The whole environment a sandboxed program gets: nothing inherited from the caller."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home,
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8", MARKER_ENV: token}


def decode(data: bytes) -> str:
    """UTF-8 with invalid bytes replaced (a program may print anything)."""
    return data.decode("utf-8", errors="replace")


@dataclass
class Pumped:
    """What :func:`pump` saw: the bytes read (capped), whether the deadline or the cap ended the run."""

    stdout: bytes
    stderr: bytes
    timed_out: bool
    over_output: bool
    returncode: int | None


def _feed(pipe, data: bytes) -> None:
    try:
        if data:
            pipe.write(data)
    except (BrokenPipeError, OSError, ValueError):
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def pump(proc: subprocess.Popen, stdin: bytes, limits: Limits, kill: Callable[[], None],
         on_exit: Callable[[], None] = lambda: None) -> Pumped:
    """Feed ``stdin``, read stdout/stderr until both close, enforcing the deadline and the cap.

    Args:
        proc: started with ``stdin``, ``stdout`` and ``stderr`` pipes.
        stdin: bytes written by a helper thread (so a program that does not read cannot block us).
        limits: ``timeout_s`` from now, and ``output_bytes`` per stream.
        kill: ends the whole run (every process of it); called at the deadline or the cap.
        on_exit: called once the main process has exited while a pipe is still open (a child that
            kept it); the local backend kills the rest of the run there.

    Returns:
        :class:`Pumped`; ``proc`` has been waited for.
    """
    deadline = time.monotonic() + limits.timeout_s
    writer = threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True)
    writer.start()
    bufs = {"stdout": bytearray(), "stderr": bytearray()}
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    timed_out = over = exited = False
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                kill()
                break
            for key, _ in sel.select(timeout=min(0.05, deadline - now)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = bufs[key.data]
                room = limits.output_bytes - len(buf)
                buf += chunk[: max(room, 0)]
                if len(chunk) > room:
                    over = True
            if over:
                kill()
                break
            if not exited and proc.poll() is not None:
                exited = True
                on_exit()
                deadline = min(deadline, time.monotonic() + 0.5)  # drain what is left, briefly
    finally:
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
    try:
        rc = proc.wait(timeout=max(0.0, deadline - time.monotonic()) + 5.0)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill()
        rc = proc.wait()
    writer.join(timeout=1.0)
    return Pumped(bytes(bufs["stdout"]), bytes(bufs["stderr"]), timed_out, over, rc)


def classify(returncode: int | None, stderr: str, *, timed_out: bool, over_output: bool) -> tuple[str, str]:
    """``(status, detail)`` of a finished run (rules in the module docstring).

    Args:
        returncode: negative for a signal (as :mod:`subprocess` reports it).
        stderr: the decoded stderr (its last line tells ``MemoryError``).
    """
    if timed_out or returncode == -signal.SIGXCPU:
        return "timeout", "wall-clock deadline" if timed_out else "CPU time limit (SIGXCPU)"
    if over_output:
        return "output_limit", "stdout or stderr passed output_bytes"
    last = stderr.rstrip().rsplit("\n", 1)[-1] if stderr.strip() else ""
    if returncode and last.startswith("MemoryError"):
        return "memory", "MemoryError under RLIMIT_AS"
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        return "killed", f"killed by {name}"
    if returncode:
        return "error", f"exit status {returncode}"
    return "ok", ""


def marked_pids(token: str) -> list[int]:
    """Pids of live processes whose environment holds ``MARKER_ENV=token`` (a ``/proc`` scan; a
    process of another user whose environment cannot be read is skipped)."""
    needle = f"{MARKER_ENV}={token}".encode() + b"\0"
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env or env.endswith(needle[:-1]):
            out.append(int(name))
    return out


def python_for_sandbox(explicit: str | None, drop_root: bool) -> str:
    """The interpreter sandboxed programs run with.

    Args:
        explicit: a path the caller chose (returned as is).
        drop_root: programs will run as :data:`SANDBOX_UID`, so the interpreter must be readable by
            every user: the caller's own interpreter often is not (a pyenv under ``/root``), then the
            system's ``/usr/bin/python3`` is used.

    Raises:
        SandboxUnavailable: no usable interpreter.
    """
    if explicit:
        return explicit
    own = os.path.realpath(sys.executable)
    if not drop_root or _world_readable(own) and _world_readable(sys.base_prefix):
        return own
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(cand) and _world_readable(os.path.realpath(cand)):
            return cand
    raise SandboxUnavailable(
        f"sandbox: no Python interpreter that user {SANDBOX_UID} can read ({own} is inside a private "
        "folder); install python3 under /usr (apt-get install python3) or pass python=PATH")


def _world_readable(path: str) -> bool:
    """Every folder above ``path`` is searchable by others and ``path`` is readable by others."""
    try:
        parts = os.path.realpath(path).split(os.sep)
        for i in range(2, len(parts)):
            if not os.stat(os.sep.join(parts[:i])).st_mode & 0o001:
                return False
        return bool(os.stat(path).st_mode & 0o004)
    except OSError:
        return False

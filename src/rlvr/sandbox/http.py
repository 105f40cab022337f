"""The ``http`` backend: a client of a SandboxFusion-compatible ``POST /run_code`` service.

Request body (JSON): ``code``, ``language: "python"``, ``stdin``, ``run_timeout`` (s),
``memory_limit_MB``, ``files`` (name → base64). The answer's ``status`` is ``Success``, ``Failed``
or ``SandboxError``; its ``run_result`` has ``status`` (``Finished``, ``TimeLimitExceeded``,
``Error``), ``return_code``, ``stdout``, ``stderr``, ``execution_time``. Source: SandboxFusion's
documented ``POST /run_code`` API (bytedance/SandboxFusion), the service verl's ``sandbox_fusion``
reward calls.

What it protects against is whatever the service does; the client only adds a request timeout
(``timeout_s`` + 10 s for the network and the service's own start-up) and the output cap.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request

from rlvr.sandbox.base import Limits, RunResult, SandboxUnavailable

_REQUEST_SLACK_S = 10.0
"""Seconds the request may take beyond ``timeout_s`` (network, the service's own start-up)."""

ENV_URL = "RLVR_SANDBOX_URL"
"""Environment variable read for the service's base URL when no ``url`` is given."""


def _cap(text: str, limit: int) -> tuple[str, bool]:
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return text, False
    return data[:limit].decode("utf-8", errors="replace"), True


def endpoint(url: str | None) -> str:
    """``<base>/run_code`` from ``url`` or :data:`ENV_URL`.

    Raises:
        SandboxUnavailable: neither is set, or the URL is not http(s).
    """
    import os

    base = url or os.environ.get(ENV_URL, "")
    if not base:
        raise SandboxUnavailable(f"sandbox backend http needs the service's URL: pass url=... (task.config.url) "
                                 f"or set {ENV_URL}=http://host:8080")
    if not base.startswith(("http://", "https://")):
        raise SandboxUnavailable(f"sandbox backend http: URL {base!r} must start with http:// or https://")
    return base.rstrip("/") if base.rstrip("/").endswith("/run_code") else base.rstrip("/") + "/run_code"


def run_http(program: str, *, stdin: str | bytes = "", files=None, limits: Limits, url: str | None = None) -> RunResult:
    """Run ``program`` on the service.

    Returns:
        A :class:`RunResult`: ``sandbox_error`` when the service is unreachable, answers with a
        non-2xx status or non-JSON, or reports ``SandboxError``; ``timeout`` for
        ``TimeLimitExceeded``; ``error`` / ``ok`` by the return code otherwise.

    Raises:
        SandboxUnavailable: no URL configured.
    """
    t0 = time.monotonic()
    target = endpoint(url)
    body = {
        "code": program, "language": "python",
        "stdin": stdin.decode("utf-8", errors="replace") if isinstance(stdin, bytes) else stdin,
        "run_timeout": limits.timeout_s, "memory_limit_MB": limits.memory_mb,
        "files": {k: base64.b64encode(v.encode() if isinstance(v, str) else v).decode()
                  for k, v in (files or {}).items()},
    }
    req = urllib.request.Request(target, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})

    def failed(detail: str) -> RunResult:
        return RunResult("sandbox_error", None, "", "", time.monotonic() - t0, "http", detail)

    try:
        with urllib.request.urlopen(req, timeout=limits.timeout_s + _REQUEST_SLACK_S) as resp:
            answer = json.loads(resp.read(4 * limits.output_bytes + (1 << 20)))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return failed(f"{target}: {type(exc).__name__}: {exc}")
    if not isinstance(answer, dict):
        return failed(f"{target}: the answer is not a JSON object")
    run = answer.get("run_result") or {}
    if answer.get("status") == "SandboxError" or not isinstance(run, dict) or not run:
        return failed(f"{target}: {answer.get('message') or 'no run_result in the answer'}")
    out, over_out = _cap(str(run.get("stdout") or ""), limits.output_bytes)
    err, over_err = _cap(str(run.get("stderr") or ""), limits.output_bytes)
    rc = run.get("return_code")
    rc = int(rc) if isinstance(rc, (int, float)) else None
    if run.get("status") == "TimeLimitExceeded":
        status, detail = "timeout", "the service's run_timeout"
    elif over_out or over_err:
        status, detail = "output_limit", "stdout or stderr passed output_bytes"
    elif err.rstrip().rsplit("\n", 1)[-1].startswith("MemoryError"):
        status, detail = "memory", "MemoryError"
    elif rc == 0 and run.get("status") == "Finished":
        status, detail = "ok", ""
    else:
        status, detail = "error", f"exit status {rc}" if rc is not None else str(run.get("status"))
    return RunResult(status, rc, out, err, time.monotonic() - t0, "http", detail)

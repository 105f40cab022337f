"""The ``http`` backend: a client of a SandboxFusion-compatible ``POST /run_code`` service.

Request body (JSON): ``code``, ``language: "python"``, ``stdin``, ``run_timeout`` (s),
``memory_limit_MB``, ``files`` (name → base64). The answer's ``status`` is ``Success``, ``Failed``
or ``SandboxError``; its ``run_result`` has ``status`` (``Finished``, ``TimeLimitExceeded``,
``Error``), ``return_code``, ``stdout``, ``stderr``, ``execution_time``. Source: SandboxFusion's
documented ``POST /run_code`` API (bytedance/SandboxFusion), the service verl's ``sandbox_fusion``
reward calls.

What it protects against is whatever the service does. The client's own guarantees (issue 37):

* **One total deadline**, ``timeout_s`` + :data:`_REQUEST_SLACK_S`, for the whole request (connect,
  send, status line, headers, body). The request runs in a helper thread that the caller waits for
  until the deadline; then the socket is shut down (which ends the helper's blocked read at once)
  and the run is a ``sandbox_error``. Interpretation: a socket timeout alone is per operation, so a
  service dripping one byte per second held a 1 s run for 40 s through urllib.
* **It never raises** for anything the service or the network does: every failure of the HTTP
  machinery (refused, reset, a malformed status line, too many or too long headers, a non-2xx
  status, a redirect: never followed), of decoding (not UTF-8, not JSON, nested too deep) and every
  answer of the wrong shape (``run_result`` not an object, ``stdout`` not a string, ``return_code``
  not an int, a bool, or past ±2**31) is a ``sandbox_error`` whose ``detail`` names it.
* The answer is read in chunks up to :func:`answer_cap` bytes; a longer one is a ``sandbox_error``
  (not read further). stdout and stderr are cut to ``output_bytes`` (``output_limit``).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import math
import os
import socket
import threading
import time
import urllib.parse
from typing import Any

from rlvr.sandbox.base import Limits, RunResult, SandboxUnavailable

_REQUEST_SLACK_S = 10.0
"""Seconds the whole request may take beyond ``timeout_s`` (network, the service's own start-up)."""

_CHUNK = 1 << 16
"""Bytes read from the answer's body at a time."""

_MAX_RETURN_CODE = 1 << 31
"""A ``return_code`` whose magnitude passes this is not an exit status (a shell's is 0..255, a
signal's -1..-64)."""

ENV_URL = "RLVR_SANDBOX_URL"
"""Environment variable read for the service's base URL when no ``url`` is given."""


def answer_cap(limits: Limits) -> int:
    """Largest answer body read, in bytes: ``4 × output_bytes + 1 MiB`` (stdout and stderr at their
    cap, JSON-escaped, plus room for the rest of the answer)."""
    return 4 * limits.output_bytes + (1 << 20)


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
    base = url or os.environ.get(ENV_URL, "")
    if not base:
        raise SandboxUnavailable(f"sandbox backend http needs the service's URL: pass url=... (task.config.url) "
                                 f"or set {ENV_URL}=http://host:8080")
    if not base.startswith(("http://", "https://")):
        raise SandboxUnavailable(f"sandbox backend http: URL {base!r} must start with http:// or https://")
    return base.rstrip("/") if base.rstrip("/").endswith("/run_code") else base.rstrip("/") + "/run_code"


class _BadAnswer(Exception):
    """The service's answer cannot be used (the message says why)."""


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the request's deadline passed")
    return left


def _post(target: str, data: bytes, deadline: float, cap: int, conns: list) -> bytes:
    """POST ``data`` to ``target``; the 2xx answer's body (at most ``cap`` bytes).

    Every socket operation gets the time left to ``deadline`` as its timeout (the caller also stops
    waiting at the deadline and shuts the socket down). Raises anything on failure; the caller
    turns it into a ``sandbox_error``.
    """
    parts = urllib.parse.urlsplit(target)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname or "", parts.port, timeout=_remaining(deadline))
    conns.append(conn)
    try:
        conn.request("POST", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), body=data,
                     headers={"Content-Type": "application/json", "Accept": "application/json"})
        sock = conn.sock  # kept: getresponse() drops conn.sock when the service closes after its answer
        conns.append(sock)
        sock.settimeout(_remaining(deadline))
        resp = conn.getresponse()
        if not 200 <= resp.status < 300:
            where = f" to {resp.getheader('Location', '?')!r}" if 300 <= resp.status < 400 else ""
            extra = " (redirects are not followed)" if where else ""
            raise _BadAnswer(f"answered HTTP {resp.status} {resp.reason}{where}{extra}")
        body = bytearray()
        while True:
            sock.settimeout(_remaining(deadline))
            chunk = resp.read1(min(_CHUNK, cap + 1 - len(body)))
            if not chunk:
                if resp.length:  # read1 gives b"" at a premature end instead of raising
                    raise http.client.IncompleteRead(bytes(body[-64:]), resp.length)
                return bytes(body)
            body += chunk
            if len(body) > cap:
                raise _BadAnswer(f"the answer passed {cap} bytes (4 x output_bytes + 1 MiB); "
                                 "not read further")
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def _abort(conns: list) -> None:
    """Shut down the socket of a request still in flight: its blocked read returns at once."""
    for item in list(conns):
        sock = item if isinstance(item, socket.socket) else getattr(item, "sock", None)
        if sock is not None:
            with contextlib.suppress(Exception):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's, also under TLS


def _text(run: dict, key: str) -> str:
    value = run.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _BadAnswer(f"run_result.{key} is a {type(value).__name__}, not a string")
    return value


def _return_code(run: dict) -> int | None:
    rc = run.get("return_code")
    if rc is None:
        return None
    if isinstance(rc, bool) or not isinstance(rc, int):
        shown = rc if isinstance(rc, float) and not math.isfinite(rc) else type(rc).__name__
        raise _BadAnswer(f"run_result.return_code is {shown!r}, not an integer exit status")
    if abs(rc) > _MAX_RETURN_CODE:
        raise _BadAnswer(f"run_result.return_code {str(rc)[:40]} is not an exit status (|code| <= 2**31)")
    return rc


def _judge(answer: Any, limits: Limits) -> tuple[str, int | None, str, str, str]:
    """``(status, returncode, stdout, stderr, detail)`` of a decoded answer.

    Raises:
        _BadAnswer: the answer is not of the documented shape, or the service said ``SandboxError``.
    """
    if not isinstance(answer, dict):
        raise _BadAnswer(f"the answer is a JSON {type(answer).__name__}, not an object")
    if answer.get("status") == "SandboxError":
        message = answer.get("message")
        raise _BadAnswer(f"SandboxError: {message[:500] if isinstance(message, str) else 'no message'}")
    run = answer.get("run_result")
    if not isinstance(run, dict) or not run:
        shown = type(run).__name__ if run is not None else "missing"
        raise _BadAnswer(f"run_result is {shown}, not a non-empty object")
    run_status = run.get("status")
    if run_status is not None and not isinstance(run_status, str):
        raise _BadAnswer(f"run_result.status is a {type(run_status).__name__}, not a string")
    out, over_out = _cap(_text(run, "stdout"), limits.output_bytes)
    err, over_err = _cap(_text(run, "stderr"), limits.output_bytes)
    rc = _return_code(run)
    if run_status == "TimeLimitExceeded":
        return "timeout", rc, out, err, "the service's run_timeout"
    if over_out or over_err:
        return "output_limit", rc, out, err, "stdout or stderr passed output_bytes"
    if err.rstrip().rsplit("\n", 1)[-1].startswith("MemoryError"):
        return "memory", rc, out, err, "MemoryError"
    if rc == 0 and run_status == "Finished":
        return "ok", rc, out, err, ""
    detail = f"exit status {rc}" if rc is not None else f"run_result.status {run_status!r}"
    return "error", rc, out, err, detail


def run_http(program: str, *, stdin: str | bytes = "", files=None, limits: Limits,
             url: str | None = None) -> RunResult:
    """Run ``program`` on the service.

    Returns:
        A :class:`RunResult` within ``limits.timeout_s + _REQUEST_SLACK_S`` seconds (plus thread
        start-up): ``sandbox_error`` for every failure of the service, the network or the answer
        (see the module docstring; ``detail`` names it); ``timeout`` for ``TimeLimitExceeded``;
        ``output_limit``, ``memory``, ``ok`` or ``error`` (by the integer return code) otherwise.

    Raises:
        SandboxUnavailable: no URL configured (a configuration error, before any request).
    """
    t0 = time.monotonic()
    target = endpoint(url)

    def failed(detail: str) -> RunResult:
        return RunResult("sandbox_error", None, "", "", time.monotonic() - t0, "http", f"{target}: {detail}")

    try:
        body = {
            "code": program, "language": "python",
            "stdin": stdin.decode("utf-8", errors="replace") if isinstance(stdin, bytes) else stdin,
            "run_timeout": limits.timeout_s, "memory_limit_MB": limits.memory_mb,
            "files": {k: base64.b64encode(v.encode() if isinstance(v, str) else v).decode()
                      for k, v in (files or {}).items()},
        }
        data = json.dumps(body).encode()
    except Exception as exc:  # noqa: BLE001 - e.g. a file that is neither str nor bytes
        return failed(f"cannot encode the request ({type(exc).__name__}: {exc})")
    budget = limits.timeout_s + _REQUEST_SLACK_S
    deadline = t0 + budget
    conns: list = []
    box: dict[str, Any] = {}

    def request() -> None:
        try:
            box["body"] = _post(target, data, deadline, answer_cap(limits), conns)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller, never raised in the thread
            box["exc"] = exc

    worker = threading.Thread(target=request, name="rlvr-sandbox-http", daemon=True)
    worker.start()
    worker.join(max(0.0, deadline - time.monotonic()))
    late = f"timed out: no complete answer within {budget:g} s (timeout_s + {_REQUEST_SLACK_S:g} s)"
    if worker.is_alive():
        _abort(conns)
        return failed(f"{late}; request abandoned")
    exc = box.get("exc")
    if isinstance(exc, _BadAnswer):
        return failed(str(exc))
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return failed(late)
    if exc is not None:
        return failed(f"{type(exc).__name__}: {str(exc)[:300]}")
    try:
        answer = json.loads(box["body"])
    except RecursionError:
        return failed("the answer's JSON is nested too deep to decode")
    except (ValueError, TypeError) as exc:
        return failed(f"the answer is not JSON ({type(exc).__name__}: {str(exc)[:200]})")
    try:
        status, rc, out, err, detail = _judge(answer, limits)
    except _BadAnswer as exc:
        return failed(str(exc))
    except Exception as exc:  # noqa: BLE001 - an answer shaped so that reading it fails
        return failed(f"cannot read the answer ({type(exc).__name__}: {str(exc)[:200]})")
    return RunResult(status, rc, out, err, time.monotonic() - t0, "http", detail)

"""The http backend never raises and never passes its deadline (issue 37 item 1): each fault a
SandboxFusion-compatible service (or what answers in its place) can produce, from a real server on
the loopback, is a ``sandbox_error`` naming it, within ``timeout_s + _REQUEST_SLACK_S``."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest
from loopback_http import LoopbackServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlvr.sandbox.http as h
from rlvr.sandbox import run
from rlvr.sandbox.base import STATUSES

TIMEOUT_S = 0.5
SLACK_S = 0.2
MARGIN_S = 0.6
"""Allowed beyond the deadline on a loaded 2-core machine (thread start-up, the scheduler)."""


@pytest.fixture(autouse=True)
def small_slack(monkeypatch):
    monkeypatch.setattr(h, "_REQUEST_SLACK_S", SLACK_S)


def _ok(**run_result) -> dict:
    return {"status": "Success", "run_result": {"status": "Finished", "return_code": 0, "stdout": "hi",
                                                "stderr": "", **run_result}}


class _Canned(BaseHTTPRequestHandler):
    """Answers every POST with ``reply = (status, headers, body bytes)``; counts requests."""

    reply: tuple[int, dict, bytes] = (200, {}, b"{}")
    hits: list[str] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).hits.append(self.path)
        status, headers, body = type(self).reply
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", "Content-Length": str(len(body)), **headers}.items():
            self.send_header(k, v)
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:  # the client stopped reading (the cap): expected
            pass

    def log_message(self, *args):
        pass


def _serve(handler):
    srv = LoopbackServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


@pytest.fixture
def canned():
    handler = type("Handler", (_Canned,), {"hits": []})
    srv, url = _serve(handler)

    def answer(body, status: int = 200, headers: dict | None = None) -> str:
        handler.reply = (status, headers or {}, body if isinstance(body, bytes) else json.dumps(body).encode())
        return url

    answer.handler = handler
    yield answer
    srv.shutdown()
    srv.server_close()


def _run(url: str, **kw):
    t0 = time.monotonic()
    res = run("print('hi')", backend="http", url=url, timeout_s=TIMEOUT_S, **kw)
    elapsed = time.monotonic() - t0
    assert elapsed <= TIMEOUT_S + SLACK_S + MARGIN_S, f"{elapsed:.2f} s past the deadline: {res}"
    return res


def test_a_well_formed_answer_is_still_read(canned):
    res = _run(canned(_ok()))
    assert (res.status, res.returncode, res.stdout) == ("ok", 0, "hi")
    assert _run(canned(_ok(return_code=3))).status == "error"
    assert _run(canned(_ok(return_code=None, status="TimeLimitExceeded"))).status == "timeout"


@pytest.mark.parametrize("raw, named", [
    (b'{"status": "Success", "run_result": {"status": "Finished", "return_code": NaN, "stdout": ""}}', "nan"),
    (b'{"status": "Success", "run_result": {"status": "Finished", "return_code": Infinity}}', "inf"),
    (b'{"status": "Success", "run_result": {"status": "Finished", "return_code": -Infinity}}', "inf"),
    (b'{"status": "Success", "run_result": {"status": "Finished", "return_code": 1e400}}', "inf"),
    (json.dumps(_ok(return_code=True)).encode(), "bool"),
    (json.dumps(_ok(return_code=0.0)).encode(), "float"),
    (json.dumps(_ok(return_code="0")).encode(), "str"),
    (json.dumps(_ok(return_code=10 ** 30)).encode(), "not an exit status"),
    (json.dumps(_ok(stdout=5)).encode(), "stdout is a int"),
    (json.dumps(_ok(stderr=["x"])).encode(), "stderr is a list"),
    (json.dumps(_ok(status=3)).encode(), "run_result.status is a int"),
    (json.dumps({"status": "Success", "run_result": [1]}).encode(), "run_result is list"),
    (json.dumps({"status": "Success"}).encode(), "run_result is missing"),
    (json.dumps([1, 2]).encode(), "json list"),
    (b"[" * 200_000 + b"]" * 200_000, "nested too deep"),
    (b"<html>502 Bad Gateway</html>", "not json"),
    (b"\xff\xfe\x00garbage", "not json"),
    (b"", "not json"),
])
def test_malformed_answers_are_sandbox_errors_naming_the_fault(canned, raw, named):
    res = _run(canned(raw))
    assert res.status == "sandbox_error" and res.returncode is None, res
    assert named in res.detail.lower(), res.detail


def test_sandbox_error_is_never_the_programs_error(canned):
    """The service said SandboxError: not a program error even with a non-zero return_code beside it."""
    said = {"status": "SandboxError", "message": "executor crashed",
            "run_result": {"status": "Finished", "return_code": 1, "stdout": "", "stderr": "Traceback"}}
    res = _run(canned(said))
    assert res.status == "sandbox_error" and "executor crashed" in res.detail
    res = _run(canned({"status": "SandboxError", "message": {"not": "text"}}))
    assert res.status == "sandbox_error" and "SandboxError" in res.detail


def test_non_2xx_and_redirects_are_sandbox_errors_and_not_followed(canned):
    res = _run(canned(b"oops", status=500))
    assert res.status == "sandbox_error" and "HTTP 500" in res.detail
    other = type("Other", (_Canned,), {"hits": [], "reply": (200, {}, json.dumps(_ok()).encode())})
    srv, other_url = _serve(other)
    try:
        for code in (301, 302, 307, 308):
            res = _run(canned(b"", status=code, headers={"Location": other_url + "/run_code"}))
            assert res.status == "sandbox_error" and f"HTTP {code}" in res.detail and "not followed" in res.detail
        assert other.hits == []  # the other host was never asked
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_huge_answer_is_cut_at_the_cap(canned):
    """4 x output_bytes + 1 MiB is read, then the run is a sandbox_error (documented in docs/code_rewards.md)."""
    big = json.dumps(_ok(stdout="x" * (3 << 20))).encode()
    res = _run(canned(big), output_bytes=1024)
    assert res.status == "sandbox_error" and f"passed {4 * 1024 + (1 << 20)} bytes" in res.detail
    # within the cap, stdout past output_bytes is the program's output_limit
    res = _run(canned(_ok(stdout="y" * 5000)), output_bytes=1024)
    assert res.status == "output_limit" and len(res.stdout) == 1024


class _Raw:
    """A TCP server on the loopback that reads one request, then plays ``script(conn)`` (raw bytes)."""

    def __init__(self, script):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.script = script
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, rest = data.partition(b"\r\n\r\n")
            length = int([ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0])
            while len(rest) < length:
                rest += conn.recv(65536)
            self.script(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.sock.close()


def _drip(data: bytes, every_s: float):
    def script(conn):
        for b in data:
            conn.sendall(bytes([b]))
            time.sleep(every_s)
    return script


GOOD = json.dumps(_ok()).encode()
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(GOOD)


@pytest.mark.parametrize("script, named", [
    (lambda c: c.sendall(b"HTTP/1.1 abc nope\r\n\r\n"), "badstatusline"),
    (lambda c: c.sendall(b"garbage garbage\r\n\r\n"), "badstatusline"),
    (lambda c: c.sendall(b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 200 + b"\r\n"), "more than 100 headers"),
    (lambda c: c.sendall(b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n"), "linetoolong"),
    (lambda c: c.sendall(b"HTTP/1.1 " + b"2" * 70_000 + b"\r\n\r\n"), "linetoolong"),
    (lambda c: None, "remotedisconnected"),
    (lambda c: c.sendall(HEAD.replace(b"%d" % len(GOOD), b"999") + GOOD), "incompleteread"),
    (lambda c: c.sendall(HEAD + GOOD[:10]), "incompleteread"),
])
def test_http_protocol_faults_are_sandbox_errors(script, named):
    srv = _Raw(script)
    try:
        res = _run(srv.url)
    finally:
        srv.close()
    assert res.status == "sandbox_error", res
    assert named in res.detail.lower().replace(" ", "") or named in res.detail.lower(), res.detail


@pytest.mark.parametrize("where", ["status line", "headers", "body"])
def test_a_dripping_server_cannot_hold_the_run_past_its_deadline(where):
    """One byte every 0.1 s keeps every socket read under any per-read timeout; the total deadline
    (timeout_s + slack = 0.7 s) still ends the run (urllib held a 1 s run for 40 s this way)."""
    if where == "status line":
        script = _drip(HEAD + GOOD, 0.1)
    elif where == "headers":
        script = lambda c: (c.sendall(b"HTTP/1.1 200 OK\r\n"), _drip(HEAD[17:] + GOOD, 0.1)(c))  # noqa: E731
    else:
        script = lambda c: (c.sendall(HEAD), _drip(GOOD, 0.1)(c))  # noqa: E731
    srv = _Raw(script)
    try:
        t0 = time.monotonic()
        res = _run(srv.url)
    finally:
        srv.close()
    assert res.status == "sandbox_error" and "timed out" in res.detail
    assert time.monotonic() - t0 >= TIMEOUT_S + SLACK_S - 0.05  # it waited for the deadline, no less


def test_a_silent_server_times_out_at_the_deadline():
    srv = _Raw(lambda c: time.sleep(5))
    try:
        res = _run(srv.url)
    finally:
        srv.close()
    assert res.status == "sandbox_error" and "timed out" in res.detail


def test_unreachable_and_unencodable_requests_are_sandbox_errors():
    free = socket.create_server(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    res = _run(f"http://127.0.0.1:{port}")
    assert res.status == "sandbox_error" and "ConnectionRefusedError" in res.detail
    res = _run("http://127.0.0.1:notaport")
    assert res.status == "sandbox_error" and "port" in res.detail.lower()
    res = run("x", backend="http", url="http://127.0.0.1:9", files={"a": 3})  # neither str nor bytes
    assert res.status == "sandbox_error" and "cannot encode" in res.detail


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=12)
_run_result = st.fixed_dictionaries({}, optional={
    "status": st.sampled_from(["Finished", "TimeLimitExceeded", "Error"]) | _json,
    "return_code": st.integers(-300, 300) | _json, "stdout": st.text(max_size=20) | _json,
    "stderr": st.text(max_size=20) | _json})
_answers = _json | st.fixed_dictionaries({}, optional={
    "status": st.sampled_from(["Success", "Failed", "SandboxError"]) | _json, "message": _json,
    "run_result": _run_result | _json})


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=_answers)
def test_any_json_answer_gives_a_result_never_an_exception(canned, answer):
    res = run("x", backend="http", url=canned(json.dumps(answer, allow_nan=True).encode()), timeout_s=TIMEOUT_S)
    assert res.status in STATUSES and res.backend == "http"
    if res.status != "sandbox_error":  # a program status only from an int (not bool) return code, or none
        assert res.returncode is None or type(res.returncode) is int
        assert isinstance(res.stdout, str) and isinstance(res.stderr, str)
    if res.status in ("ok", "error"):
        rr = answer["run_result"]
        assert answer.get("status") != "SandboxError" and isinstance(rr, dict)

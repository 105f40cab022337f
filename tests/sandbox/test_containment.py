"""Containment: hostile programs against the ``bwrap`` and ``local`` backends (issue 27, item 2).

Each program really tries. After each: the right status, the test process and a stand-in "trainer"
process unharmed, nothing written outside the sandbox, and no process of the sandbox left (counted
by the marker variable every sandboxed process starts with, with a ``/proc`` scan). ``local`` is not
a security boundary: its tests assert what it does guarantee (limits, kill and reap, environment).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from rlvr.sandbox import MARKER_ENV, run
from rlvr.sandbox.bwrap import probe

BWRAP_REASON = probe()
BACKENDS = [pytest.param("bwrap", marks=pytest.mark.skipif(bool(BWRAP_REASON), reason=f"bwrap: {BWRAP_REASON}")),
            "local"]
ROOT = os.geteuid() == 0


def sandbox_pids() -> list[int]:
    """Live processes whose environment carries the sandbox marker (any run)."""
    needle = f"{MARKER_ENV}=".encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    if needle in f.read():
                        found.append(int(name))
            except OSError:
                pass
    return found


def leftover_dirs() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("rlvr-sandbox-")}


@pytest.fixture
def guard():
    """A stand-in trainer process, the temp-dir listing and the process count, checked after the test."""
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    before_dirs = leftover_dirs()
    assert sandbox_pids() == []
    yield
    try:
        assert trainer.poll() is None, "the stand-in trainer process was harmed"
        deadline = time.monotonic() + 2.0
        while sandbox_pids() and time.monotonic() < deadline:  # a SIGKILLed pid namespace is torn down async
            time.sleep(0.02)
        assert sandbox_pids() == [], "a sandbox process outlived its run"
        assert leftover_dirs() <= before_dirs, "the local backend left its temporary folder behind"
        assert run("print(6 * 7)", backend="local", timeout_s=5).stdout == "42\n"  # still works
    finally:
        trainer.kill()
        trainer.wait()


def go(backend: str, program: str, **kw):
    kw.setdefault("timeout_s", 1.0)
    return run(program, backend=backend, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fork_bomb_is_capped_and_cleaned_up(backend, guard):
    if backend == "local" and not ROOT:
        pytest.skip("local enforces RLIMIT_NPROC only when the caller is root (it then runs programs as nobody)")
    prog = ("import os\nn = 0\nwhile True:\n    try:\n        os.fork(); n += 1\n    except OSError:\n        pass\n")
    t0 = time.monotonic()
    res = go(backend, prog, nproc=16)
    assert res.status == "timeout", res
    assert time.monotonic() - t0 < 4.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_infinite_loop_times_out(backend, guard):
    res = go(backend, "while True:\n    pass\n", timeout_s=0.5)
    assert res.status == "timeout" and res.returncode == -signal.SIGKILL
    assert 0.5 <= res.wall_s < 2.5


@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_hog_hits_the_memory_limit(backend, guard):
    res = go(backend, "x = []\nwhile True:\n    x.append(bytearray(10 ** 7))\n", memory_mb=128, timeout_s=5)
    assert res.status == "memory", res
    assert res.stderr.rstrip().endswith("MemoryError")


@pytest.mark.parametrize("backend", BACKENDS)
def test_disk_filler_stops_at_the_file_size_limit(backend, guard):
    prog = ("import os\nprint(os.getcwd(), flush=True)\nn = 0\ntry:\n    with open('big', 'wb') as f:\n"
            "        while True:\n            f.write(b'0' * 2 ** 20); n += 1\nfinally:\n    print(n, flush=True)\n")
    res = go(backend, prog, disk_mb=4, timeout_s=5)
    assert res.status == "error", res
    assert "File too large" in res.stderr or "No space left" in res.stderr
    cwd, written = res.stdout.split()
    assert int(written) <= 4  # stopped at disk_mb
    if backend == "local":
        assert not os.path.exists(cwd)  # its folder (and the file) are gone
    else:
        assert cwd == "/tmp"  # the sandbox's own tmpfs, not the host's folder


@pytest.mark.parametrize("backend", BACKENDS)
def test_100_mb_of_output_is_cut_at_the_cap(backend, guard):
    t0 = time.monotonic()
    res = go(backend, "import sys\nsys.stdout.write('x' * 100_000_000)\n", output_bytes=1 << 16, timeout_s=10)
    assert res.status == "output_limit", res
    assert len(res.stdout) == 1 << 16
    assert time.monotonic() - t0 < 5.0


@pytest.fixture
def listener():
    """A TCP socket listening on 127.0.0.1; yields ``(port, accepted)`` where ``accepted()`` tells
    whether anything connected."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)

    def accepted() -> bool:
        try:
            conn, _ = srv.accept()
            conn.close()
            return True
        except (TimeoutError, socket.timeout):
            return False

    yield srv.getsockname()[1], accepted
    srv.close()


def _connect_prog(port: int) -> str:
    return (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=0.5)\n"
            "s.sendall(b'pwned')\nprint('connected')\n")


def test_bwrap_blocks_the_network(listener, guard):
    if BWRAP_REASON:
        pytest.skip(f"bwrap: {BWRAP_REASON}")
    port, accepted = listener
    res = go("bwrap", _connect_prog(port), timeout_s=3)
    assert res.status == "error" and "connected" not in res.stdout
    assert "ConnectionRefusedError" in res.stderr or "OSError" in res.stderr, res.stderr
    assert not accepted()


def test_local_does_not_block_the_network(listener, guard):
    """Documented weakness of ``local`` (not a security boundary): the loopback is reachable."""
    port, accepted = listener
    res = go("local", _connect_prog(port), timeout_s=3)
    assert res.status == "ok" and accepted()


@pytest.mark.parametrize("backend", BACKENDS)
def test_secret_in_the_parents_environment_is_not_visible(backend, guard, monkeypatch):
    secret = f"hunter2-{uuid.uuid4().hex}"
    monkeypatch.setenv("RLVR_TEST_API_KEY", secret)
    prog = ("import os\nprint(sorted(os.environ.items()))\n"
            "for pid in (os.getppid(), 1):\n"
            "    try:\n        print(open(f'/proc/{pid}/environ').read())\n"
            "    except OSError as e:\n        print('denied', e)\n")
    res = go(backend, prog, timeout_s=3)
    assert res.status == "ok", res
    assert secret not in res.stdout + res.stderr
    assert "RLVR_TEST_API_KEY" not in res.stdout


def test_bwrap_hides_the_parents_files_and_home(tmp_path, monkeypatch, guard):
    if BWRAP_REASON:
        pytest.skip(f"bwrap: {BWRAP_REASON}")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret.txt").write_text("hunter2")
    prog = (f"import os\nfor p in [{str(tmp_path / 'secret.txt')!r}, {os.path.expanduser('~')!r}, {os.getcwd()!r}]:\n"
            "    try:\n        print(p, open(p).read() if os.path.isfile(p) else os.listdir(p))\n"
            "    except OSError as e:\n        print('no', type(e).__name__)\n"
            "print(sorted(os.listdir('/')))\n")
    res = go("bwrap", prog, timeout_s=3)
    assert res.status == "ok", res
    assert "hunter2" not in res.stdout and res.stdout.count("no FileNotFoundError") == 3, res.stdout
    top = res.stdout.strip().splitlines()[-1]
    assert all(f"'{d}'" not in top for d in ("root", "home", "work", "mnt", "var")), top


@pytest.mark.parametrize("backend", BACKENDS)
def test_writes_outside_the_sandbox_folder_do_not_land(backend, tmp_path, guard):
    if backend == "local" and not ROOT:
        pytest.skip("local runs as the caller when not root: it can write wherever the caller can")
    tmp_path.chmod(0o700)
    targets = [tmp_path / "escape.txt", os.path.join(os.getcwd(), f"escape-{uuid.uuid4().hex}.txt")]
    if backend == "bwrap":  # /tmp inside bwrap is the sandbox's own tmpfs; local's nobody may write /tmp
        targets.append(os.path.join(tempfile.gettempdir(), f"rlvr-escape-{uuid.uuid4().hex}"))
    prog = ("import os\nfor p in %r:\n    try:\n        open(p, 'w').write('x'); print('wrote', p)\n"
            "    except OSError as e:\n        print('no', type(e).__name__)\n" % [str(t) for t in targets])
    res = go(backend, prog, timeout_s=3)
    assert res.status == "ok", res
    assert not any(os.path.exists(t) for t in targets), res.stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_killing_its_parent_harms_nobody(backend, guard):
    if backend == "local" and not ROOT:
        pytest.skip("local runs as the caller when not root: it could signal the caller")
    prog = ("import os, signal\nfor target in (os.getppid(), -1):\n    try:\n        os.kill(target, signal.SIGKILL)\n"
            "    except OSError as e:\n        print('no', type(e).__name__)\nprint('still here')\n")
    res = go(backend, prog, timeout_s=3)
    assert res.status in ("ok", "killed"), res  # kill(-1) may take the program itself down
    assert os.getppid() > 1  # the test process (the program's parent under local) is alive: we are here


@pytest.mark.parametrize("backend", BACKENDS)
def test_double_forked_daemon_does_not_outlive_the_run(backend, guard):
    prog = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        time.sleep(30)\n    os._exit(0)\nos.wait()\nprint('parent done')\n")
    res = go(backend, prog, timeout_s=5)
    assert res.status == "ok" and res.stdout == "parent done\n", res
    assert res.wall_s < 3.0  # the run ends when the program does, not at the deadline


@pytest.mark.parametrize("backend", BACKENDS)
def test_program_ignoring_sigterm_is_killed_at_the_deadline(backend, guard):
    prog = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
            "while True:\n    time.sleep(0.05)\n")
    res = go(backend, prog, timeout_s=0.8)
    assert res.status == "timeout" and res.stdout == "ready\n", res
    assert res.wall_s < 3.0

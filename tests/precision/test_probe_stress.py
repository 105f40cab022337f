"""One machine, one precision (issue 30): the bf16 probe, run in several fresh processes while other
processes load every core, gives one answer; processes sharing the machine's cache measure once.

The timing path runs even on a CPU without bf16 flags: ``RLVR_CPU_FLAGS`` (rlvr.precision's test hook)
makes the probe believe the CPU claims ``avx512_bf16``, so it times bf16 against fp32 for real.

The probe processes are forked by one launcher that has imported torch and :mod:`rlvr.precision` but run
nothing: each is a new process with nothing decided in memory (the probe's memo is empty), so only the
disk cache can carry a verdict between them, and the suite pays for one torch import instead of three."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import rlvr

SRC = str(Path(rlvr.__file__).resolve().parents[1])

LAUNCHER = r"""
import json, os, sys, time, traceback
from pathlib import Path
import torch  # imported before the barrier: only the probe itself runs under the load
import rlvr.precision.probe as prec
assert prec._probe_hardware.cache_info().currsize == 0  # nothing decided before the fork
go, out, dirs = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
kids = []
for i, d in enumerate(dirs):
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.environ["RLVR_CACHE_DIR"] = d
            (out / f"ready{i}").touch()
            t_end = time.time() + 120
            while not go.exists() and time.time() < t_end:
                time.sleep(0.01)
            p = prec.probe_cpu_bf16()
            (out / f"probe{i}.json").write_text(json.dumps({"native": p.native, "method": p.method,
                                                            "ratio": p.bf16_over_fp32, "pid": os.getpid()}))
        except BaseException:
            (out / f"probe{i}.err").write_text(traceback.format_exc())
            code = 1
        os._exit(code)
    kids.append(pid)
sys.exit(max(os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) for k in kids))
"""


def _env(cache_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RLVR_CPU_BF16"}  # conftest's override: off here
    env.update(RLVR_CPU_FLAGS="avx2 fma avx512_bf16", RLVR_CACHE_DIR=str(cache_dir),
               PYTHONPATH=SRC + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def _wait_for(paths: list[Path], proc: subprocess.Popen, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "probe processes did not start"
        time.sleep(0.05)


def test_probe_gives_one_answer_in_fresh_processes_under_load(tmp_path):
    go = tmp_path / "go"
    # one process with a cache of its own and two sharing one: both caches start empty, so two processes
    # measure under the load, while the third waits on the shared cache's lock and reads its verdict
    dirs = [tmp_path / "own", tmp_path / "shared", tmp_path / "shared"]
    ready = [tmp_path / f"ready{i}" for i in range(len(dirs))]
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(go), str(tmp_path), *map(str, dirs)],
                                env=_env(tmp_path / "unused"), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    busy: list[subprocess.Popen] = []
    try:
        _wait_for(ready, launcher)
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(min(8, max(2, os.cpu_count() or 2)))]  # every core loaded while they time
        time.sleep(0.3)
        go.touch()
        _, err = launcher.communicate(timeout=120)
        assert all(b.poll() is None for b in busy)  # the load lasted the whole measurement
    finally:
        for b in busy:
            b.kill()
            b.wait()
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    errors = [f.read_text() for f in tmp_path.glob("probe*.err")]
    assert launcher.returncode == 0 and not errors, (err, errors)
    got = [json.loads((tmp_path / f"probe{i}.json").read_text()) for i in range(len(dirs))]
    assert len({g["pid"] for g in got}) == len(dirs)  # three processes
    assert len({g["native"] for g in got}) == 1, got  # one answer
    native = got[0]["native"]
    assert got[0]["method"] == "flags+timing"
    assert sorted(g["method"] for g in got[1:]) == ["cache", "flags+timing"]  # the lock: measured once
    measured = [g["ratio"] for g in got if g["method"] == "flags+timing"]
    # every measurement is on the verdict's side of the margin, not just the median of them
    assert all((r >= 1.2) == native for r in measured), measured
    for d in {*dirs}:
        (f,) = (d / "precision").glob("cpu-bf16-*.json")
        assert json.loads(f.read_text())["native"] is native

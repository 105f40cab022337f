"""Checkpoints, failures and machines under torchrun (slow: several launches of two processes each).

* SIGKILL one rank of a 2-rank run mid-training: the job exits non-zero within the collective timeout;
  ``--resume`` on 2 ranks continues and matches the uninterrupted run's metrics step for step; resuming
  the 2-rank checkpoint in one plain process loads (DCP resharding) and trains on.
* Two "nodes" on 127.0.0.1: two ``torchrun --nnodes 2 --node-rank {0,1} --rdzv-endpoint`` launches.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import REPO, metric_rows, run_torchrun, tiny_run_args, torchrun_env

pytestmark = pytest.mark.slow
VOLATILE = ("timing/", "perf/", "time")
MU2 = ["steps_per_generation=2", "save_steps=1"]  # μ = 2: a checkpoint can fall inside a generation round


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _stable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE) and not k.endswith("_total")}


def test_kill_one_rank_then_resume_matches_and_reshards_onto_one_process(tiny_folder, tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    proc = run_torchrun(["-m", "rlvr", "train", "--config", "grpo", *tiny_run_args(tiny_folder, ref, *MU2, "max_steps=6")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = {r["step"]: _stable(r) for r in metric_rows(ref)}
    # the run to kill: same config, a longer budget (max_steps may change on resume), 20 s collective timeout
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "rlvr",
           "train", "--config", "grpo", *tiny_run_args(tiny_folder, run, *MU2, "max_steps=200",
                                                      "distributed.timeout_s=20")]
    job = subprocess.Popen(cmd, env=torchrun_env(), cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and not any((run / f"checkpoint-{k}").is_dir() for k in (3, 4)):
        time.sleep(0.2)
    workers = _children(job.pid)
    assert workers, "no worker processes found"
    os.kill(max(workers), signal.SIGKILL)  # one rank dies mid-run
    t = time.time()
    try:
        code = job.wait(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert code != 0 and time.time() - t < 60, "the job did not end after a rank was killed"
    proc = run_torchrun(["-m", "rlvr", "train", "--config", "grpo", "--resume",
                         *tiny_run_args(tiny_folder, run, *MU2, "max_steps=6", "distributed.timeout_s=20")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stderr
    got = {r["step"]: _stable(r) for r in metric_rows(run)}
    assert sorted(got) == list(range(1, 7))
    for step in range(1, 7):
        assert got[step] == want[step], f"step {step} differs after the kill and resume"
    # 2 ranks -> 1 process: model and optimizer load through DCP resharding, training continues
    one = subprocess.run([sys.executable, "-m", "rlvr", "train", "--config", "grpo", "--resume",
                          *tiny_run_args(tiny_folder, run, *MU2, "max_steps=8", "distributed.timeout_s=20")],
                         env=torchrun_env(), cwd=str(REPO), capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    assert "resumed from" in one.stderr and "at step 6" in one.stderr
    assert [r["step"] for r in metric_rows(run)][-2:] == [7, 8]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_on_localhost(tiny_folder, tmp_path):
    port = _free_port()
    out = tmp_path / "run"
    common = ["--nnodes", "2", "--nproc_per_node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
              "--rdzv-id", "rlvr-test", "-m", "rlvr", "train", "--config", "grpo", *tiny_run_args(tiny_folder, out)]
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--node-rank", str(n), *common],
                              env=torchrun_env(), cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, e[-3000:]
    assert "2 processes (1 on this node)" in outs[0][1] + outs[1][1]
    assert [r["step"] for r in metric_rows(out)] == [1, 2, 3]

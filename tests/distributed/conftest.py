"""Helpers for the multi-process tests: run a worker under ``torchrun`` on CPU with gloo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def torchrun_env(**extra: str) -> dict[str, str]:
    """Environment for a torchrun child: this checkout's ``src`` and tests importable, offline, 1 thread."""
    path = os.pathsep.join([str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                OMP_NUM_THREADS="1", **extra)


def run_torchrun(args: list[str], *, nproc: int = 2, timeout: float = 300, extra_env: dict | None = None,
                 launcher: list[str] | None = None) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --standalone --nproc_per_node N ARGS`` (a free port each time)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", *(launcher or ["--standalone"]),
           "--nproc_per_node", str(nproc), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=torchrun_env(**(extra_env or {})),
                          timeout=timeout, cwd=str(REPO))


def result_line(proc: subprocess.CompletedProcess) -> dict:
    """The JSON after ``RESULT `` in a worker's stdout (fails the test with the logs otherwise)."""
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    pytest.fail(f"no RESULT line (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")

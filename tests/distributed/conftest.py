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


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory) -> Path:
    """The tiny in-process llama saved as a Hugging Face folder (for ``model.name_or_path``)."""
    from rlvr.models.tiny import build_tiny_model

    folder = tmp_path_factory.mktemp("tiny_model")
    model, tok = build_tiny_model(0)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def tiny_run_args(model_dir: Path, out: Path, *extra: str) -> list[str]:
    """``rlvr train`` overrides for a few-second run of the tiny model on the testbed task with an
    even-length reward (variance in every group)."""
    return [
        f"model.name_or_path={model_dir}", "task.type=testbed", "task.config.min_level=1", "task.config.max_level=3",
        f"task.reward_fn={REPO / 'tests' / 'distributed' / 'toy_reward.py'}:even_length",
        "num_generations=4", "generation_batch_size=16", "per_device_train_batch_size=4",
        "max_completion_length=8", "max_prompt_length=64", "max_steps=3", "learning_rate=1e-3",
        "logging.progress=false", "logging.tensorboard=false", "reward_timeout_s=0", "logging.log_completions_steps=1",
        f"logging.output_dir={out}", *extra,
    ]


def metric_rows(out: Path) -> list[dict]:
    """The rows of ``out/metrics.jsonl``."""
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]

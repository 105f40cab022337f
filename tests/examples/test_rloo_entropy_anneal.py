"""The worked plugin of ``examples/rloo_entropy_anneal/`` runs from the command line exactly as the README
says (``python -m rlvr train --config examples/.../algo.yaml``), from another working directory, with
its own schedule and config section taking effect."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rlvr

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "rloo_entropy_anneal" / "algo.yaml"
TINY = ["model.name_or_path=tiny", "task.train_size=16", "task.eval_size=4", "num_generations=2",
        "generation_batch_size=4", "per_device_train_batch_size=4", "max_completion_length=4",
        "max_prompt_length=48", "reward_timeout_s=0", "logging.progress=false", "logging.tensorboard=false",
        "max_steps=2"]


def _rlvr(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    src = str(Path(rlvr.__file__).resolve().parents[1])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "rlvr", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=240)


def test_the_example_plugin_trains_from_the_cli_with_its_own_section(tmp_path):
    out = tmp_path / "run"
    r = _rlvr(tmp_path, "train", "--config", str(RECIPE), *TINY, "entropy_anneal.start=0.04",
              "entropy_anneal.anneal_end=2", f"logging.output_dir={out}")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    # the knob took effect: coef(s) = 0.04 + (0 - 0.04) * s / 2 for s = 0, 1 updates done before the step
    assert [row["entropy_anneal/coef"] for row in rows] == pytest.approx([0.04, 0.02])
    for row in rows:  # ... inside the loss: loss/entropy = -coef * agg(H) (token-mean, actor/entropy)
        assert row["loss/entropy"] == pytest.approx(-row["entropy_anneal/coef"] * row["actor/entropy"], rel=1e-4)
    saved = (out / "config.yaml").read_text()
    assert "entropy_anneal:" in saved and "rloo_entropy_anneal" in saved  # the section and the plugin recorded


def test_the_example_section_is_strict_with_nearest_name_errors(tmp_path):
    r = _rlvr(tmp_path, "train", "--config", str(RECIPE), *TINY, "entropy_anneal.anneal_ends=3",
              f"logging.output_dir={tmp_path / 'run'}")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "entropy_anneal.anneal_ends: unknown key; did you mean 'entropy_anneal.anneal_end'?" in r.stderr
    assert not (tmp_path / "run").exists()

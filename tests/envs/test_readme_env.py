"""The user guide's environment runs as written (docs/usage.md, moved there from the README): its
``my_env.py`` block and its ``env.type=my_env:RetryEnv`` command, through the CLI, one step on the tiny model."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from rlvr import cli

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "usage.md"


def test_the_readme_environment_example_trains_one_step(tmp_path, monkeypatch, capsys):
    text = GUIDE.read_text(encoding="utf-8")
    (module,) = re.findall(r"```py\n(# my_env\.py\n.*?)```", text, flags=re.S)
    (cmd,) = [c for c in re.findall(r"^rlvr train .*env\.type=my_env:RetryEnv.*$", text, flags=re.M)]
    monkeypatch.chdir(tmp_path)
    Path("my_env.py").write_text(module)
    argv = shlex.split(cmd)[1:] + [
        "model.name_or_path=tiny", "task.name=basic_arithmetic", "task.train_size=8", "task.eval_size=4",
        "num_generations=2", "generation_batch_size=4", "per_device_train_batch_size=4", "max_completion_length=8",
        "max_prompt_length=256", "max_steps=1", "reward_timeout_s=0", "logging.progress=false",
        "logging.tensorboard=false"]
    code = cli.main(argv)
    assert code == 0, capsys.readouterr().err[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "runs/env/metrics.jsonl").read_text().splitlines()]
    assert rows[0]["env/turns_mean"] >= 1 and rows[0]["env/errors"] == 0

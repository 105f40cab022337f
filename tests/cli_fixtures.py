"""Shared CLI test fixtures: the smallest offline ``rlvr train`` (in-process ``tiny`` model).

Imported as ``from cli_fixtures import TINY, train_tiny`` (``tests/`` is on ``sys.path`` through its
``conftest.py``, as for ``fbos_fixtures``)."""

from __future__ import annotations

import pytest

from rlvr import cli

TINY = ["model.name_or_path=tiny", "task.name=basic_arithmetic", "task.train_size=16", "task.eval_size=4",
        "num_generations=2", "generation_batch_size=4", "per_device_train_batch_size=4",
        "max_completion_length=4", "max_prompt_length=48", "reward_timeout_s=0", "logging.progress=false",
        "logging.tensorboard=false", "max_steps=2", "eval.num_samples=2", "eval.ks=[1,2]"]
"""Overrides of a 2-step run on the in-process ``tiny`` model (seconds on a CPU)."""


def train_tiny(tmp_path, *extra: str) -> int:
    """``rlvr train`` with :data:`TINY` into ``tmp_path/run``, then ``extra`` overrides/flags; returns the exit code."""
    return cli.main(["train", *TINY, f"logging.output_dir={tmp_path / 'run'}", *extra])


@pytest.fixture
def no_model_loads(monkeypatch):
    """Fail the test if a model (policy, checkpoint policy or adapter) is loaded: bad input must be
    reported before that. Use with ``from cli_fixtures import no_model_loads``."""
    import rlvr.lora
    import rlvr.models

    def fail(*a, **k):
        pytest.fail("a model was loaded before the bad input was reported")

    monkeypatch.setattr(rlvr.models, "load_policy", fail)
    monkeypatch.setattr(rlvr.lora, "load_checkpoint_policy", fail)
    monkeypatch.setattr(rlvr.lora, "load_adapter_policy", fail)

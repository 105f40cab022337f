"""Shared fixtures: a tiny random model and a cheap synthetic task, both built in-process (offline)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny():
    """``(model_factory, tokenizer)``: ``model_factory(seed)`` returns a fresh tiny llama."""
    from rlvr.models import build_tiny_model

    _, tok = build_tiny_model(0)

    def make(seed: int = 0):
        return build_tiny_model(seed)[0]

    return make, tok


@dataclass
class ToyTask:
    """A task whose verifier is cheap and gives within-group variance even for a random model:
    score 1 when the completion has an even number of characters (a stand-in for correctness)."""

    name: str = "toy"
    system_prompt: str = "Answer with a number."
    n: int = 16
    fail_on: set = field(default_factory=set)

    def problems(self, split):
        from rlvr.tasks.base import Problem

        off = 0 if split == "train" else 1000
        return [Problem(uid=f"{split}-{i}", question=f"{i + off} + 1 =", answer=str(i + off + 1)) for i in range(self.n)]

    def verify(self, problem, completion):
        from rlvr.tasks.base import Verdict

        if problem.uid in self.fail_on:
            raise RuntimeError("boom")
        ok = len(completion) % 2 == 0
        return Verdict(score=float(ok), correct=ok, feedback=None if ok else "odd length")


@pytest.fixture
def toy_task():
    return ToyTask()


def small_config(tmp_path, *overrides):
    """A config sized for a few-second CPU run on the tiny model."""
    from rlvr.config import build_config

    base = [
        "num_generations=4", "generation_batch_size=8", "per_device_train_batch_size=4",
        "max_completion_length=8", "max_prompt_length=64", "max_steps=2", "learning_rate=1e-3",
        f"logging.output_dir={tmp_path}", "logging.progress=false", "logging.log_completions_steps=1",
    ]
    return build_config(overrides=base + list(overrides))

"""Shared fixtures: a tiny random model and a cheap synthetic task, both built in-process (offline)."""

from __future__ import annotations

import os

import pytest

from rlvr.testing import ToyTask  # noqa: F401 (re-exported for fixtures)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")  # logging.report_to=[wandb] never reaches the network in tests
os.environ.setdefault("WANDB_SILENT", "true")
# model.dtype=auto follows the CPU (rlvr.precision): pin the probe to "no native bf16" so the suite runs
# the same fp32 numerics on every machine; tests of the bf16 branch set RLVR_CPU_BF16=1 themselves.
os.environ["RLVR_CPU_BF16"] = "0"


@pytest.fixture(scope="session")
def tiny():
    """``(model_factory, tokenizer)``: ``model_factory(seed)`` returns a fresh tiny llama."""
    from rlvr.models.tiny import build_tiny_model

    _, tok = build_tiny_model(0)

    def make(seed: int = 0):
        return build_tiny_model(seed)[0]

    return make, tok


@pytest.fixture
def toy_task():
    """A fresh :class:`rlvr.testing.ToyTask`."""
    return ToyTask()


@pytest.fixture(autouse=True, scope="session")
def _single_torch_thread():
    """Tiny models run fastest on one intra-op thread; on 2-core machines a second OpenMP thread mostly
    waits for a core (a 0.3 s test was seen taking 16 s under load). Restored afterwards."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

"""Shared fixtures of the engine tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _single_torch_thread():
    """Tiny models run fastest on one thread; on the shared 2-core machines a second OpenMP thread
    mostly waits for a core (a 0.3 s test was seen taking 16 s under load). Restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

"""Batch statistics over every rank's rows (``scale_rewards=batch``)."""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["global_std"]


def global_std(values: torch.Tensor, dp: Any, *, unbiased: bool = True) -> float:
    """Standard deviation of the union of every rank's ``values`` (two all-reduces: count and sum, then
    the sum of squared deviations from the global mean — numerically the two-pass formula).

    Args:
        values: ``[n]`` this rank's values (``n`` may be 0).
        dp: the rank's :class:`~rlvr.distributed.parallel.DataParallel` (anything with ``sum``).
        unbiased: divide by ``N − 1`` (else ``N``), ``N`` the job's count.

    Returns:
        the std (0.0 when ``N − 1 ≤ 0``, resp. ``N = 0``).

    Source: Lite-PPO / TRL ``scale_rewards="batch"`` (std of all rewards of the batch), over ranks.
    """
    v = values.detach().double().reshape(-1)
    n, s = dp.sum([float(v.numel()), float(v.sum())])
    mean = s / n if n > 0 else 0.0
    (ss,) = dp.sum([float(((v - mean) ** 2).sum())])
    d = n - 1 if unbiased else n
    return math.sqrt(ss / d) if d > 0 else 0.0

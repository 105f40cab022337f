"""Normalisations of a learned reward before it is weighted into the total (``normalize:`` of a
``rewards:`` entry): per-group z-scores and a running z-score.

A reward model's raw scale is arbitrary (one model's logits sit near −5, another's near +20) and drifts
as the policy moves; weighting it against a verifier's {0, 1} needs it on a known scale.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def group_zscore(values: torch.Tensor, group_id: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``(v - mean_g) / (std_g + eps)`` within each group of ``group_id`` (``[N]`` each), std with
    Bessel's correction; a group of one row gets 0.

    Source: the GRPO group normalisation (Shao et al. 2024, "DeepSeekMath", §4.1.2) applied to one
    component before the weighting rather than to the total after it (interpretation: so a reward model's
    scale cannot swamp the verifier's in the sum).
    """
    v = values.double()
    out = torch.zeros_like(v)
    for g in torch.unique(group_id):
        rows = group_id == g
        x = v[rows]
        if x.numel() < 2:
            continue
        out[rows] = (x - x.mean()) / (x.std(unbiased=True) + eps)
    return out.to(values.dtype)


class RunningMoments:
    """Running mean and standard deviation of every value seen (Chan et al.'s parallel update of
    Welford's algorithm, exact in any batch split), to z-score new values against.

    Interpretation of TRL's ``RunningMoments`` reward scaling (``trl.trainer.utils``; code-precedent): a
    batch updates the moments first and is then normalised with them, so the first batch is normalised
    by its own statistics.
    """

    def __init__(self, eps: float = 1e-6) -> None:
        self.eps = float(eps)
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0  # sum of squared deviations from the mean

    @property
    def std(self) -> float:
        """Bessel-corrected standard deviation (1 with fewer than two values)."""
        return math.sqrt(self.m2 / (self.count - 1)) if self.count > 1 else 1.0

    def update(self, values: torch.Tensor) -> None:
        """Fold ``values`` (any shape) into the moments."""
        x = values.detach().double().flatten()
        n = int(x.numel())
        if n == 0:
            return
        mean_b = float(x.mean())
        m2_b = float(((x - mean_b) ** 2).sum())
        total = self.count + n
        delta = mean_b - self.mean
        self.mean += delta * n / total
        self.m2 += m2_b + delta * delta * self.count * n / total
        self.count = total

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        """:meth:`update` with ``values``, then ``(values - mean) / (std + eps)`` in ``values``' dtype."""
        self.update(values)
        return ((values.double() - self.mean) / (self.std + self.eps)).to(values.dtype)

    def state_dict(self) -> dict[str, Any]:
        """``{"count", "mean", "m2"}`` (JSON-serialisable)."""
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s numbers."""
        self.count, self.mean, self.m2 = int(state["count"]), float(state["mean"]), float(state["m2"])


__all__ = ["RunningMoments", "group_zscore"]

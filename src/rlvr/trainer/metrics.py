"""Metric assembly: rollout statistics per generation batch (loss statistics: :class:`rlvr.core.objective.LossMetricAccumulator`).

Names are stable slash paths (``docs/grpo.md`` §11).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rlvr.core.advantages import mean_group_std, zero_std_group_fraction
from rlvr.types import RolloutBatch


def rollout_metrics(batch: RolloutBatch, view_only_kinds: tuple[str, ...] = ()) -> dict[str, float]:
    """Reward, pass-rate, length and truncation statistics of a scored batch.

    Rows whose ``context_kind`` is in ``view_only_kinds`` (a second view of tokens another row already
    holds, e.g. a feedback-augmented view of a rollout) are left out, so every generated sequence counts once.

    Returns keys ``reward/mean``, ``reward/std``, ``reward/group_std_mean``, ``rewards/<fn>/mean|std``,
    ``reward/pass_rate``, ``reward/frac_zero_std_groups``, ``completions/mean_length``,
    ``completions/min_length``, ``completions/max_length``, ``completions/clipped_ratio``,
    ``completions/mean_terminated_length``, ``advantages/mean``, ``advantages/abs_mean`` (when set).
    """
    assert batch.rewards is not None, "rollout_metrics needs a scored batch"
    keep = batch.generated_rows(view_only_kinds)
    if keep and len(keep) < len(batch):
        batch = batch.select(keep)
    r = batch.rewards.float()
    lengths = batch.model_lengths.float()  # tokens the policy sampled (multi-turn: environment tokens left out)
    term = lengths[~batch.is_truncated]
    out = {
        "reward/mean": float(r.mean()),
        "reward/std": float(r.std()) if r.numel() > 1 else 0.0,
        "reward/group_std_mean": mean_group_std(r, batch.group_id),
        "reward/frac_zero_std_groups": zero_std_group_fraction(r, batch.group_id),
        "completions/mean_length": float(lengths.mean()),
        "completions/min_length": float(lengths.min()),
        "completions/max_length": float(lengths.max()),
        "completions/clipped_ratio": float(batch.is_truncated.float().mean()),
        "completions/mean_terminated_length": float(term.mean()) if term.numel() else 0.0,
    }
    if batch.correct is not None:
        out["reward/pass_rate"] = float(batch.correct.float().mean())
    for name, comp in batch.reward_components.items():
        valid = comp[~torch.isnan(comp)]
        out[f"rewards/{name}/mean"] = float(valid.mean()) if valid.numel() else math.nan
        out[f"rewards/{name}/std"] = float(valid.std()) if valid.numel() > 1 else 0.0
    if batch.advantages is not None:
        a = batch.advantages.float()
        out["advantages/mean"] = float(a.mean())
        out["advantages/abs_mean"] = float(a.abs().mean())
    return out


def peak_memory_mb() -> float:
    """Peak resident memory of this process in MiB (CUDA peak allocation when on GPU)."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    except Exception:  # noqa: BLE001 - not available on every platform
        return math.nan

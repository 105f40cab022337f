"""Schedules: which stored batches feed which optimizer updates (``grpo_core.md`` §15, "Schedule").

A schedule turns one prepared generation batch into a list of optimizer batches. Variants that
replay old rollouts (UEC-RL), alternate objectives (FBOS-RL) or run very stale stages (μ-GRPO) are
schedules, not trainers. Each optimizer batch may carry in its ``meta``:

- ``"phase"``: a metric prefix for that update (e.g. ``"epa"``), logged as ``<phase>/...``;
- ``"loss_settings"``: a :class:`rlvr.core.objective.LossSettings` replacing the run's for that update;
- ``"update_metrics"``: scalars logged with that update (e.g. the stage index);
- ``"before_update"``: a one-shot action ``fn(trainer)`` run just before that update (e.g. an optimizer
  reset at a stage start); a resumed run re-plans and skips the updates already done, so it is not
  repeated;
- ``"loss_kwargs_fn"``: extra per-micro-batch inputs of the policy loss (FBOS-RL's EPA weights).

A generation batch's own ``meta["metrics"]`` (sampler and filter scalars) is logged once per
generation round, not per update.

Register new schedules in :data:`SCHEDULES` (name → factory taking the run config).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

from rlvr.types import RolloutBatch


class Schedule(Protocol):
    """The schedule interface the trainer drives."""

    def plan(self, trainer: Any, batch: RolloutBatch) -> list[RolloutBatch]:
        """Optimizer batches to run on a freshly prepared generation batch, in order."""

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state for checkpoints (tensors allowed only under ``"tensors"``)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


def split_groups(
    batch: RolloutBatch, num_batches: int, *, seed: int, passes: int = 1
) -> list[RolloutBatch]:
    """Shuffle whole groups (seeded, reshuffled per pass) and cut them into ``num_batches`` optimizer
    batches per pass; ``passes × num_batches`` batches in all (fewer when there are fewer groups).

    Source: grpo_core.md §4 (``num_iterations`` passes, groups reshuffled between passes) and §1
    (every optimizer batch holds whole groups).
    """
    groups = list(dict.fromkeys(batch.group_id.tolist()))
    rows_of: dict[int, list[int]] = {}
    for i, g in enumerate(batch.group_id.tolist()):
        rows_of.setdefault(g, []).append(i)
    out = []
    for it in range(passes):
        gen = torch.Generator().manual_seed(seed * 1009 + it)
        order = [groups[i] for i in torch.randperm(len(groups), generator=gen).tolist()]
        k = max(1, min(num_batches, len(order)))
        per = -(-len(order) // k)
        for s in range(k):
            chunk = order[s * per : (s + 1) * per]
            if chunk:
                out.append(batch.select([r for g in chunk for r in rows_of[g]]))
    return out


class OnPolicySchedule:
    """``steps_per_generation × num_iterations`` updates per generation batch (GRPO; μ = 1 is on-policy).

    Args:
        steps_per_generation: optimizer batches per pass.
        num_iterations: passes over the generation batch.
        seed: shuffling seed (combined with the generation round).
    """

    def __init__(self, steps_per_generation: int = 1, num_iterations: int = 1, seed: int = 0) -> None:
        self.steps_per_generation = steps_per_generation
        self.num_iterations = num_iterations
        self.seed = seed

    def plan(self, trainer: Any, batch: RolloutBatch) -> list[RolloutBatch]:
        """Whole-group optimizer batches, reshuffled between passes."""
        return split_groups(
            batch, self.steps_per_generation, seed=self.seed * 31 + trainer.generation_round,
            passes=self.num_iterations,
        )

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


SCHEDULES: dict[str, Callable[[Any], Schedule]] = {
    "on_policy": lambda cfg: OnPolicySchedule(cfg.steps_per_generation, cfg.num_iterations, cfg.seed),
}
"""Schedule registry: ``cfg.schedule`` name → factory ``(RLConfig) -> Schedule``."""

"""The schedule seam: a schedule turns one prepared generation batch into typed optimizer steps.

A schedule is a *planner*. ``plan(batch, ctx) -> list[OptimizerStep]`` reads the batch (scored, with
advantages and, when the schedule asks for them, behaviour log-probs) and a narrow :class:`PlanContext`
the trainer implements. It never touches the model, the optimizer or the prompt loader: it asks the
context for no-grad log-probs, and it names the actions to run before a step (``start``), which the
trainer performs when it reaches that step (so a resumed run, which re-plans and skips the steps already
done, does not repeat them). What a step needs beyond its rows travels in the :class:`OptimizerStep`,
not in the batch.

Variants that replay old rollouts (UEC-RL), alternate objectives (FBOS-RL) or run very stale stages
(μ-GRPO) are schedules, not trainers. Register one with ``@SCHEDULES.register(name)`` on a factory
``(RLConfig) -> Schedule``.

Source: grpo_core.md §4 (updates per generation batch), §15 ("Schedule").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

import torch

from rlvr.core.objective import LossSettings
from rlvr.registry import Registry
from rlvr.types import RolloutBatch

START_ACTIONS = ("reset_optimizer", "reshuffle_prompts")
"""Names an :attr:`OptimizerStep.start` may hold (methods of :class:`PlanContext`)."""


@dataclass(frozen=True)
class OptimizerStep:
    """One optimizer update as planned by a schedule.

    Attributes:
        batch: the rows of this update (whole groups); ``advantages`` set, ``old_logp`` as prepared.
        phase: metric prefix of this update (``"epa"`` → ``epa/actor/...``); ``None``: no prefix.
        loss_settings: replaces the run's :class:`~rlvr.core.objective.LossSettings` for this update.
        loss_inputs: extra keyword inputs of the registered policy loss. A tensor whose first dimension
            is ``len(batch)`` is row-aligned and cut per micro-batch (``[N]`` → ``[n]``, ``[N, T]`` →
            ``[n, T_micro]``); any other value is passed as it is.
        metrics: scalars logged with this update (e.g. the stage index).
        start: actions of :data:`START_ACTIONS` the trainer runs just before this update.

    Raises:
        ValueError: an unknown start action.
    """

    batch: RolloutBatch
    phase: str | None = None
    loss_settings: LossSettings | None = None
    loss_inputs: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)
    start: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.batch)

    def __post_init__(self) -> None:
        bad = [a for a in self.start if a not in START_ACTIONS]
        if bad:
            raise ValueError(f"OptimizerStep.start: unknown actions {bad}; expected some of {START_ACTIONS}")


class PlanContext(Protocol):
    """What a schedule may ask of the trainer while planning (and nothing else).

    Attributes:
        generation_round: 1-based index of the generation round just drawn (the trainer counts it).
        pad_token_id: padding id for building batches (:meth:`RolloutBatch.concat`).
        settings: the run's loss settings (a step may replace them, see :attr:`OptimizerStep.loss_settings`).
        global_step: optimizer updates done before this plan (0 at the first round; a resumed run's count),
            so a coefficient that changes over training needs no step counter of its own.
        max_steps: the run's ``max_steps`` (updates in the whole run).
        config: the run's config section of the schedule (the pydantic model it declared with
            ``@SCHEDULES.register(name, config=..., section=...)``, as validated from the YAML), or
            ``None`` when it declared none.

    A distributed trainer implements :meth:`logprobs` over its ranks; the schedule stays unaware, except
    that a decision taken from its rank's rows goes through :meth:`any_rank`.
    """

    generation_round: int
    pad_token_id: int
    settings: LossSettings
    global_step: int
    max_steps: int
    config: Any

    def logprobs(self, batch: RolloutBatch, *, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """No-grad ``(logp [N, T], entropy [N, T] | None)`` of ``batch`` under the current policy, every
        row under its own context (0 at padding)."""

    def any_rank(self, flag: bool) -> bool:
        """``flag`` or'ed over every rank of a ``torchrun`` job (one process: ``flag``). A collective: call it
        on every rank, the same number of times, so that a plan that depends on a rank's own rows (a
        phase left out for lack of signal) is the same plan on every rank."""

    def reset_optimizer(self) -> None:
        """Clear the optimizer's state (moments); the learning-rate schedule continues. Run as a start action."""

    def reshuffle_prompts(self) -> None:
        """Start the prompt loader on a fresh shuffle (next epoch). Run as a start action."""


class Schedule(Protocol):
    """The schedule interface the trainer drives.

    Attributes:
        needs_old_logp: the prepared batch must carry behaviour log-probs ``old_logp`` (some rows are
            trained after the policy has moved); the trainer's preparation path computes them.

    Optional attribute (read with ``getattr``): ``primary_phase`` — for a schedule whose steps carry a
    ``phase`` prefix, the phase whose ``actor/*`` metrics stand for the run in summaries
    (:func:`rlvr.compare.curves.curve_values`); absent or ``None``: phases are averaged.
    """

    needs_old_logp: bool

    def plan(self, batch: RolloutBatch, ctx: PlanContext) -> list[OptimizerStep]:
        """Optimizer steps to run on a freshly prepared generation batch, in order."""

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state for checkpoints (tensors allowed only under ``"tensors"``)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


def split_groups(
    batch: RolloutBatch, num_batches: int, *, seed: int | None = None, passes: int = 1
) -> list[RolloutBatch]:
    """Cut whole groups into ``num_batches`` optimizer batches per pass; ``passes × num_batches`` batches
    in all (fewer when there are fewer groups).

    With a ``seed`` the groups are shuffled (seeded, reshuffled per pass); with ``seed=None`` they keep
    generation order (consecutive chunks).

    Source: grpo_core.md §4 (``num_iterations`` passes, groups reshuffled between passes) and §1
    (every optimizer batch holds whole groups).
    """
    groups = list(dict.fromkeys(batch.group_id.tolist()))
    rows_of: dict[int, list[int]] = {}
    for i, g in enumerate(batch.group_id.tolist()):
        rows_of.setdefault(g, []).append(i)
    out = []
    for it in range(passes):
        if seed is None:
            order = groups
        else:
            gen = torch.Generator().manual_seed(seed * 1009 + it)
            order = [groups[i] for i in torch.randperm(len(groups), generator=gen).tolist()]
        k = max(1, min(num_batches, len(order)))
        per = -(-len(order) // k)
        for s in range(k):
            chunk = order[s * per : (s + 1) * per]
            if chunk:
                out.append(batch.select([r for g in chunk for r in rows_of[g]]))
    return out


SCHEDULES: Registry[Callable[[Any], Schedule]] = Registry("schedule", "rlvr.schedules.SCHEDULES")
"""Schedule registry: ``cfg.schedule`` name → factory ``(RLConfig) -> Schedule``."""


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

    @classmethod
    def from_config(cls, cfg: Any) -> "OnPolicySchedule":
        """The run's on-policy schedule: ``steps_per_generation``, ``num_iterations`` and ``seed`` of ``cfg``."""
        return cls(steps_per_generation=cfg.steps_per_generation, num_iterations=cfg.num_iterations, seed=cfg.seed)

    @property
    def needs_old_logp(self) -> bool:
        """μ > 1: later updates of a generation batch see a moved policy."""
        return self.steps_per_generation * self.num_iterations > 1

    def plan(self, batch: RolloutBatch, ctx: PlanContext) -> list[OptimizerStep]:
        """Whole-group optimizer steps, reshuffled between passes."""
        return [OptimizerStep(b) for b in split_groups(
            batch, self.steps_per_generation, seed=self.seed * 31 + ctx.generation_round, passes=self.num_iterations,
        )]

    def state_dict(self) -> dict[str, Any]:
        """No state."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore."""


@SCHEDULES.register("on_policy")
def make_on_policy(cfg: Any) -> OnPolicySchedule:
    """``SCHEDULES["on_policy"]``: :class:`OnPolicySchedule` from ``steps_per_generation``, ``num_iterations``, ``seed``."""
    return OnPolicySchedule.from_config(cfg)

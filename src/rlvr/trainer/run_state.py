"""The training loop's mutable state that a checkpoint saves and a resume restores, in one typed object.

The :class:`~rlvr.trainer.trainer.Trainer` keeps its counters, the dynamic-sampling carry, the generation batch
being trained on and the overlap pipeline in a :class:`RunState` (``trainer.run_state``); the checkpoint writers
(``trainer/checkpoint.py``, ``trainer/dist_checkpoint.py``) read and write that object only, never private
trainer attributes. The trainer's attributes of the same names (``trainer.global_step``, ...) are views of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["RunState", "COUNTERS", "run_state_field"]

COUNTERS = ("global_step", "generation_round", "rollout_round", "weight_version", "num_tokens",
            "consecutive_nonfinite")


@dataclass
class RunState:
    """Mutable loop state of one training run.

    Attributes:
        global_step: optimizer updates done.
        generation_round: generation rounds handed to training (what schedules read).
        rollout_round: generation rounds drawn (seeds the next round's sampling and group ids; ahead of
            ``generation_round`` under overlap). A resume that lost it would draw other rollouts.
        weight_version: version of the trained weights (one per update); the generation engine is pushed the
            weights when its own version differs.
        num_tokens: completion tokens trained on so far.
        consecutive_nonfinite: updates in a row skipped for a non-finite loss or gradient.
        carry: dynamic-sampling rows kept for the next generation batch (``RolloutBatch`` list).
        pending_round: the generation batch being trained on, for checkpoints: ``{"batch", "schedule_state",
            "rng", "plan_step", "next_index", "num_opt_batches"}`` (see ``checkpoint_state.pending_round_state``).
        resume_round: the same shape, set by a checkpoint load: the loop re-plans it and skips the updates done.
        pipeline: the overlap ``RolloutPipeline`` (``max_async_level > 0``) whose ``state()`` a checkpoint
            saves; None without overlap. Not itself serialised.

    Source: interpretation: the resume contract of ``rlvr train --resume`` (``docs/usage.md``, "Checkpoints and resume");
    a resumed run must draw and train the same rows as an uninterrupted one.
    """

    global_step: int = 0
    generation_round: int = 0
    rollout_round: int = 0
    weight_version: int = 0
    num_tokens: int = 0
    consecutive_nonfinite: int = 0
    carry: list[Any] = field(default_factory=list)
    pending_round: dict[str, Any] | None = None
    resume_round: dict[str, Any] | None = None
    pipeline: Any = None

    def counters(self) -> dict[str, int]:
        """The integer counters (:data:`COUNTERS`) as plain ints, as stored in ``trainer_state.json``."""
        return {k: int(getattr(self, k)) for k in COUNTERS}

    def load_counters(self, state: dict[str, Any]) -> None:
        """Set the counters from a :meth:`counters` dict (a ``trainer_state.json``).

        Older files lack some keys: ``rollout_round`` defaults to ``generation_round``, ``weight_version`` to
        ``global_step``, ``consecutive_nonfinite`` to 0.

        Raises:
            KeyError: ``global_step``, ``generation_round`` or ``num_tokens`` is missing.
        """
        self.global_step = int(state["global_step"])
        self.generation_round = int(state["generation_round"])
        self.rollout_round = int(state.get("rollout_round", state["generation_round"]))
        self.weight_version = int(state.get("weight_version", self.global_step))
        self.num_tokens = int(state["num_tokens"])
        self.consecutive_nonfinite = int(state.get("consecutive_nonfinite", 0))

    @classmethod
    def from_counters(cls, state: dict[str, Any]) -> "RunState":
        """A fresh state (no carry, no pending round) with the counters of ``state`` (see :meth:`load_counters`)."""
        out = cls()
        out.load_counters(state)
        return out


_FIELDS = {f.name for f in fields(RunState)}


def run_state_field(name: str) -> property:
    """A read/write property that forwards to ``self.run_state.<name>`` (the trainer's views of its state).

    Raises:
        ValueError: ``name`` is not a :class:`RunState` field.
    """
    if name not in _FIELDS:
        raise ValueError(f"run_state_field: {name!r} is not a RunState field (expected one of {sorted(_FIELDS)})")

    def get(self: Any) -> Any:
        return getattr(self.run_state, name)

    def put(self: Any, value: Any) -> None:
        setattr(self.run_state, name, value)

    return property(get, put, doc=f"``self.run_state.{name}`` (see :class:`rlvr.trainer.run_state.RunState`).")

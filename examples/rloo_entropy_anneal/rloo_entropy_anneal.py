"""RLOO advantages with a linearly annealed entropy bonus: a plugin that lives outside ``rlvr``.

Run it from the command line (the recipe lists this module under ``plugins:``, so ``rlvr`` imports it
before validating the config, and its section ``entropy_anneal`` becomes a known key)::

    python -m rlvr train --config examples/rloo_entropy_anneal/algo.yaml

What it adds, with nothing changed in ``src/rlvr``:

* a schedule ``entropy_annealed``: the on-policy GRPO schedule whose every optimizer step carries
  ``entropy_coef = start + (end − start) · min(s / anneal_end, 1)``, ``s`` the updates done before that
  step (``PlanContext.global_step``; ``anneal_end`` unset = ``max_steps``), and logs it as
  ``entropy_anneal/coef``;
* its typed section ``entropy_anneal: {start, end, anneal_end}`` (strict: a misspelt key is refused,
  exit 2, with the nearest name), declared where the schedule registers.

The advantages are the built-in leave-one-out baseline (``adv_estimator: rloo``: Kool et al. 2019,
"Buy 4 REINFORCE samples, get a baseline for free!"; Ahmadian et al. 2024 §3.2). The entropy bonus is
the loss's own ``−entropy_coef · agg(H)`` term (``rlvr.core.objective``); annealing it from exploration
towards none is a common schedule (interpretation: linear, as PPO implementations anneal their
coefficients; not a published method's exact recipe).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlvr.schedules import SCHEDULES, OnPolicySchedule, OptimizerStep, PlanContext
from rlvr.types import RolloutBatch


class EntropyAnnealConfig(BaseModel):
    """``entropy_anneal:`` — the entropy coefficient goes linearly from ``start`` to ``end`` over the
    first ``anneal_end`` optimizer steps (``None``: the whole run, ``max_steps``) and stays at ``end``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    start: float = Field(0.01, ge=0)
    end: float = Field(0.0, ge=0)
    anneal_end: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _check(self) -> "EntropyAnnealConfig":
        if self.end > self.start:
            raise ValueError(f"entropy_anneal.end={self.end} is above start={self.start}: the bonus anneals down")
        return self


def entropy_coef_at(step: int, cfg: EntropyAnnealConfig, max_steps: int) -> float:
    """The coefficient of the update that follows ``step`` updates (``step`` ≥ 0)."""
    span = cfg.anneal_end or max_steps
    return cfg.start + (cfg.end - cfg.start) * min(step / span, 1.0)


class EntropyAnnealedSchedule:
    """:class:`rlvr.schedules.OnPolicySchedule`'s steps, each with its own ``entropy_coef``."""

    def __init__(self, inner: OnPolicySchedule) -> None:
        self.inner = inner

    @property
    def needs_old_logp(self) -> bool:
        """As the on-policy schedule (μ > 1 needs behaviour log-probs)."""
        return self.inner.needs_old_logp

    def plan(self, batch: RolloutBatch, ctx: PlanContext) -> list[OptimizerStep]:
        """The on-policy steps; step ``k`` of this round gets the coefficient of ``ctx.global_step + k``."""
        out = []
        for k, step in enumerate(self.inner.plan(batch, ctx)):
            coef = entropy_coef_at(ctx.global_step + k, ctx.config, ctx.max_steps)
            settings = dataclasses.replace(step.loss_settings or ctx.settings, entropy_coef=coef)
            out.append(dataclasses.replace(step, loss_settings=settings,
                                           metrics={**step.metrics, "entropy_anneal/coef": coef}))
        return out

    def state_dict(self) -> dict[str, Any]:
        """No state: the step count is the trainer's (checkpointed with the run)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore."""


@SCHEDULES.register("entropy_annealed", config=EntropyAnnealConfig, section="entropy_anneal")
def make_entropy_annealed(cfg: Any) -> EntropyAnnealedSchedule:
    """``schedule: entropy_annealed`` (reads ``steps_per_generation``, ``num_iterations``, ``seed``)."""
    return EntropyAnnealedSchedule(OnPolicySchedule.from_config(cfg))

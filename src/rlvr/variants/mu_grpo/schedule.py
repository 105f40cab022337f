"""The staged schedule of μ-GRPO (``docs/mu_grpo.md`` §2.1): few very large rollout sets, μ updates each.

Registers ``SCHEDULES["staged"]`` and ``CONFIG_CHECKS["mu_grpo"]`` (no overlap with a fresh prompt shuffle).

A *stage* is one generation batch of ``generation_batch_size`` completions. The trainer already does
the per-stage work that is common to every multi-update schedule (``grpo_core.md`` §3–4): it samples
the stage in one generation phase (the engine decodes at most ``max_batch_size`` rows at a time, so
memory stays bounded however large the stage), scores it, stores the group advantages once and the
behaviour log-probs once (its own forward with ``old_logprob_source=trainer``, so ``ρ ≡ 1`` at the first
update of a stage; ``sampler`` takes the engine's). This schedule adds what is stage-specific:

* whole groups are shuffled (``mu_grpo.shuffle_groups_within_stage``) and cut into
  ``steps_per_generation = μ`` optimizer batches, each group used in exactly one update per pass;
* the optimizer state (AdamW moments) is kept across stages unless
  ``mu_grpo.reset_optimizer_each_stage``;
* ``mu_grpo.stage_prompt_draw=fresh_shuffle`` starts every next stage on a fresh shuffle of the
  prompts instead of continuing the epoch-wrapping loader;
* per-update metrics: ``mu_grpo/stage``, ``staleness/current`` (k within the stage, 0 … μ−1),
  ``mu_grpo/generation_phases`` and ``mu_grpo/weight_syncs`` (cumulative; the colocated HF engine
  samples from the trained module itself, so each generation phase is one weight sync at no cost).

Stage bookkeeping is a function of the context's ``generation_round`` (stage = round − 1 after the
stage was drawn) and :meth:`StagedSchedule.plan` has no side effects, so re-planning the same stage
after a resume gives the same optimizer steps and counts nothing twice. The stage-entry actions
(optimizer reset, fresh prompt shuffle) are the first step's ``start`` actions, which the trainer runs
just before that update, so they happen exactly once even when a resumed run re-plans the stage and
skips the updates already done. Mid-stage resume stores the stage data in the checkpoint (the pending
generation batch of :mod:`rlvr.trainer.checkpoint`), it is not regenerated: regenerating would need
the stage-start weights, which are gone after the stage's first update.
"""

from __future__ import annotations

from typing import Any

from rlvr.errors import ConfigError
from rlvr.parts import CONFIG_CHECKS
from rlvr.schedules.base import SCHEDULES, OptimizerStep, PlanContext, split_groups
from rlvr.types import RolloutBatch
from rlvr.variants.mu_grpo.config import MuGRPOConfig


class StagedSchedule:
    """μ updates per stage on stored behaviour data (μ-GRPO; also GRPO μ=4 when μ is small).

    Args:
        steps_per_generation: μ, optimizer batches per stage (per pass).
        num_iterations: passes over the stage (1 in μ-GRPO: every group is used exactly once).
        seed: shuffling seed (combined with the stage index).
        shuffle_groups: shuffle whole groups before cutting (else generation order).
        reset_optimizer_each_stage: clear the optimizer's state at the start of every stage after the
            first (interpretation: the spec's ablation switch; the learning-rate schedule continues).
        stage_prompt_draw: ``continue_loader`` (default) or ``fresh_shuffle``.

    Source: mu_grpo.md §2.1 (stage procedure), §3 (switches), §4 (metrics).
    """

    def __init__(
        self,
        steps_per_generation: int,
        num_iterations: int = 1,
        seed: int = 0,
        *,
        shuffle_groups: bool = True,
        reset_optimizer_each_stage: bool = False,
        stage_prompt_draw: str = "continue_loader",
    ) -> None:
        if steps_per_generation < 1 or num_iterations < 1:
            raise ValueError(
                f"StagedSchedule: steps_per_generation and num_iterations must be >= 1, got "
                f"{steps_per_generation} and {num_iterations}"
            )
        if stage_prompt_draw not in ("continue_loader", "fresh_shuffle"):
            raise ValueError(f"StagedSchedule: unknown stage_prompt_draw {stage_prompt_draw!r}")
        self.steps_per_generation = steps_per_generation
        self.num_iterations = num_iterations
        self.seed = seed
        self.shuffle_groups = shuffle_groups
        self.reset_optimizer_each_stage = reset_optimizer_each_stage
        self.stage_prompt_draw = stage_prompt_draw

    @property
    def mu(self) -> int:
        """Optimizer updates per stage (``steps_per_generation × num_iterations``)."""
        return self.steps_per_generation * self.num_iterations

    @property
    def needs_old_logp(self) -> bool:
        """μ > 1: every update after a stage's first sees a moved policy."""
        return self.mu > 1

    def plan(self, batch: RolloutBatch, ctx: PlanContext) -> list[OptimizerStep]:
        """Optimizer steps of the stage just drawn (``ctx.generation_round`` already counts it).

        Each step's ``metrics`` carry the stage metrics of its update; the first step's ``start`` holds the
        stage-entry actions (``reset_optimizer`` from the second stage on with
        ``reset_optimizer_each_stage``; ``reshuffle_prompts`` with ``stage_prompt_draw=fresh_shuffle``).
        """
        rnd = int(ctx.generation_round)
        stage = rnd - 1
        seed = self.seed * 31 + rnd if self.shuffle_groups else None
        batches = split_groups(batch, self.steps_per_generation, seed=seed, passes=self.num_iterations)
        start = tuple(a for a, on in (("reset_optimizer", self.reset_optimizer_each_stage and stage > 0),
                                      ("reshuffle_prompts", self.stage_prompt_draw == "fresh_shuffle")) if on)
        return [
            OptimizerStep(ob, start=start if k == 0 else (), metrics={
                "mu_grpo/stage": float(stage), "staleness/current": float(k),
                "mu_grpo/generation_phases": float(rnd), "mu_grpo/weight_syncs": float(rnd),
            })
            for k, ob in enumerate(batches)
        ]

    def state_dict(self) -> dict[str, Any]:
        """Empty: everything the schedule needs is the trainer's ``generation_round`` and seed."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (see :meth:`state_dict`)."""


@SCHEDULES.register("staged", config=MuGRPOConfig, section="mu_grpo")
def make_staged(cfg: Any) -> StagedSchedule:
    """``SCHEDULES["staged"]``: :class:`StagedSchedule` from ``steps_per_generation``, ``num_iterations``,
    ``seed`` and ``mu_grpo.*``."""
    m = cfg.mu_grpo
    return StagedSchedule(
        cfg.steps_per_generation, cfg.num_iterations, cfg.seed, shuffle_groups=m.shuffle_groups_within_stage,
        reset_optimizer_each_stage=m.reset_optimizer_each_stage, stage_prompt_draw=m.stage_prompt_draw,
    )


@CONFIG_CHECKS.register("mu_grpo")
def check_mu_grpo(cfg: Any) -> None:
    """The staged schedule's fresh shuffle needs the stages drawn in order (no overlap).

    Raises:
        ConfigError: ``schedule: staged`` with ``mu_grpo.stage_prompt_draw=fresh_shuffle`` and
            ``max_async_level > 0`` or ``streaming.enable``.
    """
    ahead = cfg.max_async_level > 0 or cfg.streaming.enable
    if ahead and cfg.schedule == "staged" and cfg.mu_grpo.stage_prompt_draw == "fresh_shuffle":
        knob = "streaming.enable" if cfg.streaming.enable else f"max_async_level={cfg.max_async_level}"
        raise ConfigError(
            "mu_grpo.stage_prompt_draw=fresh_shuffle reshuffles the prompts at a stage's first update, but with "
            f"{knob} later stages are drawn before it: use continue_loader"
        )

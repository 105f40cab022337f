"""The staged schedule of μ-GRPO (``specs/mu_grpo.md`` §2.1): few very large rollout sets, μ updates each.

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

Stage bookkeeping is a function of the trainer's ``generation_round`` (stage = round − 1 after the
stage was drawn) and :meth:`StagedSchedule.plan` has no side effects, so re-planning the same stage
after a resume gives the same optimizer batches and counts nothing twice. The stage-entry actions
(optimizer reset, fresh prompt shuffle) ride on the first optimizer batch as
``meta["before_update"]``, which the trainer runs just before that update, so they happen exactly
once even when a resumed run re-plans the stage and skips the updates already done. Mid-stage resume stores the stage data in the checkpoint (the pending
generation batch of :mod:`rlvr.trainer.checkpoint`), it is not regenerated: regenerating would need
the stage-start weights, which are gone after the stage's first update.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rlvr.trainer.schedule import split_groups
from rlvr.types import RolloutBatch


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

    def plan(self, trainer: Any, batch: RolloutBatch) -> list[RolloutBatch]:
        """Optimizer batches of the stage just drawn (``trainer.generation_round`` already counts it).

        Each batch's ``meta["update_metrics"]`` carries the stage metrics of its update.
        """
        rnd = int(trainer.generation_round)
        stage = rnd - 1
        if self.shuffle_groups:
            batches = split_groups(batch, self.steps_per_generation, seed=self.seed * 31 + rnd, passes=self.num_iterations)
        else:
            batches = _split_in_order(batch, self.steps_per_generation) * self.num_iterations
        out = []
        for k, ob in enumerate(batches):
            ob.meta = {
                **{key: v for key, v in ob.meta.items() if key != "before_update"},
                "update_metrics": {
                    "mu_grpo/stage": float(stage),
                    "staleness/current": float(k),
                    "mu_grpo/generation_phases": float(rnd),
                    "mu_grpo/weight_syncs": float(rnd),
                },
            }
            out.append(ob)
        if out and (self.reset_optimizer_each_stage and stage > 0 or self.stage_prompt_draw == "fresh_shuffle"):
            out[0].meta["before_update"] = self._enter_stage
        return out

    def _enter_stage(self, trainer: Any) -> None:
        """Stage-entry actions, run by the trainer just before the stage's first update (and only then:
        a run resumed mid-stage skips that update, and its restored optimizer and loader already
        reflect the entry)."""
        if self.reset_optimizer_each_stage and trainer.generation_round > 1:
            trainer.optimizer.state = defaultdict(dict)
        if self.stage_prompt_draw == "fresh_shuffle":
            st = trainer.loader.state_dict()
            trainer.loader.load_state_dict({**st, "epoch": st["epoch"] + 1, "pos": 0})

    def state_dict(self) -> dict[str, Any]:
        """Empty: everything the schedule needs is the trainer's ``generation_round`` and seed."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (see :meth:`state_dict`)."""


def _split_in_order(batch: RolloutBatch, num_batches: int) -> list[RolloutBatch]:
    """Whole groups in generation order, cut into ``num_batches`` consecutive optimizer batches."""
    groups = list(dict.fromkeys(batch.group_id.tolist()))
    rows_of: dict[int, list[int]] = {}
    for i, g in enumerate(batch.group_id.tolist()):
        rows_of.setdefault(g, []).append(i)
    k = max(1, min(num_batches, len(groups)))
    per = -(-len(groups) // k)
    return [
        batch.select([r for g in groups[s * per : (s + 1) * per] for r in rows_of[g]])
        for s in range(k)
        if groups[s * per : (s + 1) * per]
    ]

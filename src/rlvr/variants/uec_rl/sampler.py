"""UEC-RL targeted exploration: extra tempered rollouts for prompts whose regular group never passed.

Registers ``SAMPLERS["hard_prompt"]`` (:class:`HardPromptSampler` from the ``uec:`` section).

Regular round: ``G = num_generations`` completions per prompt at the run's temperature (1.0). The
sampler scores them itself; every prompt with pass rate ≤ ``uec.hard_pass_rate_max`` (0: no success)
then gets ``G′ = uec.explore_num_generations`` extra completions at ``t′ = uec.explore_temperature``,
in one more engine call (none when no prompt is hard). The two sets are joined into one
:class:`~rlvr.types.RolloutBatch`:

* exploration rows carry ``sampling_temperature = t′`` and ``logprob_temperature =
  uec.explore_logprob_temperature`` (1.0: trained as if on-policy, no importance correction);
* with ``uec.explore_adv_grouping = separate`` (default) they form their own group (id
  ``first_group_id + 500_000 + p`` for problem ``p``), so the trainer's unchanged GRPO estimator computes
  exploration advantages within the G′ group alone; ``pooled`` reuses the regular group's id;
* ``context_kind`` is ``"regular"`` / ``"explore"`` per row (the retention filter reads it);
* ``variable_group_sizes = True`` (groups of G and G′), ``metrics`` holds the
  ``uec/*`` sampling metrics of ``docs/uec_rl.md`` §4.

Source: docs/uec_rl.md §2.1–§2.2 and the implementation notes (conditional second-round sampler).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch

from rlvr.core.uec import hard_group_mask
from rlvr.parts import SAMPLERS, SamplerContext
from rlvr.samplers.group import GroupSampler, PromptEncoder
from rlvr.types import KIND_EXPLORE, KIND_REGULAR, RolloutBatch, SamplingParams
from rlvr.variants.uec_rl.config import UECConfig

EXPLORE_GROUP_OFFSET = 500_000
"""Exploration group ids are ``first_group_id + EXPLORE_GROUP_OFFSET + p`` (separate grouping)."""


class HardPromptSampler:
    """Group sampler plus targeted exploration on zero-pass prompts (UEC-RL).

    Args:
        engine: generation backend. encoder: a :class:`PromptEncoder`. scorer: a
            :class:`rlvr.rewards.Scorer` (the gate needs rewards before the trainer scores).
        pad_token_id: id used to right-pad completions.
        explore_num_generations: G′ (0 disables exploration: a plain group sampler with metrics).
        explore_temperature: t′ (> 0; the paper uses t′ > 1, presets 1.1 / 1.2).
        explore_top_p: nucleus mass for exploration; ``None`` uses the regular ``params.top_p``.
        explore_logprob_temperature: temperature of exploration rows' training log-probs (1.0).
        explore_adv_grouping: ``"separate"`` (own group) or ``"pooled"`` (the regular group's id).
        hard_pass_rate_max: a prompt is hard iff its regular pass rate ≤ this (0.0).

    Attributes:
        history: one dict of ``uec/*`` metrics per :meth:`sample` call (for analysis scripts).
        totals: cumulative rollouts and generated tokens, regular and exploration.

    Raises:
        ValueError: ``explore_num_generations < 0`` or unknown ``explore_adv_grouping``.
    """

    def __init__(
        self,
        engine: Any,
        encoder: PromptEncoder,
        scorer: Any,
        pad_token_id: int,
        *,
        explore_num_generations: int = 20,
        explore_temperature: float = 1.1,
        explore_top_p: float | None = None,
        explore_logprob_temperature: float = 1.0,
        explore_adv_grouping: str = "separate",
        hard_pass_rate_max: float = 0.0,
    ) -> None:
        if explore_num_generations < 0:
            raise ValueError(f"explore_num_generations must be >= 0, got {explore_num_generations}")
        if explore_adv_grouping not in ("separate", "pooled"):
            raise ValueError(f"explore_adv_grouping must be 'separate' or 'pooled', got {explore_adv_grouping!r}")
        self.group = GroupSampler(engine, encoder, pad_token_id)
        self.scorer = scorer
        self.pad_token_id = pad_token_id
        self.explore_num_generations = explore_num_generations
        self.explore_temperature = explore_temperature
        self.explore_top_p = explore_top_p
        self.explore_logprob_temperature = explore_logprob_temperature
        self.explore_adv_grouping = explore_adv_grouping
        self.hard_pass_rate_max = hard_pass_rate_max
        self.history: list[dict[str, float]] = []
        self.totals = {"rollouts/regular": 0, "rollouts/explore": 0, "tokens/regular": 0, "tokens/explore": 0}

    def explore_params(self, params: SamplingParams) -> SamplingParams:
        """Sampling settings of the exploration round: ``t′``, its top-p, the same token cap, a derived seed."""
        return dataclasses.replace(
            params,
            temperature=self.explore_temperature,
            top_p=self.explore_top_p if self.explore_top_p is not None else params.top_p,
            seed=None if params.seed is None else (params.seed * 7 + 1) % 2**31,
        )

    def sample(
        self,
        problems: Sequence[Any],
        num_generations: int,
        params: SamplingParams,
        *,
        policy_version: int = 0,
        first_group_id: int = 0,
    ) -> RolloutBatch:
        """``len(problems) × G`` regular rollouts plus ``G′`` per hard prompt, scored.

        Args:
            problems: the B prompts. num_generations: G. params: regular sampling settings (T = 1).
            policy_version: optimizer-update count stamped on every row. first_group_id: group id of problem 0.

        Returns:
            a scored batch (``rewards``, ``correct``, ``texts`` set; no advantages) of ``B·G + H·G′`` rows
            (``H`` hard prompts): regular rows first (group ``first_group_id + p``), then exploration rows.

        Raises:
            RuntimeError: the engine returned another number of completions than requested.
        """
        problems = list(problems)
        regular = self.group.sample(
            problems, num_generations, params, policy_version=policy_version, first_group_id=first_group_id
        )
        s_reg = self.scorer.score(regular)
        n_reg = len(regular)
        passed = regular.correct if regular.correct is not None else regular.rewards > 0
        hard_rows = hard_group_mask(passed, regular.group_id, self.hard_pass_rate_max)  # [N_reg]
        hard_p = sorted(set(regular.prompt_index[hard_rows].tolist()))
        m: dict[str, float] = {
            "uec/hard_prompt_frac": len(hard_p) / max(len(problems), 1),
            "uec/regular_pass_rate": float(passed.float().mean()) if n_reg else 0.0,
            "uec/regular_reward_mean": float(regular.rewards.mean()) if n_reg else 0.0,
        }
        self.totals["rollouts/regular"] += n_reg
        self.totals["tokens/regular"] += int(regular.completion_mask.sum())
        errors = s_reg.errors
        batch = regular
        kinds = [KIND_REGULAR] * n_reg
        n_exp = 0
        if self.explore_num_generations > 0 and hard_p:
            hard_problems = [problems[p] for p in hard_p]
            explore = self.group.sample(
                hard_problems, self.explore_num_generations, self.explore_params(params),
                policy_version=policy_version, first_group_id=0,
            )
            local = explore.prompt_index  # [N_exp] index into hard_problems
            orig = torch.tensor(hard_p, dtype=torch.long)[local]  # [N_exp] index into problems
            explore.prompt_index = orig
            explore.problems = problems
            base = first_group_id + (EXPLORE_GROUP_OFFSET if self.explore_adv_grouping == "separate" else 0)
            explore.group_id = base + orig
            explore.logprob_temperature = torch.full((len(explore),), float(self.explore_logprob_temperature))
            s_exp = self.scorer.score(explore)
            errors += s_exp.errors
            n_exp = len(explore)
            exp_pass = explore.correct if explore.correct is not None else explore.rewards > 0
            solved = {int(p) for p in orig[exp_pass].tolist()}
            m["uec/explore_solve_frac"] = len(solved) / len(hard_p)
            m["uec/explore_pass_rate"] = float(exp_pass.float().mean())
            m["uec/explore_reward_mean"] = float(explore.rewards.mean())
            self.totals["tokens/explore"] += int(explore.completion_mask.sum())
            m["uec/tokens_generated/explore"] = float(explore.completion_mask.sum())
            batch = _join(regular, explore, self.pad_token_id)
            kinds += [KIND_EXPLORE] * n_exp
        self.totals["rollouts/explore"] += n_exp
        batch.context_kind = kinds
        batch.variable_group_sizes = True
        m["uec/explore_rollouts"] = float(n_exp)
        m["uec/tokens_generated/regular"] = float(regular.completion_mask.sum())
        m["uec/verifier_errors"] = float(errors)
        m.update({f"uec/total/{k}": float(v) for k, v in self.totals.items()})
        batch.metrics = dict(m)
        self.history.append(dict(m))
        return batch


def _join(regular: RolloutBatch, explore: RolloutBatch, pad_token_id: int) -> RolloutBatch:
    """Concatenate regular and exploration rows that index the same ``problems`` list."""
    problems = regular.problems
    explore_idx = explore.prompt_index
    out = RolloutBatch.concat([regular, explore], pad_token_id)
    out.prompt_index = torch.cat([regular.prompt_index, explore_idx])  # concat shifted them; undo
    out.problems = problems
    return out


@SAMPLERS.register("hard_prompt", config=UECConfig, section="uec")
def make_hard_prompt_sampler(ctx: SamplerContext) -> HardPromptSampler:
    """``SAMPLERS["hard_prompt"]``: a :class:`HardPromptSampler` configured from ``ctx.cfg.uec``."""
    u = ctx.cfg.uec
    return HardPromptSampler(
        ctx.engine, ctx.encoder, ctx.scorer, ctx.pad_token_id,
        explore_num_generations=u.explore_num_generations, explore_temperature=u.explore_temperature,
        explore_top_p=u.explore_top_p, explore_logprob_temperature=u.explore_logprob_temperature,
        explore_adv_grouping=u.explore_adv_grouping, hard_pass_rate_max=u.hard_pass_rate_max,
    )

"""FBOS-RL's two-round feedback sampler: initial rollouts from the original prompt, then rollouts from
feedback-augmented prompts (FAP) built from a failed attempt and the verifier's feedback. Registers
``SAMPLERS["feedback"]``; the FAP pieces are :mod:`rlvr.variants.fbos_rl.fap`.

Source: ``docs/fbos_rl.md`` §2.2 (training step, budget parity), §2.3 (trigger), §2.4 (feedback
levels), §2.5 (FAP template), §2.6 (two views of the same tokens) and the implementation notes.

The sampler returns ONE :class:`~rlvr.types.RolloutBatch` with three row kinds (``context_kind``):

=====================  =====================  ===========================  ==================
kind                   sampled from           loss context (context_ids)   view
=====================  =====================  ===========================  ==================
``original``           ``x``                  ``x``                        EPA (on-policy)
``original_offpolicy`` ``c_j`` (the FAP)      ``x``                        EPA (off-policy)
``feedback``           ``c_j``                ``c_j``                      ECC (on-policy)
=====================  =====================  ===========================  ==================

An ``original_offpolicy`` row and its ``feedback`` twin hold the same response ids; only the context
differs. Each prompt *generates* exactly ``num_generations`` sequences (``G1`` initial + ``G2``
feedback-guided or fill); the ``feedback`` rows are a second view of already generated tokens, not
extra generations. EPA rows of prompt ``p`` share ``group_id = first_group_id + p``; ECC rows use
``−(first_group_id + p) − 1`` so the views never mix in group statistics. The sampler scores every
row; the advantages of both views are the batch-level estimator ``fbos``
(:func:`rlvr.variants.fbos_rl.estimator.fbos_advantages`), run by the trainer after reward shaping.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any, Sequence

import torch

from rlvr.core.advantages import zero_std_group_fraction
from rlvr.parts import SAMPLERS, SamplerContext
from rlvr.rewards import ScoreStats
from rlvr.samplers.group import PromptEncoder, generations_to_batch
from rlvr.tasks.base import Problem
from rlvr.tasks.prompts import render_prompt
from rlvr.types import (
    KIND_FEEDBACK,
    KIND_ORIGINAL,
    KIND_ORIGINAL_OFFPOLICY,
    Generation,
    GenerationRequest,
    RolloutBatch,
    SamplingParams,
    is_epa_kind,
)
from rlvr.variants.fbos_rl.config import FBOSConfig
from rlvr.variants.fbos_rl.fap import (
    _load_fn,
    _Request,
    _SecondRound,
    build_fap_text,
    ecc_group_id,
    feedback_for_level,
    round_robin_parents,
)

__all__ = ["FeedbackSampler", "make_feedback_sampler"]


class FeedbackSampler:
    """Two-round sampler of FBOS-RL producing the EPA and ECC views in one batch.

    Args:
        engine: generation backend (:class:`rlvr.engines.base.Engine`).
        encoder: renders original prompts (its ``system_prompt`` is reused in FAPs).
        scorer: fills rewards / correct / feedback / texts (:class:`rlvr.rewards.Scorer`).
        tokenizer: for decoding attempts and tokenizing FAPs.
        pad_token_id: right-padding id.
        fbos: the ``fbos.*`` section (:class:`rlvr.variants.fbos_rl.config.FBOSConfig`).
        max_prompt_length: the run's prompt cap, used for the default FAP cap.

    ``fbos.feedback_level=gt_hint`` is accepted with a ``UserWarning`` (it leaks the label).

    ``view_only_kinds`` tells the trainer which rows repeat tokens another row holds (the ``feedback``
    view of an ``original_offpolicy`` row), so its generic ``reward/*`` and ``completions/*`` count each
    generated sequence once.

    Raises:
        ImportError / AttributeError: ``fbos.feedback_fn`` names a module or function that does not exist.
    """

    view_only_kinds: tuple[str, ...] = (KIND_FEEDBACK,)

    def __init__(
        self,
        engine: Any,
        encoder: PromptEncoder,
        scorer: Any,
        tokenizer: Any,
        pad_token_id: int,
        fbos: Any,
        *,
        max_prompt_length: int = 512,
    ) -> None:
        self.engine = engine
        self.encoder = encoder
        self.scorer = scorer
        self.tokenizer = tokenizer
        self.pad_token_id = pad_token_id
        self.cfg = fbos
        self.fap_cap = fbos.fap_max_prompt_length or (max_prompt_length + fbos.prev_attempt_max_tokens + 256)
        self.meta_ref = [re.compile(p, re.I) for p in fbos.meta_ref_patterns]
        self.feedback_fn = _load_fn(fbos.feedback_fn) if fbos.feedback_fn else None
        self.fap_truncated_total = 0
        if fbos.feedback_level == "gt_hint":
            warnings.warn(
                "fbos.feedback_level=gt_hint reveals the reference answer in the FAP (ablation only: it "
                "leaks the label into training)",
                stacklevel=2,
            )

    # ----------------------------------------------------------------------------- pieces
    def split(self, num_generations: int) -> tuple[int, int]:
        """``(G1, G2)`` for ``num_generations`` G.

        Raises:
            ValueError: ``G1`` not in ``[1, G − 1]``.
        """
        g1 = self.cfg.initial_rollouts if self.cfg.initial_rollouts is not None else num_generations // 2
        if not 1 <= g1 < num_generations:
            raise ValueError(
                f"fbos.initial_rollouts={g1} must be in [1, num_generations − 1] = [1, {num_generations - 1}] "
                "(G2 = num_generations − G1 feedback-guided rollouts must be ≥ 1)"
            )
        return g1, num_generations - g1

    def triggered(self, num_failed: int, g1: int) -> bool:
        """Whether a prompt with ``num_failed`` of ``g1`` failed initial rollouts gets FAP rollouts.

        Source: docs/fbos_rl.md §2.3 (all-fail prompts always; ``any_fail``: any failure).
        """
        if num_failed == g1:
            return True
        return self.cfg.trigger == "any_fail" and num_failed > 0

    def feedback_text(self, problem: Problem, completion: str, verdict_feedback: str | None) -> str | None:
        """The feedback shown in a FAP (``fbos.feedback_fn`` if set, else :func:`feedback_for_level`)."""
        if self.cfg.feedback_level == "none":
            return None
        if self.feedback_fn is not None:
            return str(self.feedback_fn(problem.question, completion, problem.answer))
        return feedback_for_level(self.cfg.feedback_level, verdict_feedback, answer=problem.answer)

    def fap_ids(self, problem: Problem, attempt_ids: Sequence[int], feedback: str | None) -> tuple[list[int], bool]:
        """Token ids of the rendered FAP for one failed attempt, and whether it had to be cut.

        The attempt keeps its last ``fbos.prev_attempt_max_tokens`` tokens; if the rendered FAP is
        still longer than ``fbos.fap_max_prompt_length``, the attempt is shortened by the overflow;
        if even an empty attempt does not fit, the FAP keeps its last ``fap_max_prompt_length``
        tokens (counted in ``fbos/fap_truncated``).
        """
        keep = list(attempt_ids)[-self.cfg.prev_attempt_max_tokens :]
        cut = False
        for _ in range(4):
            attempt = self.tokenizer.decode(keep, skip_special_tokens=True)
            text = build_fap_text(problem.question, attempt, feedback, self.cfg.fap_template)
            messages = []
            if self.encoder.system_prompt:
                messages.append({"role": "system", "content": self.encoder.system_prompt})
            messages.append({"role": "user", "content": text})
            ids = self.tokenizer(render_prompt(self.tokenizer, messages), add_special_tokens=False)["input_ids"]
            over = len(ids) - self.fap_cap
            if over <= 0:
                return ids, cut
            cut = True
            if not keep:
                break
            keep = keep[min(over, len(keep)) :]
        return ids[-self.fap_cap :], True

    # ----------------------------------------------------------------------------- sampling
    def sample(
        self,
        problems: Sequence[Problem],
        num_generations: int,
        params: SamplingParams,
        *,
        policy_version: int = 0,
        first_group_id: int = 0,
    ) -> RolloutBatch:
        """Two rounds for ``len(problems)`` prompts, ``num_generations`` generated sequences each.

        Returns:
            A scored batch with ``context_kind`` per row, ``fbos_parent_row`` (the row of each
            feedback-guided row's failed parent attempt, −1 for the others; read by the ``fbos``
            advantage estimator) and ``metrics`` holding the ``fbos/*`` sampler metrics of spec §4.
            No advantages: ``rlvr.parts.ADV_ESTIMATORS["fbos"]`` computes them after reward shaping.

        Raises:
            ValueError: bad ``G1`` (see :meth:`split`).
            RuntimeError: the engine returned the wrong number of generations.
        """
        g1, g2 = self.split(num_generations)
        problems = list(problems)
        ctx_x = [self.encoder(p) for p in problems]
        b1, gens1, s1 = self._initial_round(problems, ctx_x, g1, params, policy_version, first_group_id)
        plan = self._plan_second_round(problems, ctx_x, b1, g1, g2)
        b2, gens2, s2 = self._second_round(problems, plan, params, policy_version, first_group_id)
        rows, meta_ref = self._rows(ctx_x, (b1, gens1), (b2, gens2), plan, g1, first_group_id)
        batch = generations_to_batch(
            [r.context for r in rows], [r.generation for r in rows], group_ids=[r.group_id for r in rows],
            prompt_index=[r.prompt for r in rows], problems=problems, pad_token_id=self.pad_token_id,
            temperature=params.temperature, policy_version=policy_version,
        )
        batch.context_kind = [r.kind for r in rows]
        batch.rewards = torch.tensor([r.reward for r in rows], dtype=torch.float32)
        batch.correct = torch.tensor([r.correct for r in rows], dtype=torch.bool)
        batch.feedback = [r.feedback for r in rows]
        batch.texts = [r.text for r in rows]
        batch.reward_components[getattr(self.scorer.task, "name", "task")] = batch.rewards.clone()
        batch.variable_group_sizes = True
        batch.fbos_parent_row = [r.parent for r in rows]
        batch.metrics = self._metrics(batch, b1, b2, plan, meta_ref, g1, s1.errors + s2.errors)
        return batch

    def _initial_round(
        self, problems: list[Problem], ctx_x: list[list[int]], g1: int, params: SamplingParams,
        policy_version: int, first_group_id: int,
    ) -> tuple[RolloutBatch, list[Generation], ScoreStats]:
        """Round 1: ``G1`` rollouts per prompt from ``x``, scored."""
        P = len(problems)
        out1 = self.engine.generate([GenerationRequest(context_ids=c, n=g1) for c in ctx_x], params)
        gens1: list[Generation] = []
        for p, gens in enumerate(out1):
            if len(gens) != g1:
                raise RuntimeError(f"engine returned {len(gens)} generations for prompt {p}, expected {g1}")
            gens1.extend(gens)
        b1 = generations_to_batch(
            [ctx_x[i // g1] for i in range(P * g1)], gens1, group_ids=[first_group_id + i // g1 for i in range(P * g1)],
            prompt_index=[i // g1 for i in range(P * g1)], problems=problems, pad_token_id=self.pad_token_id,
            temperature=params.temperature, policy_version=policy_version,
        )
        return b1, gens1, self.scorer.score(b1)

    def _plan_second_round(
        self, problems: list[Problem], ctx_x: list[list[int]], b1: RolloutBatch, g1: int, g2: int
    ) -> "_SecondRound":
        """Round 2 requests: FAP children (round-robin over a triggered prompt's failed parents) or a plain
        fill from ``x`` (``fbos.fill_mode=plain``)."""
        plan = _SecondRound(triggered=[False] * len(problems))
        for p in range(len(problems)):
            failed = [i for i in range(p * g1, (p + 1) * g1) if not bool(b1.correct[i])]
            if self.triggered(len(failed), g1):
                plan.triggered[p] = True
                parents = round_robin_parents(failed, g2)
                for parent in dict.fromkeys(parents):
                    k = int(b1.completion_lengths[parent])
                    fb = self.feedback_text(problems[p], b1.texts[parent], b1.feedback[parent])
                    ids, cut = self.fap_ids(problems[p], b1.completion_ids[parent, :k].tolist(), fb)
                    plan.fap_prompt_tokens += len(ids)
                    plan.fap_truncated += int(cut)
                    plan.requests.append(GenerationRequest(context_ids=ids, n=parents.count(parent)))
                    plan.info.append(_Request(p, "fap", parent, ids))
            elif self.cfg.fill_mode == "plain":
                plan.requests.append(GenerationRequest(context_ids=ctx_x[p], n=g2))
                plan.info.append(_Request(p, "fill", None, ctx_x[p]))
        self.fap_truncated_total += plan.fap_truncated
        return plan

    def _second_round(
        self, problems: list[Problem], plan: "_SecondRound", params: SamplingParams, policy_version: int,
        first_group_id: int,
    ) -> tuple[RolloutBatch | None, list[Generation], ScoreStats]:
        """Round 2: generate the planned requests (seed + 1) and score them; fills ``plan.rows``."""
        if not plan.requests:
            return None, [], ScoreStats()
        params2 = dataclasses.replace(params, seed=None if params.seed is None else params.seed + 1)
        gens2: list[Generation] = []
        for req, inf, gens in zip(plan.requests, plan.info, self.engine.generate(plan.requests, params2)):
            if len(gens) != req.n:
                raise RuntimeError(f"engine returned {len(gens)} generations for a FAP request, expected {req.n}")
            gens2.extend(gens)
            plan.rows.extend([inf] * len(gens))
        if not gens2:
            return None, [], ScoreStats()
        b2 = generations_to_batch(
            [inf.context for inf in plan.rows], gens2, group_ids=[first_group_id + inf.prompt for inf in plan.rows],
            prompt_index=[inf.prompt for inf in plan.rows], problems=problems, pad_token_id=self.pad_token_id,
            temperature=params.temperature, policy_version=policy_version,
        )
        return b2, gens2, self.scorer.score(b2)

    def _rows(
        self, ctx_x: list[list[int]], round1: tuple[RolloutBatch, list[Generation]],
        round2: tuple[RolloutBatch | None, list[Generation]], plan: "_SecondRound", g1: int, first_group_id: int,
    ) -> tuple[list["_Row"], list[bool]]:
        """The rows of both views: initial and fill rows (``original``), then each FAP rollout's EPA view
        (``original_offpolicy``, with ``fbos.epa_group=union`` unless filtered as meta-referencing), then
        every FAP rollout's ECC view (``feedback``). Returns the rows and the meta-reference flag per
        round-2 rollout."""
        cfg = self.cfg
        (b1, gens1), (b2, gens2) = round1, round2
        texts2 = b2.texts if b2 is not None else []
        meta_ref = [any(r.search(t) for r in self.meta_ref) for t in texts2]

        def row(b: RolloutBatch, i: int, ctx: list[int], gid: int, p: int, kind: str, parent: int) -> _Row:
            return _Row((gens1 if b is b1 else gens2)[i], ctx, gid, p, kind, float(b.rewards[i]), bool(b.correct[i]),
                        b.feedback[i], b.texts[i], parent)

        rows = [row(b1, i, ctx_x[i // g1], first_group_id + i // g1, i // g1, KIND_ORIGINAL, -1)
                for i in range(len(b1))]
        ecc_rows: list[_Row] = []
        for j, inf in enumerate(plan.rows):
            assert b2 is not None
            p = inf.prompt
            if inf.what == "fill":
                rows.append(row(b2, j, ctx_x[p], first_group_id + p, p, KIND_ORIGINAL, -1))
                continue
            assert inf.parent is not None
            if cfg.epa_group == "union" and not (cfg.epa_filter_meta_refs and meta_ref[j]):
                rows.append(row(b2, j, ctx_x[p], first_group_id + p, p, KIND_ORIGINAL_OFFPOLICY, inf.parent))
            ecc_rows.append(row(b2, j, inf.context, ecc_group_id(first_group_id + p), p, KIND_FEEDBACK, inf.parent))
        return rows + ecc_rows, meta_ref

    def _metrics(
        self, batch: RolloutBatch, b1: RolloutBatch, b2: RolloutBatch | None, plan: "_SecondRound",
        meta_ref: list[bool], g1: int, verifier_errors: int,
    ) -> dict[str, float]:
        """The ``fbos/*`` sampler metrics of spec §4."""
        P = len(plan.triggered)
        fap_idx = plan.fap_rows(b2)
        fill_idx = [j for j, inf in enumerate(plan.rows) if inf.what == "fill"]
        fap_ok = [bool(b2.correct[j]) for j in fap_idx] if b2 is not None else []
        rescued = 0
        for p in range(P):
            init_ok = bool(b1.correct[p * g1 : (p + 1) * g1].any())
            if not init_ok and any(bool(b2.correct[j]) for j in fap_idx if plan.rows[j].prompt == p):
                rescued += 1
        epa_mask = torch.tensor([is_epa_kind(k) for k in batch.context_kind], dtype=torch.bool)
        epa_r, epa_g = batch.rewards[epa_mask], batch.group_id[epa_mask]
        gen_per_prompt = [g1 + sum(1 for inf in plan.rows if inf.prompt == p) for p in range(P)]
        lens2 = b2.completion_lengths if b2 is not None else torch.zeros(0, dtype=torch.long)
        on_x = [float(b1.rewards[i]) for i in range(P * g1)] + [float(b2.rewards[j]) for j in fill_idx]
        return {
            "fbos/triggered_frac": sum(plan.triggered) / max(P, 1),
            "fbos/rescued_frac": rescued / max(P, 1),
            "fbos/fap_success_rate": sum(fap_ok) / len(fap_ok) if fap_ok else 0.0,
            "fbos/num_fap_rollouts": float(len(fap_idx)),
            "fbos/zero_adv_frac_before": zero_std_group_fraction(b1.rewards, b1.group_id),
            "fbos/zero_adv_frac_after": zero_std_group_fraction(epa_r, epa_g) if epa_r.numel() else 1.0,
            "fbos/meta_ref_frac": sum(meta_ref[j] for j in fap_idx) / len(fap_idx) if fap_idx else 0.0,
            "fbos/tokens_generated/initial": float(b1.completion_mask.sum()),
            "fbos/tokens_generated/feedback": float(sum(int(lens2[j]) for j in fap_idx)),
            "fbos/tokens_generated/fill": float(sum(int(lens2[j]) for j in fill_idx)),
            "fbos/fap_prompt_tokens": float(plan.fap_prompt_tokens),
            "fbos/fap_truncated": float(plan.fap_truncated),
            "fbos/sequences_per_prompt": sum(gen_per_prompt) / max(P, 1),
            "fbos/sequences_per_prompt_min": float(min(gen_per_prompt) if gen_per_prompt else 0),
            "fbos/pass_rate_initial": float(b1.correct.float().mean()) if len(b1) else 0.0,
            "fbos/reward_x_mean": sum(on_x) / len(on_x) if on_x else 0.0,
            "fbos/verifier_errors": float(verifier_errors),
        }


@dataclasses.dataclass(frozen=True)
class _Row:
    """One row of the returned batch, before packing: the generation, its loss context, group, prompt,
    context kind, verifier result and the batch row of its failed parent attempt (−1 if none)."""

    generation: Generation
    context: list[int]
    group_id: int
    prompt: int
    kind: str
    reward: float
    correct: bool
    feedback: str | None
    text: str
    parent: int


@SAMPLERS.register("feedback", config=FBOSConfig, section="fbos")
def make_feedback_sampler(ctx: SamplerContext) -> FeedbackSampler:
    """``SAMPLERS["feedback"]``: a :class:`FeedbackSampler` wired from the run config (checked by
    (:func:`rlvr.variants.fbos_rl.estimator.check_fbos` beforehand)."""
    cfg = ctx.cfg
    return FeedbackSampler(
        ctx.engine, ctx.encoder, ctx.scorer, ctx.tokenizer, ctx.pad_token_id, cfg.fbos,
        max_prompt_length=cfg.max_prompt_length,
    )

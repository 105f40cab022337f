"""FBOS-RL's two-round feedback sampler: initial rollouts from the original prompt, then rollouts from
feedback-augmented prompts (FAP) built from a failed attempt and the verifier's feedback.

Source: ``specs/fbos_rl.md`` §2.2 (training step, budget parity), §2.3 (trigger), §2.4 (feedback
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
row and sets the advantages of both views (the trainer keeps them).
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import warnings
from typing import Any, Callable, Sequence

import torch

from rlvr.core.advantages import zero_std_group_fraction
from rlvr.core.fbos import ecc_advantages, view_advantages
from rlvr.rewards import ScoreStats
from rlvr.samplers.group import PromptEncoder, generations_to_batch
from rlvr.tasks.base import Problem
from rlvr.tasks.prompts import render_prompt
from rlvr.types import Generation, GenerationRequest, RolloutBatch, SamplingParams

__all__ = [
    "DEFAULT_FAP_TEMPLATE",
    "FEEDBACK_BLOCK",
    "KIND_FEEDBACK",
    "KIND_ORIGINAL",
    "KIND_ORIGINAL_OFFPOLICY",
    "FeedbackSampler",
    "build_fap_text",
    "ecc_group_id",
    "feedback_for_level",
    "is_epa_kind",
    "round_robin_parents",
]

KIND_ORIGINAL = "original"
"""Sampled from the original prompt ``x`` and scored under it (initial and fill rollouts)."""
KIND_ORIGINAL_OFFPOLICY = "original_offpolicy"
"""Sampled from a FAP ``c_j``, scored under ``x``: the EPA view of a feedback-guided rollout."""
KIND_FEEDBACK = "feedback"
"""Sampled from a FAP ``c_j`` and scored under it: the ECC view of a feedback-guided rollout."""

FEEDBACK_BLOCK = "\nFeedback from the automatic checker:\n{feedback}\n"
"""The feedback block of the FAP (left out at ``fbos.feedback_level=none``)."""

DEFAULT_FAP_TEMPLATE = (
    "{problem}\n"
    "\n"
    "Here is a previous attempt at this problem:\n"
    "<previous_attempt>\n"
    "{attempt}\n"
    "</previous_attempt>\n"
    "{feedback_block}"
    "\n"
    "Solve the problem again from the beginning. Write a complete, self-contained solution that does not\n"
    "mention the previous attempt or the feedback, and put the final answer in \\boxed{}."
)
"""The FAP user turn of ``specs/fbos_rl.md`` §2.5 (interpretation; placeholders are replaced
literally, so ``\\boxed{}`` needs no escaping)."""

_ANSWER_WRONG = [
    re.compile(r"\s*Your final answer `.*?` is incorrect\.", re.S),
    re.compile(r", and it is incorrect(?=\.)"),
]
_FORMAT_OK = "The answer format is correct, but the attempt did not solve the problem."
_GENERIC_WRONG = "The final answer is incorrect."


def is_epa_kind(kind: str | None) -> bool:
    """True for rows of the EPA view (``original`` and ``original_offpolicy``; ``None`` counts as
    ``original``)."""
    return kind is None or kind in (KIND_ORIGINAL, KIND_ORIGINAL_OFFPOLICY)


def ecc_group_id(epa_group_id: int) -> int:
    """The ECC group id of a prompt whose EPA group id is ``epa_group_id`` (``−id − 1``: never equal
    to a non-negative EPA id)."""
    return -int(epa_group_id) - 1


def round_robin_parents(failed: Sequence[int], slots: int) -> list[int]:
    """Parent of each FAP slot: slot ``j`` takes ``failed[j mod k]`` (each failure gets about
    ``slots / k`` children).

    Raises:
        ValueError: no failed attempt, or ``slots < 0``.

    Source: specs/fbos_rl.md §2.3 (``fbos.parent_assignment=round_robin``).
    """
    if not failed:
        raise ValueError("round_robin_parents: needs at least one failed attempt")
    if slots < 0:
        raise ValueError(f"round_robin_parents: slots must be >= 0, got {slots}")
    return [failed[j % len(failed)] for j in range(slots)]


def feedback_for_level(
    level: str, feedback: str | None, *, answer: str | None = None
) -> str | None:
    """The feedback text shown in a FAP at ``fbos.feedback_level``.

    * ``none``: ``None`` (the FAP has no feedback block);
    * ``format``: only the format messages of the task's feedback (the "your final answer ``X`` is
      incorrect" part removed); when nothing remains, a sentence that says only that the attempt
      failed (known anyway: every parent is a failure);
    * ``answer_wrong`` (default): the task's feedback as is (``"The final answer is incorrect."`` when
      the verifier gave none, e.g. a reward function that returned only a score);
    * ``gt_hint`` (ablation only): ``answer_wrong`` plus ``The correct final answer is `a*`.`` — it
      leaks the label.

    Args:
        level: one of ``none``, ``format``, ``answer_wrong``, ``gt_hint``.
        feedback: the verdict's feedback text (``Verdict.feedback``), or ``None``.
        answer: the reference answer (used only by ``gt_hint``).

    Raises:
        ValueError: unknown level.

    Source: specs/fbos_rl.md §2.4 (interpretation); messages from :mod:`rlvr.tasks.feedback`.
    """
    if level == "none":
        return None
    text = (feedback or "").strip() or _GENERIC_WRONG
    if level == "answer_wrong":
        return text
    if level == "format":
        out = text
        for pat in _ANSWER_WRONG:
            out = pat.sub("", out)
        out = out.strip()
        return out or _FORMAT_OK
    if level == "gt_hint":
        return f"{text} The correct final answer is `{answer}`." if answer is not None else text
    raise ValueError(f"feedback_for_level: level must be none, format, answer_wrong or gt_hint, got {level!r}")


def build_fap_text(problem: str, attempt: str, feedback: str | None, template: str | None = None) -> str:
    """The FAP user turn: ``template`` with ``{problem}``, ``{attempt}`` and ``{feedback_block}`` replaced.

    Args:
        problem: the original problem text, exactly as in the base prompt's user turn.
        attempt: the failed attempt (already truncated to its last ``prev_attempt_max_tokens`` tokens).
        feedback: feedback text, or ``None`` for no feedback block (``feedback_level=none``).
        template: ``None`` = :data:`DEFAULT_FAP_TEMPLATE`; ``{feedback}`` alone is also accepted.

    Returns:
        The user-turn string (the chat template wraps it later).

    Source: specs/fbos_rl.md §2.5 (shape: problem, previous attempt, feedback, instruction).
    """
    t = DEFAULT_FAP_TEMPLATE if template is None else template
    block = "" if feedback is None else FEEDBACK_BLOCK.replace("{feedback}", feedback)
    out = t.replace("{problem}", problem).replace("{attempt}", attempt)
    out = out.replace("{feedback_block}", block).replace("{feedback}", feedback or "")
    return out


def _load_fn(spec: str) -> Callable[..., str]:
    mod, _, name = spec.partition(":")
    return getattr(importlib.import_module(mod), name)


class FeedbackSampler:
    """Two-round sampler of FBOS-RL producing the EPA and ECC views in one batch.

    Args:
        engine: generation backend (:class:`rlvr.engines.base.Engine`).
        encoder: renders original prompts (its ``system_prompt`` is reused in FAPs).
        scorer: fills rewards / correct / feedback / texts (:class:`rlvr.rewards.Scorer`).
        tokenizer: for decoding attempts and tokenizing FAPs.
        pad_token_id: right-padding id.
        fbos: the ``fbos.*`` sub-config (:class:`rlvr.config.FBOSConfig`).
        adv_kwargs: ``scale_rewards``, ``adv_eps``, ``std_unbiased`` of the core GRPO estimator.
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
        adv_kwargs: dict[str, Any] | None = None,
        max_prompt_length: int = 512,
    ) -> None:
        self.engine = engine
        self.encoder = encoder
        self.scorer = scorer
        self.tokenizer = tokenizer
        self.pad_token_id = pad_token_id
        self.cfg = fbos
        self.adv_kwargs = dict(adv_kwargs or {})
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

        Source: specs/fbos_rl.md §2.3 (all-fail prompts always; ``any_fail``: any failure).
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
            A scored batch with ``context_kind`` per row, EPA and ECC advantages set and
            ``meta["metrics"]`` holding the ``fbos/*`` sampler metrics of spec §4.

        Raises:
            ValueError: bad ``G1`` (see :meth:`split`).
            RuntimeError: the engine returned the wrong number of generations.
        """
        cfg = self.cfg
        g1, g2 = self.split(num_generations)
        P = len(problems)
        problems = list(problems)
        ctx_x = [self.encoder(p) for p in problems]

        # ---- round 1: G1 rollouts from x
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
        s1 = self.scorer.score(b1)

        # ---- plan round 2: FAP children (round-robin over failed parents) or plain fill
        requests: list[GenerationRequest] = []
        req_info: list[tuple[int, str, int | None, list[int]]] = []  # (prompt, kind, parent row, context)
        triggered = [False] * P
        fap_prompt_tokens, fap_truncated = 0, 0
        for p in range(P):
            rows = list(range(p * g1, (p + 1) * g1))
            failed = [i for i in rows if not bool(b1.correct[i])]
            if self.triggered(len(failed), g1):
                triggered[p] = True
                parents = round_robin_parents(failed, g2)
                for parent in dict.fromkeys(parents):
                    n = parents.count(parent)
                    k = int(b1.completion_lengths[parent])
                    fb = self.feedback_text(problems[p], b1.texts[parent], b1.feedback[parent])
                    ids, cut = self.fap_ids(problems[p], b1.completion_ids[parent, :k].tolist(), fb)
                    fap_prompt_tokens += len(ids)
                    fap_truncated += int(cut)
                    requests.append(GenerationRequest(context_ids=ids, n=n))
                    req_info.append((p, "fap", parent, ids))
            elif cfg.fill_mode == "plain":
                requests.append(GenerationRequest(context_ids=ctx_x[p], n=g2))
                req_info.append((p, "fill", None, ctx_x[p]))
        self.fap_truncated_total += fap_truncated

        # ---- round 2
        gens2: list[Generation] = []
        info2: list[tuple[int, str, int | None, list[int]]] = []
        if requests:
            params2 = dataclasses.replace(params, seed=None if params.seed is None else params.seed + 1)
            out2 = self.engine.generate(requests, params2)
            for req, inf, gens in zip(requests, req_info, out2):
                if len(gens) != req.n:
                    raise RuntimeError(f"engine returned {len(gens)} generations for a FAP request, expected {req.n}")
                for g in gens:
                    gens2.append(g)
                    info2.append(inf)
        s2 = ScoreStats()
        b2 = None
        if gens2:
            b2 = generations_to_batch(
                [inf[3] for inf in info2], gens2, group_ids=[first_group_id + inf[0] for inf in info2],
                prompt_index=[inf[0] for inf in info2], problems=problems, pad_token_id=self.pad_token_id,
                temperature=params.temperature, policy_version=policy_version,
            )
            s2 = self.scorer.score(b2)

        # ---- assemble the rows of both views
        texts2 = b2.texts if b2 is not None else []
        meta_ref = [any(r.search(t) for r in self.meta_ref) for t in texts2]
        # (generation, context, group, prompt, kind, reward, correct, feedback, text, parent reward)
        rows: list[tuple] = []
        for i, g in enumerate(gens1):
            p = i // g1
            rows.append((g, ctx_x[p], first_group_id + p, p, KIND_ORIGINAL, float(b1.rewards[i]),
                         bool(b1.correct[i]), b1.feedback[i], b1.texts[i], 0.0))
        ecc_rows: list[tuple] = []
        for j, (g, inf) in enumerate(zip(gens2, info2)):
            p, what, parent, ctx = inf
            assert b2 is not None
            r, c, f, t = float(b2.rewards[j]), bool(b2.correct[j]), b2.feedback[j], b2.texts[j]
            if what == "fill":
                rows.append((g, ctx_x[p], first_group_id + p, p, KIND_ORIGINAL, r, c, f, t, 0.0))
                continue
            pr = float(b1.rewards[parent])
            if cfg.epa_group == "union" and not (cfg.epa_filter_meta_refs and meta_ref[j]):
                rows.append((g, ctx_x[p], first_group_id + p, p, KIND_ORIGINAL_OFFPOLICY, r, c, f, t, pr))
            ecc_rows.append((g, ctx, ecc_group_id(first_group_id + p), p, KIND_FEEDBACK, r, c, f, t, pr))
        rows.extend(ecc_rows)

        batch = generations_to_batch(
            [r[1] for r in rows], [r[0] for r in rows], group_ids=[r[2] for r in rows],
            prompt_index=[r[3] for r in rows], problems=problems, pad_token_id=self.pad_token_id,
            temperature=params.temperature, policy_version=policy_version,
        )
        kinds = [r[4] for r in rows]
        batch.context_kind = kinds
        batch.rewards = torch.tensor([r[5] for r in rows], dtype=torch.float32)
        batch.correct = torch.tensor([r[6] for r in rows], dtype=torch.bool)
        batch.feedback = [r[7] for r in rows]
        batch.texts = [r[8] for r in rows]
        batch.reward_components[getattr(self.scorer.task, "name", "task")] = batch.rewards.clone()

        # ---- advantages: EPA on the union (or initial-only) group, ECC on the feedback-guided group
        is_epa = torch.tensor([is_epa_kind(k) for k in kinds], dtype=torch.bool)
        is_ecc = ~is_epa
        adv = view_advantages(batch.rewards, batch.group_id, is_epa, **self.adv_kwargs)
        adv_ecc = ecc_advantages(
            batch.rewards, batch.group_id, is_ecc, baseline=cfg.ecc_baseline,
            parent_rewards=torch.tensor([r[9] for r in rows], dtype=torch.float32), **self.adv_kwargs,
        )
        batch.advantages = torch.where(is_ecc, adv_ecc, adv)
        if cfg.epa_fb_positive_only:
            off = torch.tensor([k == KIND_ORIGINAL_OFFPOLICY for k in kinds])
            keep = ~(off & (batch.advantages < 0))
            batch = batch.select(keep.nonzero(as_tuple=True)[0])
            kinds = batch.context_kind
        batch.meta["variable_group_sizes"] = True

        # ---- metrics (spec §4)
        init_r = b1.rewards
        init_gid = b1.group_id
        fap_idx = [j for j, inf in enumerate(info2) if inf[1] == "fap"]
        fill_idx = [j for j, inf in enumerate(info2) if inf[1] == "fill"]
        fap_ok = [bool(b2.correct[j]) for j in fap_idx] if b2 is not None else []
        rescued = 0
        for p in range(P):
            init_ok = bool(b1.correct[p * g1 : (p + 1) * g1].any())
            if not init_ok and any(bool(b2.correct[j]) for j in fap_idx if info2[j][0] == p):
                rescued += 1
        epa_mask = torch.tensor([is_epa_kind(k) for k in kinds], dtype=torch.bool)
        epa_r, epa_g = batch.rewards[epa_mask], batch.group_id[epa_mask]
        gen_per_prompt = [g1 + sum(1 for inf in info2 if inf[0] == p) for p in range(P)]
        lens2 = b2.completion_lengths if b2 is not None else torch.zeros(0, dtype=torch.long)
        on_x = [float(b1.rewards[i]) for i in range(P * g1)] + [float(b2.rewards[j]) for j in fill_idx]
        metrics = {
            "fbos/triggered_frac": sum(triggered) / max(P, 1),
            "fbos/rescued_frac": rescued / max(P, 1),
            "fbos/fap_success_rate": sum(fap_ok) / len(fap_ok) if fap_ok else 0.0,
            "fbos/num_fap_rollouts": float(len(fap_idx)),
            "fbos/zero_adv_frac_before": zero_std_group_fraction(init_r, init_gid),
            "fbos/zero_adv_frac_after": zero_std_group_fraction(epa_r, epa_g) if epa_r.numel() else 1.0,
            "fbos/meta_ref_frac": sum(meta_ref[j] for j in fap_idx) / len(fap_idx) if fap_idx else 0.0,
            "fbos/tokens_generated/initial": float(b1.completion_mask.sum()),
            "fbos/tokens_generated/feedback": float(sum(int(lens2[j]) for j in fap_idx)),
            "fbos/tokens_generated/fill": float(sum(int(lens2[j]) for j in fill_idx)),
            "fbos/fap_prompt_tokens": float(fap_prompt_tokens),
            "fbos/fap_truncated": float(fap_truncated),
            "fbos/sequences_per_prompt": sum(gen_per_prompt) / max(P, 1),
            "fbos/sequences_per_prompt_min": float(min(gen_per_prompt) if gen_per_prompt else 0),
            "fbos/pass_rate_initial": float(b1.correct.float().mean()) if len(b1) else 0.0,
            "fbos/reward_x_mean": sum(on_x) / len(on_x) if on_x else 0.0,
            "fbos/verifier_errors": float(s1.errors + s2.errors),
        }
        batch.meta["metrics"] = metrics
        batch.meta["fbos"] = {"G1": g1, "G2": g2, "triggered": triggered, "fap_requests": len(fap_idx)}
        return batch

"""The few data types that travel between rlvr's layers.

One batch type (:class:`RolloutBatch`) serves every algorithm: variants add optional fields
(per-token advantages, token weights, context kind) rather than new batch classes.

Shapes use the notation of ``docs/grpo.md`` §1: ``N`` completions, ``T`` the padded
completion length of the batch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

import torch

FinishReason = Literal["eos", "length"]

EPISODE_FINISH_REASONS: tuple[str, ...] = ("eos", "length", "max_turns", "env_done", "error", "timeout")
"""How an environment episode (:mod:`rlvr.envs`) ended, as logged under ``env/finish/<reason>``."""

# ---- context kinds (RolloutBatch.context_kind): set by samplers, read by estimators, filters, schedules
KIND_REGULAR = "regular"
"""A row sampled and scored under the task prompt (hard-prompt sampler's regular rows)."""
KIND_EXPLORE = "explore"
"""A targeted-exploration row on a zero-pass prompt (UEC-RL's hard-prompt sampler)."""
KIND_ORIGINAL = "original"
"""Sampled from the original prompt ``x`` and scored under it (FBOS-RL initial and fill rollouts)."""
KIND_ORIGINAL_OFFPOLICY = "original_offpolicy"
"""Sampled from a feedback-augmented prompt ``c_j``, scored under ``x``: FBOS-RL's EPA view of it."""
KIND_FEEDBACK = "feedback"
"""Sampled from a feedback-augmented prompt ``c_j`` and scored under it: FBOS-RL's ECC view."""


def is_epa_kind(kind: str | None) -> bool:
    """True for rows of FBOS-RL's EPA view (``original`` and ``original_offpolicy``; ``None`` counts as
    ``original``)."""
    return kind is None or kind in (KIND_ORIGINAL, KIND_ORIGINAL_OFFPOLICY)


@dataclass(frozen=True)
class SamplingParams:
    """How an engine samples.

    Attributes:
        temperature: softmax temperature (≥ 0). Logits are divided by it before sampling; 0 means
            greedy decoding (argmax, ties to the lowest token id; see :class:`rlvr.engines.base.Engine`).
        top_p: nucleus mass kept (0 < top_p ≤ 1; 1 disables).
        top_k: number of highest-probability tokens kept (0 disables).
        max_new_tokens: hard cap on generated tokens per sequence (≥ 1).
        seed: optional seed for the engine's private generator; ``None`` uses torch's global RNG.

    Source: standard sampling knobs (TRL/vLLM names).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 128
    seed: int | None = None


@dataclass(frozen=True)
class GenerationRequest:
    """One context to continue, ``n`` times.

    Attributes:
        context_ids: token ids the generation continues from (a rendered prompt, optionally
            followed by an already generated prefix — tree and feedback samplers use this).
        n: number of independent continuations to draw (≥ 1).
        max_new_tokens: this request's own cap on new tokens (≤ the call's
            ``SamplingParams.max_new_tokens``); ``None`` = the call's cap. A row that reaches it stops
            (``finish_reason="length"``) and leaves the batch, so forks at different depths of a tree
            can share one call without decoding past their budget.
    """

    context_ids: Sequence[int]
    n: int = 1
    max_new_tokens: int | None = None


def validate_requests(requests: Sequence[GenerationRequest], params: SamplingParams) -> None:
    """The engine-independent checks of a ``generate`` call's requests (every engine runs them).

    Raises:
        ValueError: a request with empty ``context_ids``, ``n < 1``, or a ``max_new_tokens`` outside
            ``[1, params.max_new_tokens]``; the message names the request's index.
    """
    for i, r in enumerate(requests):
        if len(r.context_ids) == 0:
            raise ValueError(f"request {i}: empty context_ids (give at least one token, e.g. BOS)")
        if r.n < 1:
            raise ValueError(f"request {i}: n must be >= 1, got {r.n}")
        if r.max_new_tokens is not None and not 1 <= r.max_new_tokens <= params.max_new_tokens:
            raise ValueError(f"request {i}: max_new_tokens must be in [1, {params.max_new_tokens}] "
                             f"(SamplingParams.max_new_tokens), got {r.max_new_tokens}")


def validate_sampling(params: SamplingParams) -> None:
    """Check sampling parameters (``temperature == 0`` is valid: greedy decoding); every engine runs it.

    Raises:
        ValueError: ``temperature < 0`` or not finite, ``top_p`` outside ``(0, 1]``, ``top_k < 0`` or
            ``max_new_tokens < 1`` (the message names the field and the value).
    """
    if not (params.temperature >= 0 and math.isfinite(params.temperature)):
        raise ValueError(f"SamplingParams.temperature must be >= 0 (0 = greedy) and finite, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < 0:
        raise ValueError(f"SamplingParams.top_k must be >= 0 (0 disables), got {params.top_k}")
    if params.max_new_tokens < 1:
        raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {params.max_new_tokens}")


@dataclass
class Generation:
    """One sampled continuation.

    Attributes:
        token_ids: the new tokens only (the context is not repeated), including the EOS token
            when ``finish_reason == "eos"``. Length L ≤ ``max_new_tokens``.
        logprobs: ``[L]`` behaviour log-probability (natural log) of each sampled token under the
            distribution it was actually drawn from (temperature applied, top-p/top-k
            renormalised).
        finish_reason: ``"eos"`` if an end-of-sequence token was sampled, else ``"length"``.
        versions: ``[L]`` policy version each token was sampled under, when the weights may change while
            the row decodes (partial rollouts, :mod:`rlvr.engines.partial`); ``None``: one version for
            the whole row (the caller's).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    versions: list[int] | None = None


@dataclass
class RolloutBatch:
    """A batch of ``N`` completions with everything the loss needs.

    Required fields:
        context_ids: ``N`` token-id lists: the context each completion's loss is computed under.
        completion_ids: ``[N, T]`` long, right-padded with ``pad_token_id``.
        completion_mask: ``[N, T]`` float, 1 on generated tokens (up to and including EOS), else 0.
        group_id: ``[N]`` long, explicit group identity (advantages never use batch position).
        prompt_index: ``[N]`` long, index of the source problem in ``problems``.
        is_truncated: ``[N]`` bool, True when no EOS was produced within the token cap.
        sampling_temperature / logprob_temperature: ``[N]`` float.
        policy_version: ``[N]`` long, optimizer-update count of the policy that sampled the row; with
            per-token versions, the OLDEST token's (the row's largest staleness: what drops and the
            ``staleness/*`` metrics read).

    Filled later in the pipeline (``None`` until then):
        rewards: ``[N]`` total reward; ``reward_components``: name → ``[N]`` (NaN where a
        function returned None).
        advantages: ``[N]`` or ``[N, T]``; stored once per generation batch.
        old_logp / ref_logp / sampler_logp: ``[N, T]`` per-token log-probs.
        token_weights: ``[N, T]`` optional weights ``w`` (1 when absent).
        context_kind: ``N`` strings, e.g. ``"original"`` / ``"feedback"`` (FBOS-RL).
        correct: ``[N]`` bool, the verifier's pass/fail for pass-rate metrics.
        texts / feedback: decoded completions and verifier feedback, for logging.
        problems: the source problems (indexed by ``prompt_index``).

    Structure a sampler attaches for its estimator (typed; :meth:`select` and :meth:`concat` keep it
    aligned with the rows):
        tree_index: IB-TPO's trees, one plain dict per tree (:class:`rlvr.variants.ib_tpo.tree_struct.TreeIndex`
            fields); ``rows[i]`` is the batch row of leaf ``paths[i]``.
        fbos_parent_row: ``N`` ints, the row of each feedback-guided row's parent attempt (−1: none).
        variable_group_sizes: groups may differ from ``num_generations`` rows (exploration groups, trees).
        generated_tokens: decode tokens the sampler spent on this batch (a tree row's path shares
            tokens with others); ``None``: the completion tokens.
        metrics: the sampler's, estimator's and filters' scalars for this batch (logged once per round).
        token_version: ``[N, T]`` long or ``None``: the policy version each completion token was sampled
            under (partial rollouts, ``streaming.partial_rollouts``; 0 on padding). ``None``: every token
            of a row is its ``policy_version``'s.
        loss_mask: ``[N, T]`` float or ``None``: 1 on tokens the policy sampled, 0 on environment and
            template tokens inside a multi-turn completion (:mod:`rlvr.envs`). ``None`` (every
            single-turn sampler) means all ones. ``completion_mask`` then spans the whole post-prompt
            sequence (model and environment tokens: what the forward feeds), and every consumer that
            counts or weights tokens reads :attr:`model_mask` instead.
    """

    context_ids: list[list[int]]
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    group_id: torch.Tensor
    prompt_index: torch.Tensor
    is_truncated: torch.Tensor
    sampling_temperature: torch.Tensor
    logprob_temperature: torch.Tensor
    policy_version: torch.Tensor
    rewards: torch.Tensor | None = None
    reward_components: dict[str, torch.Tensor] = field(default_factory=dict)
    advantages: torch.Tensor | None = None
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    sampler_logp: torch.Tensor | None = None
    token_weights: torch.Tensor | None = None
    context_kind: list[str] | None = None
    correct: torch.Tensor | None = None
    texts: list[str] | None = None
    feedback: list[str | None] | None = None
    problems: list[Any] = field(default_factory=list)
    tree_index: list[dict[str, Any]] | None = None
    fbos_parent_row: list[int] | None = None
    variable_group_sizes: bool = False
    generated_tokens: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    loss_mask: torch.Tensor | None = None
    token_version: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.context_ids)

    @property
    def completion_lengths(self) -> torch.Tensor:
        """``[N]`` long: completion tokens per row (the sequence the forward feeds after the context; in a
        multi-turn row this includes environment tokens, see :attr:`model_lengths`)."""
        return self.completion_mask.sum(dim=1).long()

    @property
    def model_mask(self) -> torch.Tensor:
        """``[N, T]``: ``completion_mask ⊙ loss_mask``, 1 on the tokens the policy sampled. The one mask
        every loss, metric and length that counts model tokens reads; without a ``loss_mask`` it is
        ``completion_mask`` itself (the same tensor, so single-turn numbers are bit-identical).

        Source: issue 26 item 3 (verl's ``response_mask``, TRL's ``tool_mask``)."""
        if self.loss_mask is None:
            return self.completion_mask
        return self.completion_mask * self.loss_mask.to(self.completion_mask.dtype)

    @property
    def model_lengths(self) -> torch.Tensor:
        """``[N]`` long: tokens the policy sampled per row (:attr:`model_mask` summed)."""
        return self.model_mask.sum(dim=1).long()

    def generated_rows(self, view_only_kinds: Sequence[str] = ()) -> list[int]:
        """Indices of the rows that hold generated sequences: all rows except those whose
        ``context_kind`` is in ``view_only_kinds`` (a second view of tokens another row holds, e.g.
        FBOS-RL's ``feedback`` rows, declared by the sampler's ``view_only_kinds``)."""
        if not view_only_kinds or self.context_kind is None:
            return list(range(len(self)))
        return [i for i, k in enumerate(self.context_kind) if k not in view_only_kinds]

    def select(self, index: Sequence[int] | torch.Tensor) -> "RolloutBatch":
        """Rows ``index`` (in that order) as a new batch; per-row fields are indexed, ``problems`` is
        shared, ``metrics`` copied; the row references of ``tree_index`` (leaves of unselected rows
        dropped) and ``fbos_parent_row`` (−1 where the parent is not selected) are renumbered;
        ``generated_tokens`` is not known for a part of a batch (``None``).

        The padded width is cut to the longest selected row, so a micro-batch never carries
        padding it does not need.

        Raises:
            IndexError: an index is out of range.
        """
        idx = torch.as_tensor(list(index) if not torch.is_tensor(index) else index, dtype=torch.long)
        n = len(self)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise IndexError(f"RolloutBatch.select: index out of range for a batch of {n} rows")
        rows = idx.tolist()
        width = int(self.completion_mask[idx].sum(dim=1).max().item()) if rows else 0
        width = max(width, 1)
        out: dict[str, Any] = {}
        new_row: dict[int, int] = {}
        for new, old in enumerate(rows):
            new_row.setdefault(old, new)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "metrics":
                out[f.name] = dict(value)
            elif f.name == "variable_group_sizes":
                out[f.name] = value
            elif f.name == "generated_tokens":
                out[f.name] = value if rows == list(range(n)) else None
            elif f.name == "tree_index" and value is not None:
                out[f.name] = _renumber_trees(value, new_row)
            elif f.name == "fbos_parent_row" and value is not None:
                out[f.name] = [new_row.get(value[i], -1) if value[i] >= 0 else -1 for i in rows]
            elif value is None or f.name == "problems":
                out[f.name] = value
            elif f.name == "reward_components":
                out[f.name] = {k: v[idx] for k, v in value.items()}
            elif torch.is_tensor(value):
                v = value[idx]
                if v.dim() == 2 and value.shape[1] == self.completion_mask.shape[1]:
                    v = v[:, :width]
                out[f.name] = v
            else:
                out[f.name] = [value[i] for i in rows]
        return RolloutBatch(**out)

    @staticmethod
    def concat(batches: Sequence["RolloutBatch"], pad_token_id: int) -> "RolloutBatch":
        """Stack batches row-wise, padding ``[N, T]`` fields to the widest.

        ``problems`` are concatenated and ``prompt_index`` is shifted accordingly; group ids
        must already be distinct across batches (the sampler guarantees it). Row references
        (``tree_index`` rows, ``fbos_parent_row``) are shifted by each batch's first row;
        ``variable_group_sizes`` is any batch's, ``generated_tokens`` the sum (``None`` unless every
        batch has it), ``metrics`` the first batch's.

        Raises:
            ValueError: no batches, or one batch has a field set that another lacks.
        """
        if not batches:
            raise ValueError("RolloutBatch.concat needs at least one batch")
        width = max(b.completion_ids.shape[1] for b in batches)
        out: dict[str, Any] = {}
        offsets, total = [], 0
        row_offsets, n_rows = [], 0
        for b in batches:
            offsets.append(total)
            total += len(b.problems)
            row_offsets.append(n_rows)
            n_rows += len(b)
        for f in dataclasses.fields(RolloutBatch):
            values = [getattr(b, f.name) for b in batches]
            if f.name == "problems":
                out[f.name] = [p for b in batches for p in b.problems]
            elif f.name == "metrics":
                out[f.name] = dict(values[0])
            elif f.name == "variable_group_sizes":
                out[f.name] = any(values)
            elif f.name == "generated_tokens":
                out[f.name] = None if any(v is None for v in values) else sum(values)
            elif f.name == "tree_index" and any(v is not None for v in values):
                out[f.name] = [{**e, "rows": [r + off for r in e["rows"]]}
                               for v, off in zip(values, row_offsets) for e in (v or [])]
            elif f.name == "fbos_parent_row" and all(v is not None for v in values):
                out[f.name] = [p + off if p >= 0 else -1 for v, off in zip(values, row_offsets) for p in v]
            elif f.name == "prompt_index":
                out[f.name] = torch.cat([v + off for v, off in zip(values, offsets)])
            elif f.name == "reward_components":
                keys = set().union(*(v.keys() for v in values))
                out[f.name] = {
                    k: torch.cat([v.get(k, torch.full((len(b),), float("nan"))) for v, b in zip(values, batches)])
                    for k in keys
                }
            elif all(v is None for v in values):
                out[f.name] = None
            elif any(v is None for v in values):
                raise ValueError(f"RolloutBatch.concat: field {f.name!r} is set in some batches only")
            elif torch.is_tensor(values[0]):
                if values[0].dim() == 2:
                    fill = pad_token_id if f.name == "completion_ids" else 0
                    values = [_pad_right(v, width, fill) for v in values]
                out[f.name] = torch.cat(values)
            else:
                out[f.name] = [x for v in values for x in v]
        return RolloutBatch(**out)


def _renumber_trees(entries: list[dict[str, Any]], new_row: dict[int, int]) -> list[dict[str, Any]]:
    """Tree index entries of a selection: each entry's leaves (``rows`` and the aligned ``paths``) kept
    where their row is selected, renumbered; entries left without a leaf are dropped."""
    out = []
    for e in entries:
        keep = [i for i, r in enumerate(e["rows"]) if r in new_row]
        if keep:
            out.append({**e, "rows": [new_row[e["rows"][i]] for i in keep], "paths": [e["paths"][i] for i in keep]})
    return out


def _pad_right(x: torch.Tensor, width: int, fill: float) -> torch.Tensor:
    if x.shape[1] >= width:
        return x
    pad = torch.full((x.shape[0], width - x.shape[1]), fill, dtype=x.dtype)
    return torch.cat([x, pad], dim=1)

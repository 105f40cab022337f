"""From prompts to a scored, advantage-carrying generation batch (``grpo_core.md`` §9.2, §10).

The pieces here are schedule-agnostic: the trainer calls :func:`collect_generation_batch` whenever
its schedule asks for fresh rollouts.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from rlvr.core.advantages import group_stats, overlong_penalty
from rlvr.rewards import ScoreStats
from rlvr.util.text import plural
from rlvr.types import RolloutBatch


def nonzero_variance_groups(values: torch.Tensor, group_id: torch.Tensor) -> torch.Tensor:
    """``[N]`` bool: True for rows whose group's ``values`` are not all equal (DAPO dynamic sampling).

    Source: DAPO (Yu et al. 2025) §3.2 — keep groups with 0 < accuracy < 1.
    """
    _, std = group_stats(values.float(), group_id, unbiased=False)
    return std > 0


FILTER_METRICS: tuple[str, ...] = ("acc", "score", "reward")
"""Built-in ``dynamic_sampling.metric`` values (a reward component's name is accepted too)."""


def check_filter_metric(cfg: Any, task: Any) -> None:
    """Refuse, before any model loads, a ``dynamic_sampling.metric`` that :func:`filter_metric` would
    not find: the built-in names, the task's reward component (``task.name``, or the ``rewards:`` entries'
    names) and ``overlong`` (when ``overlong_buffer_len`` is set) are the components a scored batch carries.

    Raises:
        ConfigError: an unknown name with dynamic sampling on (it used to surface as a ``KeyError``
            traceback in the first generation round, after the model had loaded).
    """
    from rlvr.errors import ConfigError

    name = cfg.dynamic_sampling.metric
    if not cfg.dynamic_sampling.enable or name in FILTER_METRICS:
        return
    from rlvr.rewards.combine import component_names

    task_name = getattr(task, "name", "task")
    named = component_names(cfg.rewards, task_name) if getattr(cfg, "rewards", None) else [task_name]
    components = named + (["overlong"] if cfg.overlong_buffer_len else [])
    if name not in components:
        raise ConfigError(
            f"dynamic_sampling.metric={name!r} is neither one of {', '.join(FILTER_METRICS)} nor a reward "
            f"component of this run (have: {', '.join(components)})"
        )


def filter_metric(batch: RolloutBatch, name: str, verifier_score: torch.Tensor) -> torch.Tensor:
    """``[N]`` values whose within-group variance decides which groups dynamic sampling keeps.

    Args:
        batch: a scored batch (after reward shaping).
        name: ``"acc"`` (default): the verifier's pass/fail ``batch.correct`` (its score where a
            sampler set no ``correct``); ``"score"``: the verifier's score before any shaping;
            ``"reward"``: the total reward after shaping (overlong penalty); else the name of a
            reward component.
        verifier_score: ``[N]`` the batch's rewards as scored, before shaping.

    Raises:
        KeyError: ``name`` is neither built in nor a reward component (the message lists both).

    Source: DAPO (Yu et al. 2025) §3.2 keeps groups with ``0 < #correct < G``; verl
    ``algorithm.filter_groups.metric=acc`` (code-precedent). Filtering on the shaped reward instead
    keeps all-wrong groups whose lengths differ, and gives short wrong answers a positive advantage.
    """
    if name == "acc":
        return batch.correct.float() if batch.correct is not None else verifier_score
    if name == "score":
        return verifier_score
    if name == "reward":
        return batch.rewards
    comp = batch.reward_components.get(name)
    if comp is None:
        raise KeyError(
            f"dynamic_sampling.metric={name!r} is neither one of {', '.join(FILTER_METRICS)} nor a reward "
            f"component (have: {', '.join(batch.reward_components) or 'none'})"
        )
    return comp


def shape_rewards(batch: RolloutBatch, cfg: Any) -> None:
    """Add the DAPO soft overlong penalty to ``batch.rewards`` in place when configured (§9.3)."""
    if cfg.overlong_buffer_len:
        pen = overlong_penalty(
            batch.model_lengths, max_completion_length=cfg.max_completion_length,
            buffer_len=cfg.overlong_buffer_len, factor=cfg.overlong_penalty_factor,
        )
        batch.reward_components["overlong"] = pen
        batch.rewards = batch.rewards + pen


@dataclass
class CollectStats:
    """Bookkeeping of one collection (possibly several generation rounds)."""

    rounds: int = 0
    groups_seen: int = 0
    groups_kept: int = 0
    shortfall: int = 0
    score: ScoreStats = field(default_factory=ScoreStats)
    raw_batches: list[RolloutBatch] = field(default_factory=list)


def collect_generation_batch(
    draw: Callable[[int], RolloutBatch],
    score: Callable[[RolloutBatch], ScoreStats],
    cfg: Any,
    *,
    pad_token_id: int,
    carry: list[RolloutBatch] | None = None,
) -> tuple[RolloutBatch, CollectStats, list[RolloutBatch]]:
    """Draw and score rollouts for ``cfg.prompts_per_generation`` prompts.

    Without dynamic sampling this is one round. With ``dynamic_sampling.enable`` it repeats rounds,
    keeping only groups with non-zero variance of the chosen metric (:func:`filter_metric`; by default
    the verifier's accuracy, read before the overlong shaping), until ``P`` groups are kept
    or ``max_num_gen_batches`` rounds are used (0 = unlimited); then ``on_exhausted`` decides
    (``proceed``: train on what was kept; ``error``: raise). Excess groups are dropped or, with
    ``keep_excess``, returned for the next call.

    Args:
        draw: ``k -> RolloutBatch`` sampling ``k`` prompts × G completions with fresh group ids.
        score: fills rewards in place (see :class:`rlvr.rewards.Scorer`).
        carry: groups kept over from the previous call (``keep_excess``).

    Returns:
        (batch, stats, excess) — the batch has shaped rewards but no advantages yet.

    Raises:
        RuntimeError: ``on_exhausted=error`` and too few informative groups were found; the message
            names P, the groups kept and the rounds used.
    """
    P = cfg.prompts_per_generation
    ds = cfg.dynamic_sampling
    stats = CollectStats()
    if not ds.enable:
        batch = draw(P)
        stats.score = score(batch) if batch.rewards is None else ScoreStats()
        shape_rewards(batch, cfg)
        stats.rounds, stats.groups_seen, stats.groups_kept = 1, P, P
        stats.raw_batches = [batch]
        return batch, stats, []
    kept: list[RolloutBatch] = list(carry or [])
    n_kept = sum(len(torch.unique(b.group_id)) for b in kept)
    while n_kept < P and (ds.max_num_gen_batches == 0 or stats.rounds < ds.max_num_gen_batches):
        sub = _informative_groups(draw(P), score, cfg, stats)
        if sub is not None:
            kept.append(sub)
            n_kept += len(torch.unique(sub.group_id))
    if n_kept < P:
        msg = (
            f"dynamic sampling found {plural(n_kept, 'informative group')} of the {plural(P, 'prompt')} wanted after "
            f"{plural(stats.rounds, 'generation round')} (dynamic_sampling.max_num_gen_batches={ds.max_num_gen_batches})"
        )
        if ds.on_exhausted == "error":
            raise RuntimeError(msg)
        warnings.warn(msg + "; training on what was kept", stacklevel=2)
        stats.shortfall = P - n_kept
        if not kept:
            empty = stats.raw_batches[-1]
            return empty.select([]), stats, []
    merged, excess = _first_groups(RolloutBatch.concat(kept, pad_token_id), P, keep_excess=ds.keep_excess)
    stats.groups_kept = min(n_kept, P)
    return merged, stats, excess


def _informative_groups(batch: RolloutBatch, score: Callable[[RolloutBatch], ScoreStats], cfg: Any,
                        stats: CollectStats) -> RolloutBatch | None:
    """One dynamic-sampling round of :func:`collect_generation_batch`: score ``batch`` (unless its sampler
    did), shape its rewards, count the round in ``stats``, and return its groups whose
    ``dynamic_sampling.metric`` varies (:func:`filter_metric`, :func:`nonzero_variance_groups`), or None."""
    s = score(batch) if batch.rewards is None else ScoreStats()
    verifier_score = batch.rewards.clone()
    shape_rewards(batch, cfg)
    stats.rounds += 1
    stats.score.errors += s.errors
    stats.score.calls += s.calls
    stats.score.last_error = s.last_error or stats.score.last_error
    stats.raw_batches.append(batch)
    metric = filter_metric(batch, cfg.dynamic_sampling.metric, verifier_score)
    keep = nonzero_variance_groups(torch.nan_to_num(metric), batch.group_id)
    stats.groups_seen += len(torch.unique(batch.group_id))
    if keep.any():
        return batch.select(keep.nonzero(as_tuple=True)[0])
    return None


def _first_groups(merged: RolloutBatch, P: int, *, keep_excess: bool) -> tuple[RolloutBatch, list[RolloutBatch]]:
    """``(batch, excess)``: the rows of ``merged``'s first ``P`` groups (in order of appearance) and, with
    ``keep_excess``, the other groups' rows as one batch for the next call (else none)."""
    excess: list[RolloutBatch] = []
    gids = list(dict.fromkeys(merged.group_id.tolist()))
    if len(gids) > P:
        keep_ids = set(gids[:P])
        in_keep = torch.tensor([g in keep_ids for g in merged.group_id.tolist()])
        if keep_excess:
            excess = [merged.select((~in_keep).nonzero(as_tuple=True)[0])]
        merged = merged.select(in_keep.nonzero(as_tuple=True)[0])
    return merged, excess

"""Scoring a batch of completions with a task's verifier, robust to reward functions that fail.

A reward function that raises or returns a non-number must not kill a run that has been going for
hours (``specs/peers.md`` complaints 10 and 16): that completion scores 0, a counter increments, and
the run continues — unless ``fatal`` is set.
"""

from __future__ import annotations

import math
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from rlvr.types import RolloutBatch


@dataclass
class ScoreStats:
    """Counters of one scoring pass (summed into the step's metrics).

    Attributes:
        errors: completions whose verifier raised or returned a non-number.
        calls: verifier calls made.
        last_error: the most recent error text (for the log), or None.
    """

    errors: int = 0
    calls: int = 0
    last_error: str | None = None
    error_kinds: dict[str, int] = field(default_factory=dict)


class Scorer:
    """Calls ``task.verify(problem, text)`` for each completion and fills the batch's reward fields.

    Args:
        task: a :class:`rlvr.tasks.Task`.
        tokenizer: decodes completion ids to text (special tokens skipped).
        fatal: re-raise verifier errors instead of scoring 0.

    Fills ``batch.texts``, ``batch.rewards`` ``[N]``, ``batch.correct`` ``[N]`` bool,
    ``batch.feedback`` and ``batch.reward_components["<task name>"]``.
    """

    def __init__(self, task: Any, tokenizer: Any, *, fatal: bool = False) -> None:
        self.task = task
        self.tokenizer = tokenizer
        self.fatal = fatal

    def decode(self, batch: RolloutBatch) -> list[str]:
        """Completion texts ``[N]`` (special tokens and padding removed)."""
        lengths = batch.completion_lengths.tolist()
        ids = [row[:n] for row, n in zip(batch.completion_ids.tolist(), lengths)]
        return self.tokenizer.batch_decode(ids, skip_special_tokens=True)

    def verify_one(self, problem: Any, text: str, stats: ScoreStats) -> tuple[float, bool, str | None]:
        """Score one completion; a failing verifier gives ``(0.0, False, None)`` and is counted."""
        stats.calls += 1
        try:
            verdict = self.task.verify(problem, text)
            score = float(verdict.score)
            if not math.isfinite(score):
                raise ValueError(f"verifier returned a non-finite score {verdict.score!r}")
            return score, bool(verdict.correct), verdict.feedback
        except Exception as exc:  # noqa: BLE001 - a user's reward function may raise anything
            if self.fatal:
                raise
            stats.errors += 1
            kind = type(exc).__name__
            stats.error_kinds[kind] = stats.error_kinds.get(kind, 0) + 1
            stats.last_error = f"{kind}: {exc}"
            if stats.errors == 1:
                warnings.warn(
                    f"reward function failed ({stats.last_error}); the completion scores 0 and the run "
                    f"continues (set reward_errors_fatal=true to stop instead)\n{traceback.format_exc(limit=3)}",
                    stacklevel=2,
                )
            return 0.0, False, None

    def score(self, batch: RolloutBatch) -> ScoreStats:
        """Fill the batch's reward fields in place and return the counters."""
        stats = ScoreStats()
        texts = self.decode(batch)
        problems: Sequence[Any] = batch.problems
        scores, correct, feedback = [], [], []
        for text, pi in zip(texts, batch.prompt_index.tolist()):
            s, c, f = self.verify_one(problems[pi], text, stats)
            scores.append(s)
            correct.append(c)
            feedback.append(f)
        batch.texts = texts
        batch.rewards = torch.tensor(scores, dtype=torch.float32)
        batch.correct = torch.tensor(correct, dtype=torch.bool)
        batch.feedback = feedback
        batch.reward_components[getattr(self.task, "name", "task")] = batch.rewards.clone()
        return stats

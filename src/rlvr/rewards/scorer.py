"""Scoring a batch of completions with a task's verifier, robust to reward functions that fail.

A reward function that raises or returns a non-number must not kill a run that has been going for
hours (a known complaint: TRL PR 4567, open-r1 PR 546): that completion scores 0, a counter increments, and
the run continues — unless ``fatal`` is set.

A reward function that *hangs* is cut off by running the verifiers in worker processes: each call has
its own deadline (``timeout_s`` from when a worker takes it), a hung call costs only itself, and the
batch is cut off at :data:`~rlvr.rewards.pool.BATCH_DEADLINE_FACTOR` x ``timeout_s``
(:mod:`rlvr.rewards.pool`). Without a timeout and with one worker, scoring stays in-process.
"""

from __future__ import annotations

import pickle
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from rlvr.errors import RlvrError
from rlvr.rewards.pool import VerifierPool, checked_score
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
    timeouts: int = 0
    last_error: str | None = None
    error_kinds: dict[str, int] = field(default_factory=dict)

    def count_error(self, kind: str, text: str) -> None:
        """Record one failed verifier call of exception type ``kind``."""
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1
        self.last_error = f"{kind}: {text}"


class RewardError(RlvrError):
    """A reward function failed or timed out and ``reward_errors_fatal`` is set."""


REWARD_DTYPE = torch.float32
"""dtype of ``batch.rewards``: a verifier's score must be finite in it, not only as a Python float."""


class Scorer:
    """Calls ``task.verify(problem, text)`` for each completion and fills the batch's reward fields.

    Args:
        task: a :class:`rlvr.tasks.Task`.
        tokenizer: decodes completion ids to text (special tokens skipped).
        fatal: re-raise verifier errors (and timeouts, as :class:`RewardError`) instead of scoring 0.
        timeout_s: seconds one call may run once a worker took it (each call its own deadline; a call
            past it scores 0 as a timeout); the whole batch is cut off at ``BATCH_DEADLINE_FACTOR`` (2) x
            ``timeout_s`` from the first worker being ready, and calls unanswered then are timeouts too;
            0 = no limit. With a limit, or with
            ``num_workers > 1``, verifiers run in a :class:`VerifierPool` (started on first use). A
            task that cannot be pickled is scored in-process instead, with a warning (no limit then).
        num_workers: worker processes for the pool.

    Fills ``batch.texts``, ``batch.rewards`` ``[N]``, ``batch.correct`` ``[N]`` bool,
    ``batch.feedback`` and ``batch.reward_components["<task name>"]``.
    """

    def __init__(self, task: Any, tokenizer: Any, *, fatal: bool = False, timeout_s: float = 0.0,
                 num_workers: int = 1) -> None:
        self.task = task
        self.tokenizer = tokenizer
        self.fatal = fatal
        self.timeout_s = float(timeout_s)
        self.num_workers = int(num_workers)
        self.timeouts_total = 0
        self.errors_total = 0
        self.calls_total = 0  # completions scored (the run summary's denominator for failed calls)
        self.last_error: str | None = None  # the newest failed call's "kind: text", for the run's messages
        self._pool: VerifierPool | None = None
        self._use_pool = self.timeout_s > 0 or self.num_workers > 1
        if self._use_pool:
            try:
                pickle.dumps(task)
            except Exception as exc:  # noqa: BLE001 - any pickling failure means: score in-process
                warnings.warn(
                    f"reward_timeout_s/reward_num_workers need a picklable task, and {type(task).__name__} is not "
                    f"({type(exc).__name__}: {exc}); verifiers run in-process without a timeout",
                    stacklevel=2,
                )
                self._use_pool = False
        if self._use_pool:
            self._ensure_pool()  # workers load the task while the first rollouts are generated

    def _ensure_pool(self) -> bool:
        """Create and start the worker pool if needed; False (with a warning, scoring in-process from
        then on) where this process cannot have children, e.g. inside a daemonic ``multiprocessing.Pool``
        worker."""
        if self._pool is not None:
            return True
        try:
            self._pool = VerifierPool(self.task, self.num_workers, self.timeout_s)
            self._pool.start()
            return True
        except Exception as exc:  # noqa: BLE001
            if self._pool is not None:
                self._pool.close()
            self._pool = None
            self._use_pool = False
            warnings.warn(
                f"cannot start reward worker processes here ({type(exc).__name__}: {exc}); verifiers run "
                "in-process without reward_timeout_s",
                stacklevel=3,
            )
            return False

    def close(self) -> None:
        """Stop the worker processes, if any (a later :meth:`score` restarts them)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def decode(self, batch: RolloutBatch) -> list[str]:
        """Completion texts ``[N]`` (special tokens and padding removed)."""
        lengths = batch.completion_lengths.tolist()
        ids = [row[:n] for row, n in zip(batch.completion_ids.tolist(), lengths)]
        return self.tokenizer.batch_decode(ids, skip_special_tokens=True)

    def verify_one(self, problem: Any, text: str, stats: ScoreStats) -> tuple[float, bool, str | None]:
        """Score one completion; a failing verifier gives ``(0.0, False, None)`` and is counted."""
        verdict = self.judge_one(problem, text, stats)
        if verdict is None:
            return 0.0, False, None
        return float(verdict.score), bool(verdict.correct), verdict.feedback

    def judge_one(self, problem: Any, text: str, stats: ScoreStats) -> Any:
        """The verifier's whole :class:`~rlvr.tasks.base.Verdict` of one completion (in-process; the
        evaluator needs its ``extracted`` answer), or None when the verifier raised or returned a
        non-finite score — counted in ``stats`` and warned about once, as in :meth:`verify_one`.

        Raises:
            Exception: the verifier's error, when ``fatal`` is set.
        """
        stats.calls += 1
        try:
            verdict = self.task.verify(problem, text)
            checked_score(verdict.score)
            return verdict
        except Exception as exc:  # noqa: BLE001 - a user's reward function may raise anything
            if self.fatal:
                raise
            stats.count_error(type(exc).__name__, str(exc))
            if stats.errors == 1:
                warnings.warn(
                    f"reward function failed ({stats.last_error}); the completion scores 0 and the run "
                    f"continues (set reward_errors_fatal=true to stop instead)\n{traceback.format_exc(limit=3)}",
                    stacklevel=3,
                )
            return None

    def score(self, batch: RolloutBatch) -> ScoreStats:
        """Fill the batch's reward fields in place and return the counters."""
        stats = ScoreStats()
        texts = self.decode(batch)
        problems: Sequence[Any] = batch.problems
        scores, correct, feedback = [], [], []
        if self._use_pool and self._ensure_pool():
            scores, correct, feedback = self._score_in_pool(texts, batch, stats)
        else:
            for text, pi in zip(texts, batch.prompt_index.tolist()):
                s, c, f = self.verify_one(problems[pi], text, stats)
                scores.append(s)
                correct.append(c)
                feedback.append(f)
        self.errors_total += stats.errors
        self.timeouts_total += stats.timeouts
        self.calls_total += len(texts)
        self.last_error = stats.last_error or self.last_error
        batch.texts = texts
        batch.rewards = torch.tensor(scores, dtype=REWARD_DTYPE)
        batch.correct = torch.tensor(correct, dtype=torch.bool)
        batch.feedback = feedback
        batch.reward_components[getattr(self.task, "name", "task")] = batch.rewards.clone()
        return stats

    def _score_in_pool(self, texts: list[str], batch: RolloutBatch, stats: ScoreStats):
        assert self._pool is not None
        items = [(i, batch.problems[pi], t) for i, (t, pi) in enumerate(zip(texts, batch.prompt_index.tolist()))]
        results = self._pool.run(items)
        scores, correct, feedback = [], [], []
        for i in range(len(items)):
            s, c, f, err = results[i]
            stats.calls += 1
            if err is not None:
                kind, text = err
                if self.fatal:
                    raise RewardError(f"reward function failed on completion {i} ({kind}: {text}); "
                                      "reward_errors_fatal=true stops the run")
                if kind == "Timeout":
                    stats.timeouts += 1
                    stats.last_error = f"{kind}: {text}"
                else:
                    stats.count_error(kind, text)
                if stats.errors + stats.timeouts == 1:
                    warnings.warn(f"reward function failed ({kind}: {text}); the completion scores 0 and the run "
                                  "continues (set reward_errors_fatal=true to stop instead)", stacklevel=3)
                s, c, f = 0.0, False, None
            scores.append(s)
            correct.append(c)
            feedback.append(f)
        return scores, correct, feedback

"""Scoring a batch of completions with a task's verifier, robust to reward functions that fail.

A reward function that raises or returns a non-number must not kill a run that has been going for
hours (a known complaint: TRL PR 4567, open-r1 PR 546): that completion scores 0, a counter increments, and
the run continues — unless ``fatal`` is set.

A reward function that *hangs* (issue 3) is cut off: with a timeout (or more than one worker) the
verifier runs in worker processes (:class:`VerifierPool`, ``forkserver`` start), each receiving its
share of the batch in one message and answering item by item. **The timeout is one deadline per
share** (issue 12): every worker's share of a batch must be answered within ``timeout_s`` of the
worker being ready, and the shares run in parallel, so a batch is scored in at most about
``timeout_s`` however many calls hang (one at a time, 32 hung calls with a 3 s timeout took 97 s).
At the deadline the worker is killed and replaced; its call in progress and the calls of its share
not reached yet score 0 and are counted in ``ScoreStats.timeouts``. This follows verl's ``prime``
reward manager (all calls submitted at once to a process pool, one ``asyncio.wait_for`` timeout each,
so they share one deadline; code-precedent). More workers (``reward_num_workers``) make the share a
hung call takes down smaller. Without a timeout and with one worker, scoring stays in-process.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import pickle
import time
import traceback
import warnings
import weakref
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait as mp_wait
from typing import Any, Sequence

import torch

from rlvr.errors import RlvrError
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

_REWARD_MAX = torch.finfo(REWARD_DTYPE).max


def checked_score(raw: Any) -> float:
    """``float(raw)`` when it is finite and fits :data:`REWARD_DTYPE`.

    Raises:
        ValueError: the score is NaN or infinite, or its magnitude exceeds float32's largest value
            (~3.4e38): stored in ``batch.rewards`` it would become ``inf`` and stop the run in the
            advantage computation with a traceback (a reward function returning ``1e300`` did).
    """
    score = float(raw)
    if not math.isfinite(score):
        raise ValueError(f"verifier returned a non-finite score {raw!r}")
    if abs(score) > _REWARD_MAX:
        raise ValueError(f"verifier returned the score {raw!r}, outside the float32 range of rewards (|score| <= {_REWARD_MAX:.3g})")
    return score


def _verify_item(task: Any, problem: Any, text: str) -> tuple[float, bool, str | None]:
    verdict = task.verify(problem, text)
    score = checked_score(verdict.score)
    return score, bool(verdict.correct), verdict.feedback


def _worker_main(conn: Any, payload: bytes) -> None:
    """Worker process loop: unpickle the task, then score lists of ``(idx, problem, text)`` items,
    answering ``(idx, score, correct, feedback, error)`` per item (``error`` = ``(kind, text)`` or None)."""
    try:
        task = pickle.loads(payload)
    except BaseException as exc:  # noqa: BLE001
        conn.send(("init_error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        for idx, problem, text in msg:
            try:
                score, correct, feedback = _verify_item(task, problem, text)
                conn.send((idx, score, correct, feedback, None))
            except Exception as exc:  # noqa: BLE001 - a user's reward function may raise anything
                conn.send((idx, 0.0, False, None, (type(exc).__name__, str(exc)[:500])))


def _stop_workers(workers: list) -> None:
    for w in workers:
        if w is None:
            continue
        proc, conn = w["proc"], w["conn"]
        try:
            conn.send(None)
        except (OSError, ValueError):
            pass
        proc.join(timeout=1.0)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=1.0)
        conn.close()
    workers[:] = [None] * len(workers)


class VerifierPool:
    """Worker processes running ``task.verify`` where a hung call can be stopped.

    Args:
        task: the task; must be picklable (it is sent to each worker once, at start).
        num_workers: worker processes (≥ 1); a batch is split into this many contiguous shares,
            scored in parallel.
        timeout_s: seconds each worker's share of one batch may take (0 = no limit): one deadline per
            share, counted from the worker being ready, so its start-up (importing the task's modules)
            is not counted; calls unanswered at the deadline are timeouts (see the module docstring).
        start_method: multiprocessing start method (``forkserver`` by default: workers do not
            inherit the trainer's threads or model memory).
        startup_timeout_s: seconds a worker may take to start and load the task.

    Raises:
        TypeError / pickle.PicklingError: the task cannot be pickled.

    Source: issue 3 ("a reward function that hangs is cut off after reward_timeout_s").
    """

    def __init__(self, task: Any, num_workers: int = 1, timeout_s: float = 30.0, *,
                 start_method: str = "forkserver", startup_timeout_s: float = 120.0) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self._payload = pickle.dumps(task)
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.startup_timeout_s = float(startup_timeout_s)
        methods = mp.get_all_start_methods()
        self._ctx = mp.get_context(start_method if start_method in methods else "spawn")
        if self._ctx.get_start_method() == "forkserver":
            # the fork server imports these once; each worker (and each replacement of a killed one)
            # is then forked with torch and rlvr already loaded: ~10 ms instead of seconds
            self._ctx.set_forkserver_preload(["rlvr.rewards", "rlvr.tasks.base"])
        self._workers: list[dict[str, Any] | None] = [None] * num_workers
        self.restarts = 0
        self._finalizer = weakref.finalize(self, _stop_workers, self._workers)

    def _start(self, k: int) -> dict[str, Any]:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=_worker_main, args=(child, self._payload), daemon=True,
                                 name=f"rlvr-verifier-{k}")
        proc.start()
        child.close()
        w = {"proc": proc, "conn": parent, "ready": False}
        self._workers[k] = w
        return w

    def _kill(self, k: int) -> None:
        w = self._workers[k]
        if w is not None:
            w["proc"].kill()
            w["proc"].join(timeout=5.0)
            w["conn"].close()
        self._workers[k] = None
        self.restarts += 1

    def close(self) -> None:
        """Stop every worker (idempotent)."""
        _stop_workers(self._workers)

    def start(self) -> None:
        """Launch any missing worker now without waiting for it: its start-up (fork, loading the task)
        then overlaps with whatever the caller does next (e.g. the first generation round)."""
        for j, w in enumerate(self._workers):
            if w is None or not w["proc"].is_alive():
                if w is not None:
                    self._kill(j)
                    self.restarts -= 1  # a dead idle worker being replaced is not a timeout restart
                self._start(j)

    def run(self, items: Sequence[tuple[int, Any, str]]) -> dict[int, tuple[float, bool, str | None, tuple[str, str] | None]]:
        """Score ``items`` (``(idx, problem, text)``) in the workers.

        Returns:
            ``idx -> (score, correct, feedback, error)`` for every item; ``error`` is ``(kind, text)``
            for a verifier that raised, returned a non-number, was still running or not yet reached
            when its share's deadline passed (kind ``"Timeout"``) or killed its worker (kind
            ``"WorkerDied"``; the rest of that share goes to a replacement), else None.

        Raises:
            RuntimeError: a worker cannot load the task (the message gives the worker's error).
        """
        results: dict[int, tuple[float, bool, str | None, tuple[str, str] | None]] = {}
        if not items:
            return results
        k = min(self.num_workers, len(items))
        per = -(-len(items) // k)
        shares = [list(items[i * per : (i + 1) * per]) for i in range(k)]
        pending: dict[int, deque] = {}
        deadline: dict[int, float] = {}

        def share_deadline(j: int) -> float:
            # one deadline per share, from the worker being ready (its start-up has its own allowance)
            if self.timeout_s <= 0:
                return math.inf
            return time.monotonic() + self.timeout_s + (0.0 if self._workers[j]["ready"] else self.startup_timeout_s)

        def launch(j: int, share: list) -> None:
            w = self._workers[j]
            if w is None or not w["proc"].is_alive():
                if w is not None:
                    self._kill(j)
                w = self._start(j)
            w["conn"].send(share)
            pending[j] = deque(share)
            deadline[j] = share_deadline(j)

        def worker_died(j: int, code: Any) -> None:
            idx = pending[j].popleft()[0]
            results[idx] = (0.0, False, None, ("WorkerDied", f"verifier worker exited (code {code}) while scoring this completion"))
            self._kill(j)
            rest = list(pending.pop(j))
            deadline.pop(j, None)
            if rest:
                launch(j, rest)

        def share_timed_out(j: int) -> None:
            share = list(pending.pop(j))
            deadline.pop(j, None)
            head, rest = share[0], share[1:]
            results[head[0]] = (0.0, False, None, (
                "Timeout", f"reward function did not return within reward_timeout_s={self.timeout_s:g} s "
                "(the deadline of its worker's share of the batch)"))
            for item in rest:
                results[item[0]] = (0.0, False, None, (
                    "Timeout", f"not scored: its worker's share of the batch ran past reward_timeout_s="
                    f"{self.timeout_s:g} s (a call before it hung)"))
            self._kill(j)
            self._start(j)  # the replacement loads the task while the caller goes on

        for j, share in enumerate(shares):
            if share:
                launch(j, share)
        while pending:
            now = time.monotonic()
            soonest = min(deadline.values())
            conns = {self._workers[j]["conn"]: j for j in pending}
            ready = mp_wait(list(conns), timeout=None if soonest == math.inf else max(0.0, soonest - now))
            for conn in ready:
                j = conns[conn]
                if j not in pending:
                    continue
                w = self._workers[j]
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    worker_died(j, w["proc"].exitcode if w else None)
                    continue
                if msg[0] == "ready":
                    w["ready"] = True
                    deadline[j] = share_deadline(j)
                    continue
                if msg[0] == "init_error":
                    self.close()
                    raise RuntimeError(f"reward worker could not load the task: {msg[1]}")
                idx, score, correct, feedback, error = msg
                head = pending[j].popleft()
                assert head[0] == idx, (head[0], idx)
                results[idx] = (score, correct, feedback, error)
                if not pending[j]:
                    del pending[j], deadline[j]
            now = time.monotonic()
            for j in [j for j, d in deadline.items() if d <= now]:
                if j in pending and self._workers[j] is not None and not self._workers[j]["ready"]:
                    self.close()
                    raise RuntimeError(f"reward worker did not start within {self.startup_timeout_s:.0f} s")
                if j in pending:
                    share_timed_out(j)
        return results


class Scorer:
    """Calls ``task.verify(problem, text)`` for each completion and fills the batch's reward fields.

    Args:
        task: a :class:`rlvr.tasks.Task`.
        tokenizer: decodes completion ids to text (special tokens skipped).
        fatal: re-raise verifier errors (and timeouts, as :class:`RewardError`) instead of scoring 0.
        timeout_s: seconds each worker's share of a batch may take (one deadline per share, shares in
            parallel: a batch takes at most about ``timeout_s``); 0 = no limit. With a limit, or with
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

"""A run's lifecycle around the training loop: stopping cleanly on SIGINT/SIGTERM and the summary
printed at the end of every run.

Stopping (issue 12, item 6; interpretation of what job schedulers expect: SLURM and Kubernetes send
SIGTERM, wait a grace period, then SIGKILL; TRL/accelerate leave the handling to the user). The first
signal asks the loop to stop at the next safe point: an optimizer update in progress is finished, a
generation round in progress (sampling, scoring — possibly long) is abandoned and the trainer's state
is put back to the start of that round, so the checkpoint written next is exactly the one a
``save_steps`` checkpoint at that step would be. A second signal stops at once without a new
checkpoint (the newest one on disk stays valid: checkpoints are written atomically).
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from rlvr.util.text import plural
from rlvr.trainer.checkpoint_state import capture_rng_state, restore_rng_state

SIGNAL_NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


class RunInterrupted(KeyboardInterrupt):
    """The run stopped on a signal. A ``KeyboardInterrupt`` so that code catching ``Exception`` (a
    comparison harness going on to its next run) lets it through.

    Attributes:
        signum: the signal (``signal.SIGINT`` or ``signal.SIGTERM``).
        step: optimizer steps done.
        checkpoint: the checkpoint written on the way out, or None (second signal: stopped at once).
        exit_code: ``128 + signum`` (130 for SIGINT, 143 for SIGTERM), the shell convention.
    """

    def __init__(self, signum: int, step: int, checkpoint: Path | None) -> None:
        self.signum, self.step, self.checkpoint = int(signum), int(step), checkpoint
        self.exit_code = 128 + self.signum
        name = SIGNAL_NAMES.get(self.signum, f"signal {self.signum}")
        where = f"wrote {checkpoint}" if checkpoint else "stopped at once (second signal), no new checkpoint"
        super().__init__(f"{name} at step {self.step}: {where}")


class _Abandon(BaseException):
    """Raised by the signal handler inside an abandonable phase (a generation round)."""


class _Abort(BaseException):
    """Raised by the signal handler on a second signal."""


class StopControl:
    """Installs SIGINT/SIGTERM handlers for the duration of a ``with`` block (main thread only; in any
    other thread it does nothing) and records the first signal in :attr:`requested`.

    Inside :meth:`abandonable` a signal raises at once (to leave a long generation round); elsewhere
    the loop polls :attr:`requested` after each update. A second signal raises at once anywhere.
    """

    def __init__(self) -> None:
        self.requested: int | None = None
        self._abandonable = False
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.requested is not None:
            raise _Abort()
        self.requested = signum
        if self._abandonable:
            raise _Abandon()

    def __enter__(self) -> "StopControl":
        if threading.current_thread() is threading.main_thread():
            for s in SIGNAL_NAMES:
                self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old.clear()

    @contextlib.contextmanager
    def abandonable(self) -> Iterator[None]:
        """A phase a signal may cut short (raises ``_Abandon`` out of the block)."""
        if self.requested is not None:
            raise _Abandon()
        self._abandonable = True
        try:
            yield
        finally:
            self._abandonable = False


def round_snapshot(trainer: Any) -> dict[str, Any]:
    """What a generation round changes before its first update: loader position, round counter,
    dynamic-sampling carry, global RNG state (restored by :func:`restore_round`)."""
    rs = trainer.run_state
    return {
        "loader": trainer.loader.state_dict(), "generation_round": rs.generation_round,
        "rollout_round": rs.rollout_round, "carry": list(rs.carry), "rng": capture_rng_state(),
        "pending_round": rs.pending_round,
    }


def restore_round(trainer: Any, snap: dict[str, Any]) -> None:
    """Put ``trainer`` back to a :func:`round_snapshot` (an abandoned generation round)."""
    trainer.loader.load_state_dict(snap["loader"])
    rs = trainer.run_state
    rs.generation_round = snap["generation_round"]
    rs.rollout_round = snap.get("rollout_round", snap["generation_round"])
    rs.carry = snap["carry"]
    rs.pending_round = snap["pending_round"]
    restore_rng_state(snap["rng"])


@dataclass
class RunSummary:
    """Counters for the summary printed at the end of every run.

    Attributes:
        start_step: steps done when the run (or resumption) started.
        reward_first, reward_last: ``reward/mean`` of the first and last logged update of this run.
        calls, errors, timeouts: verifier calls, calls that raised / returned a non-number, calls cut off.
        learned: per learned reward component (a ``judge`` or ``reward_model`` entry, by its metric name)
            the sums over this run's logged steps of its ``<name>/calls``, ``failures``, ``timeouts`` and
            (judges) ``parse_failures``; those rows scored the entry's ``failure_score``, so the summary
            shows them beside the verifier's (interpretation: a judge that failed on most rows trains on
            its failure score, which is as worth seeing at the end as a verifier's errors).
    """

    start_step: int = 0
    t0: float = field(default_factory=time.perf_counter)
    reward_first: float | None = None
    reward_last: float | None = None
    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    learned: dict[str, dict[str, int]] = field(default_factory=dict)
    _base: tuple[int, int, int] = (0, 0, 0)

    @staticmethod
    def _counts(scorer: Any) -> tuple[int, int, int]:
        return (int(getattr(scorer, "calls_total", 0)), int(getattr(scorer, "errors_total", 0)),
                int(getattr(scorer, "timeouts_total", 0)))

    def start(self, trainer: Any) -> None:
        """Record the starting step and the scorer's counters."""
        self.start_step = trainer.global_step
        self.t0 = time.perf_counter()
        self._base = self._counts(trainer.scorer)
        scorer = trainer.scorer
        names, learned = getattr(scorer, "names", None), getattr(scorer, "learned", None)
        self.learned = ({names[i]: dict.fromkeys(LEARNED_COUNTERS, 0) for i in sorted(learned)}
                        if isinstance(names, list) and isinstance(learned, dict) else {})

    def observe(self, metrics: dict[str, float]) -> None:
        """Take ``reward/mean`` from one update's metrics (only updates that carry it) and add the learned
        reward components' counters (``<name>/calls`` …: :data:`LEARNED_COUNTERS`) it holds."""
        r = metrics.get("reward/mean")
        if r is not None:
            self.reward_first = r if self.reward_first is None else self.reward_first
            self.reward_last = r
        for name, counts in self.learned.items():
            for c in counts:
                v = metrics.get(f"{name}/{c}")
                if v is not None and math.isfinite(v):
                    counts[c] += int(round(v))

    def update_counts(self, trainer: Any) -> None:
        """Read the scorer's cumulative counters (call at the end); under torchrun the job's, summed
        over ranks round by round (:class:`RewardFailureWatch`), not rank 0's alone."""
        watch = getattr(trainer, "reward_watch", None)
        if getattr(trainer, "world_size", 1) > 1 and watch is not None:
            self.calls, self.errors, self.timeouts = watch.calls, watch.errors, watch.timeouts
            return
        now = self._counts(trainer.scorer)
        self.calls, self.errors, self.timeouts = (a - b for a, b in zip(now, self._base))

    @property
    def failed_fraction(self) -> float:
        """(errors + timeouts) / calls of this run; 0 when nothing was scored."""
        return (self.errors + self.timeouts) / self.calls if self.calls else 0.0

    @staticmethod
    def _learned_line(name: str, c: dict[str, int]) -> str:
        """``judge: 40 calls, 3 failures (2 timeouts, 1 parse failure; 8% scored failure_score)``."""
        detail = [plural(c["timeouts"], "timeout")]
        if c["parse_failures"]:
            detail.append(plural(c["parse_failures"], "parse failure"))
        share = f"; {100 * c['failures'] / c['calls']:.0f}% scored failure_score" if c["failures"] else ""
        return f"  {name}: {plural(c['calls'], 'call')}, {plural(c['failures'], 'failure')} ({', '.join(detail)}{share})"

    def text(self, step: int, checkpoint: Path | None, status: str, *, final: Path | None = None) -> str:
        """The summary block (one item a line): ``rlvr: run finished: 20 steps (1 -> 20) in 3m12s``,
        ``reward/mean 0.125 -> 0.500``, ``verifier: 1280 calls, 0 errors, 0 timeouts``, one line per learned
        reward component that was called (``judge: 40 calls, 0 failures (0 timeouts)``),
        ``model: runs/x/final`` (when written), ``checkpoint: runs/x/checkpoint-20`` (the newest
        resumable one, or ``none written``)."""
        wall = time.perf_counter() - self.t0
        mins, secs = divmod(int(round(wall)), 60)
        steps = step - self.start_step
        span = f" ({self.start_step + 1} -> {step})" if steps else ""
        fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
        lines = [
            f"rlvr: run {status}: {plural(steps, 'step')}{span} in {mins}m{secs:02d}s",
            f"  reward/mean {fmt(self.reward_first)} -> {fmt(self.reward_last)}",
            f"  verifier: {plural(self.calls, 'call')}, {plural(self.errors, 'error')}, {plural(self.timeouts, 'timeout')}"
            + (f" ({100 * self.failed_fraction:.0f}% failed)" if self.errors or self.timeouts else ""),
            *(self._learned_line(name, c) for name, c in self.learned.items() if c["calls"]),
            *([f"  model: {final}"] if final else []),
            f"  checkpoint: {checkpoint if checkpoint else 'none written (save_steps)'}",
        ]
        return "\n".join(lines)


LEARNED_COUNTERS = ("calls", "failures", "timeouts", "parse_failures")
"""The per-step counters of a learned reward component (:mod:`rlvr.rewards.judge`,
:mod:`rlvr.rewards.reward_model`) that :class:`RunSummary` sums for the end-of-run summary."""

REWARD_FAILURE_ROUNDS = 2
"""Generation rounds in a row in which every reward call failed before a run stops (issue 25 item
4.8; interpretation: one such round may be a passing outage of a remote verifier, two are a reward
function that cannot work; the rest of the run would train on zeros)."""


class RewardFailureWatch:
    """The job's reward-call counts per generation round: totals for the summary and the stop rule.

    Attributes:
        calls, errors, timeouts: totals over the rounds seen (job-wide: the caller passes counts
            summed over ranks). rounds: rounds in a row in which every call failed.
    """

    def __init__(self, limit: int = REWARD_FAILURE_ROUNDS) -> None:
        self.limit = limit
        self.calls = self.errors = self.timeouts = self.rounds = 0

    def round_done(self, calls: int, errors: int, timeouts: int) -> bool:
        """Record one round's counts; True when ``limit`` rounds in a row had every call fail (a round
        with no call changes nothing)."""
        self.calls, self.errors, self.timeouts = self.calls + calls, self.errors + errors, self.timeouts + timeouts
        if calls:
            self.rounds = self.rounds + 1 if errors + timeouts >= calls else 0
        return self.rounds >= self.limit

    def message(self, checkpoint: Any, last_error: str | None) -> str:
        """Why the run stopped, where its checkpoint is, and what to check."""
        return (f"every reward call failed in {self.rounds} generation rounds in a row ({plural(self.calls, 'call')}: "
                f"{plural(self.errors, 'error')}, {plural(self.timeouts, 'timeout')}"
                + (f"; last: {last_error}" if last_error else "") + "): the rewards would all be zeros from "
                f"failures. Wrote a checkpoint to {checkpoint} (continue with --resume once it is fixed). "
                "Check task.reward_fn and reward_timeout_s (the first error is in the log above).")


@contextlib.contextmanager
def rollout_progress(trainer: Any) -> Iterator[None]:
    """A bar counting the rollouts of one generation round (issue 12, item 10: a paper-scale round of
    524,288 rollouts otherwise shows a step bar stuck at 0/1). It appears only when the round lasts a
    few seconds (on a log file: :data:`rlvr.util.progress.LOG_INTERVAL_S`); counts come from the engine's
    ``on_generated`` hook (engines without it show nothing)."""
    from rlvr.util.progress import LOG_INTERVAL_S, is_interactive, progress_bar

    cfg, engine = trainer.cfg, trainer.engine
    if not cfg.logging.progress or not hasattr(engine, "on_generated"):
        yield
        return
    import sys

    exact = cfg.sampler == "group" and not cfg.dynamic_sampling.enable
    bar = progress_bar(total=cfg.generation_batch_size if exact else None, unit="rollout", leave=False,
                       desc=f"round {trainer.generation_round + 1}: rollouts",
                       delay=3.0 if is_interactive(sys.stderr) else LOG_INTERVAL_S)
    engine.on_generated = bar.update
    try:
        yield
    finally:
        engine.on_generated = None
        bar.close()

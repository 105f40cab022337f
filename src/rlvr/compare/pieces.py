"""Time-limited comparison pieces: ``rlvr compare --stop-after SECONDS`` ends an invocation at the first
optimizer-step boundary after SECONDS; the run in progress writes a checkpoint and ``piece.json`` and
the next invocation resumes it from there instead of starting it afresh.

Why: on a shared machine long runs must fit fixed slots (a lock held ≤ N minutes); before this, the
harness resumed only at run granularity, so a run longer than a slot could not be done at all.

``OUT/<arm>/seed<k>/piece.json`` holds what the trainer's checkpoint does not: the budget meter's
counts (rollouts, tokens, idle draws), the run's wall seconds so far (``wall_s`` of the result sums
the pieces; loading and checkpoint writing are left out) and the next mid-run evaluation point. The
trainer's own resume (:mod:`rlvr.trainer.checkpoint`) restores weights, optimizer, loader, RNG and a
generation batch in the middle of its updates, so a run cut into pieces is the run it would have
been in one go (the test checks equal results on the tiny model).

Source: interpretation (no paper): the checkpoint is the trainer's SIGTERM checkpoint
(:meth:`rlvr.trainer.trainer.Trainer.request_stop`), so a piece boundary is a step boundary.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rlvr.util.staging import write_text_atomic

PIECE_FILE = "piece.json"


class TimeLimitReached(BaseException):
    """The invocation's ``stop_after_s`` passed: the run in progress was checkpointed (``piece.json``)
    and the comparison stops; the next invocation resumes it. A ``BaseException`` so that the
    harness's per-run crash guard (``except Exception``) does not record it as a failed run."""


@dataclass
class PieceState:
    """What a resumed run needs besides the trainer checkpoint (see the module docstring).

    Attributes:
        checkpoint: the trainer checkpoint folder written at the stop.
        step: optimizer steps done.
        rollouts, tokens, idle_draws: the budget meter's counts.
        wall_s: training seconds of the pieces so far (mid-run evaluations excluded).
        next_point: the next mid-run held-out evaluation point (``eval.curve_points``).
        pieces: pieces finished so far.
    """

    checkpoint: str
    step: int
    rollouts: int
    tokens: int
    idle_draws: int
    wall_s: float
    next_point: int
    pieces: int

    def save(self, run_dir: str | Path) -> Path:
        """Write ``run_dir/piece.json`` atomically."""
        path = Path(run_dir) / PIECE_FILE
        write_text_atomic(path, json.dumps(asdict(self), indent=1))
        return path

    @staticmethod
    def load(run_dir: str | Path) -> "PieceState | None":
        """The state of an unfinished run in ``run_dir``, or None (no ``piece.json``, or its checkpoint
        is gone: the run then starts afresh)."""
        path = Path(run_dir) / PIECE_FILE
        if not path.is_file():
            return None
        state = PieceState(**json.loads(path.read_text()))
        return state if Path(state.checkpoint).is_dir() else None


class Deadline:
    """``stop_after_s`` seconds from now (None: no limit). :meth:`passed` is polled at step boundaries."""

    def __init__(self, stop_after_s: float | None) -> None:
        if stop_after_s is not None and not stop_after_s >= 0:
            raise ValueError(f"stop_after_s must be >= 0 seconds, got {stop_after_s!r}")
        self.at = None if stop_after_s is None else time.monotonic() + float(stop_after_s)

    def passed(self) -> bool:
        """True once the limit is reached (never without one)."""
        return self.at is not None and time.monotonic() >= self.at

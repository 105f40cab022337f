"""Run observability: JSONL metrics, TensorBoard events, sample completions and a progress bar."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Sequence

from rlvr.util.progress import progress_bar


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def drop_rows_after(path: Path, step: int) -> None:
    """Rewrite a JSONL log without the rows of steps after ``step``.

    Used when a run resumes from a checkpoint (or a comparison piece continues) so that steps redone after
    the checkpoint appear once: rows whose ``"step"`` exceeds ``step`` go, and so does any line that does not
    parse (a torn last line of a killed run). The file is replaced atomically (temporary file, then
    ``os.replace``); nothing happens when the file is missing or nothing would be dropped.

    Args:
        path: a JSONL file of objects with an integer ``"step"`` (rows without one count as step 0).
        step: the last step to keep.

    Raises:
        OSError: the file cannot be read or replaced.

    Source: interpretation: the resume semantics of ``rlvr train --resume`` (``docs/usage.md``,
    "Checkpoints and resume"); not from a paper.
    """
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    keep = []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(row, dict) or int(row.get("step", 0)) <= step:
            keep.append(line)
    if len(keep) == len(lines):
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(x + "\n" for x in keep), encoding="utf-8")
    tmp.replace(path)


def _last_time(path: Path) -> float:
    """The ``"time"`` of the last row of a ``metrics.jsonl`` (0 when the file is missing, empty or the row has
    none), so the rows of a resumed run continue the time axis instead of restarting at 0.

    Source: interpretation: ``time`` counts training seconds across resumes (``docs/usage.md``, "Metrics")."""
    if not path.exists():
        return 0.0
    for line in reversed(path.read_text(encoding="utf-8").splitlines()):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        t = row.get("time") if isinstance(row, dict) else None
        return float(t) if isinstance(t, (int, float)) and math.isfinite(t) and t >= 0 else 0.0
    return 0.0


class RunLogger:
    """Writes one JSON object per step to ``metrics.jsonl``, scalars to TensorBoard, sample
    completions to ``completions.jsonl``, and drives a tqdm progress bar with ETA (periodic lines
    instead when stderr is not a terminal, see :mod:`rlvr.util.progress`).

    Every line is flushed as it is written, so a killed run keeps all completed steps.

    Args:
        output_dir: the run directory (created).
        total_steps: the run's optimizer-step budget, for the progress bar (None: not known in advance,
            e.g. a comparison's rollout budget with dynamic sampling; the bar then counts steps).
        start_step: steps already done (resume). Rows of ``metrics.jsonl`` and ``completions.jsonl`` past it
            (steps that ran after the checkpoint and are now redone) and a torn last line are dropped, so every
            step appears once and every line parses.
        tensorboard: write TensorBoard event files under ``output_dir/tb``.
        progress: show the progress bar.
        trackers: further experiment trackers (:mod:`rlvr.loggers`: W&B, MLflow) that receive the same
            finite scalars as each ``metrics.jsonl`` row, under the same names; closed by :meth:`close`.
    """

    def __init__(
        self, output_dir: str | Path, total_steps: int | None, *, start_step: int = 0, tensorboard: bool = True,
        progress: bool = True, trackers: Sequence[Any] = (),
    ) -> None:
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        if start_step > 0:  # a resumed run redoes the steps after its checkpoint: their rows are written anew
            drop_rows_after(self.dir / "metrics.jsonl", start_step)
            drop_rows_after(self.dir / "completions.jsonl", start_step)
        self._metrics = open(self.dir / "metrics.jsonl", "a", encoding="utf-8")
        self._completions = open(self.dir / "completions.jsonl", "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.dir / "tb"), purge_step=start_step + 1 if start_step else None)
        # a terminal gets a live bar; a log file a line every LOG_INTERVAL_S seconds (rlvr.util.progress)
        self._bar = progress_bar(total=total_steps, initial=start_step, disable=not progress, unit="step", desc="train")
        # ``time`` is training seconds since the run's first start: a resumed run goes on from the last kept row
        self._t0 = time.time() - (_last_time(self.dir / "metrics.jsonl") if start_step > 0 else 0.0)
        self.trackers = list(trackers)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Record ``metrics`` for optimizer step ``step`` (1-based)."""
        row = {"step": step, "time": round(time.time() - self._t0, 3)}
        row.update({k: _clean(v) for k, v in sorted(metrics.items())})
        try:
            self._metrics.write(json.dumps(row) + "\n")
            self._metrics.flush()
        except OSError as exc:  # disk full: name the file (the CLI prints it without a traceback)
            raise OSError(exc.errno, exc.strerror, str(self.dir / "metrics.jsonl")) from exc
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(float(v)):
                    self._tb.add_scalar(k, float(v), step)
            self._tb.flush()
        if self.trackers:
            from rlvr.loggers import finite_scalars

            scalars = finite_scalars(metrics)
            for t in self.trackers:
                t.log(step, scalars)
        self._bar.update(step - self._bar.n)
        shown = {k: metrics[k] for k in ("reward/mean", "reward/pass_rate", "actor/entropy") if k in metrics}
        self._bar.set_postfix({k.split("/")[-1]: f"{v:.3f}" for k, v in shown.items()})

    def log_completions(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Append sample completions (prompt, completion, reward, feedback) for step ``step``."""
        for r in rows:
            self._completions.write(json.dumps({"step": step, **r}) + "\n")
        self._completions.flush()
        if self._tb is not None and rows:
            text = "\n\n".join(f"**reward {r.get('reward')}**\n\n    {r.get('completion', '')}" for r in rows)
            self._tb.add_text("completions", text, step)

    def message(self, text: str) -> None:
        """Print a line without breaking the progress bar."""
        self._bar.write(text)

    def close(self) -> None:
        """Flush and close every sink (each one, even when an earlier one fails).

        Raises:
            OSError: a JSONL file could not be flushed (disk full), with that file's path as
                ``filename`` (the first such failure; the other sinks are still closed).
        """
        self._bar.close()
        failed: OSError | None = None
        for name, f in (("metrics.jsonl", self._metrics), ("completions.jsonl", self._completions)):
            try:
                f.close()
            except OSError as exc:
                failed = failed or OSError(exc.errno, exc.strerror, str(self.dir / name))
        if self._tb is not None:
            self._tb.close()
        for t in self.trackers:
            t.close()
        if failed is not None:
            raise failed


class NullLogger:
    """The logger of ranks other than 0 under ``torchrun``: same methods, writes nothing."""

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Ignore ``metrics`` (rank 0 writes the job's reduced row)."""

    def log_completions(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Ignore ``rows`` (completions are sampled from rank 0)."""

    def message(self, text: str) -> None:
        """Ignore ``text``."""

    def close(self) -> None:
        """Nothing to close."""

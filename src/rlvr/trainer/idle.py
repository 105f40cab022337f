"""Stop a run that has no learning signal (issue 12 item 3).

With dynamic sampling (``on_exhausted=proceed``) or batch filters that drop rows, a task the policy never
(or always) solves gives generation rounds with no trainable group, and the loop would generate forever.
:class:`IdleTracker` counts rounds in a row that gave no trainable row and no optimizer update (rows
kept for a later update, as a schedule's accumulation buffer does, count as progress); after ``max_idle_rounds`` the
trainer writes a checkpoint and raises :class:`rlvr.errors.IdleRunError` (the CLI exits with code 3)
with what was seen over those rounds and what to try.

Source: interpretation — no peer bounds this (verl's ``max_num_gen_batches`` raises inside one step,
TRL has no dynamic sampling); a count of whole rounds mirrors ``max_consecutive_nonfinite``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from rlvr.core.advantages import zero_std_group_fraction
from rlvr.util.text import plural
from rlvr.types import RolloutBatch


@dataclass
class RoundSignal:
    """Counts over every row sampled in one generation round (all dynamic-sampling draws).

    Attributes:
        rows: completions sampled. correct: of them, verified correct (``batch.correct``); judged:
            completions with a verdict (0 where a sampler sets no ``correct``). groups: groups
            sampled. zero_std_groups: of them, groups whose rewards do not vary.
    """

    rows: int = 0
    judged: int = 0
    correct: int = 0
    groups: int = 0
    zero_std_groups: int = 0

    @classmethod
    def of(cls, batches: Sequence[RolloutBatch]) -> "RoundSignal":
        """The counts of scored ``batches`` (unscored ones are skipped)."""
        s = cls()
        for b in batches:
            if b.rewards is None or len(b) == 0:
                continue
            s.rows += len(b)
            if b.correct is not None:
                s.judged += len(b)
                s.correct += int(b.correct.sum())
            n_groups = len(torch.unique(b.group_id))
            s.groups += n_groups
            s.zero_std_groups += round(zero_std_group_fraction(b.rewards.float(), b.group_id) * n_groups)
        return s

    def add(self, other: "RoundSignal") -> None:
        """Add ``other``'s counts to these."""
        for k in ("rows", "judged", "correct", "groups", "zero_std_groups"):
            setattr(self, k, getattr(self, k) + getattr(other, k))


class IdleTracker:
    """Counts generation rounds in a row that ended without an optimizer update or a trainable row.

    Args:
        max_rounds: ``max_idle_rounds`` (≥ 1).
    """

    def __init__(self, max_rounds: int) -> None:
        if max_rounds < 1:
            raise ValueError(f"max_idle_rounds must be >= 1, got {max_rounds}")
        self.max_rounds = max_rounds
        self.rounds = 0
        self.seen = RoundSignal()

    def round_done(self, progressed: bool, signal: RoundSignal | None) -> bool:
        """Record one round (``progressed``: it trained or kept rows to train); True when ``max_rounds``
        rounds in a row made no progress (stop now)."""
        if progressed:
            self.rounds, self.seen = 0, RoundSignal()
            return False
        self.rounds += 1
        if signal is not None:
            self.seen.add(signal)
        return self.rounds >= self.max_rounds

    def message(self, cfg: Any, checkpoint: Any) -> str:
        """What happened over the idle rounds, where the checkpoint is, and what to try."""
        s = self.seen
        pass_rate = s.correct / s.judged if s.judged else None
        zero = s.zero_std_groups / s.groups if s.groups else None
        seen = (f"pass rate {pass_rate:.1%} over {plural(s.judged, 'verified completion')}" if pass_rate is not None
                else f"{plural(s.rows, 'completion')} sampled (no pass/fail verdicts)")
        if zero is not None:
            seen += f", {zero:.0%} of {plural(s.groups, 'group')} with zero reward variance"
        tips = []
        if pass_rate == 0.0:
            tips.append("the policy solves none of these prompts: use an easier task or difficulty, a stronger "
                        "model, or check that completions match the verifier's answer format (completions.jsonl)")
        elif pass_rate == 1.0:
            tips.append("every completion is correct: use harder prompts")
        tips.append("more completions per prompt (num_generations) or a higher temperature")
        if cfg.dynamic_sampling.enable:
            tips.append(f"a larger dynamic_sampling.max_num_gen_batches (now {cfg.dynamic_sampling.max_num_gen_batches})")
        if cfg.batch_filters:
            tips.append(f"looser batch filters ({', '.join(cfg.batch_filters)}: their thresholds in the config)")
        tips.append(f"a larger max_idle_rounds (now {self.max_rounds}) if updates are expected to be rare")
        return (f"no trainable group and no optimizer update in {self.rounds} generation rounds in a row (max_idle_rounds="
                f"{self.max_rounds}): {seen}. Wrote a checkpoint to {checkpoint} (continue with --resume). "
                "Try: " + "; ".join(tips) + ".")

"""The feedback-augmented prompt (FAP) of FBOS-RL: feedback text per level, the prompt template, parent
choice and the ECC group ids (``docs/fbos_rl.md`` §2.3–§2.5). Used by :mod:`rlvr.variants.fbos_rl.sampler`.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from typing import Callable, Sequence

from rlvr.types import GenerationRequest, RolloutBatch

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
"""The FAP user turn of ``docs/fbos_rl.md`` §2.5 (interpretation; placeholders are replaced
literally, so ``\\boxed{}`` needs no escaping)."""

_ANSWER_WRONG = [
    re.compile(r"\s*Your final answer `.*?` is incorrect\.", re.S),
    re.compile(r", and it is incorrect(?=\.)"),
]
_FORMAT_OK = "The answer format is correct, but the attempt did not solve the problem."
_GENERIC_WRONG = "The final answer is incorrect."


def ecc_group_id(epa_group_id: int) -> int:
    """The ECC group id of a prompt whose EPA group id is ``epa_group_id`` (``−id − 1``: never equal
    to a non-negative EPA id)."""
    return -int(epa_group_id) - 1


def round_robin_parents(failed: Sequence[int], slots: int) -> list[int]:
    """Parent of each FAP slot: slot ``j`` takes ``failed[j mod k]`` (each failure gets about
    ``slots / k`` children).

    Raises:
        ValueError: no failed attempt, or ``slots < 0``.

    Source: docs/fbos_rl.md §2.3 (``fbos.parent_assignment=round_robin``).
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

    Source: docs/fbos_rl.md §2.4 (interpretation); messages from :mod:`rlvr.tasks.feedback`.
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

    Source: docs/fbos_rl.md §2.5 (shape: problem, previous attempt, feedback, instruction).
    """
    t = DEFAULT_FAP_TEMPLATE if template is None else template
    block = "" if feedback is None else FEEDBACK_BLOCK.replace("{feedback}", feedback)
    out = t.replace("{problem}", problem).replace("{attempt}", attempt)
    out = out.replace("{feedback_block}", block).replace("{feedback}", feedback or "")
    return out


def _load_fn(spec: str) -> Callable[..., str]:
    mod, _, name = spec.partition(":")
    return getattr(importlib.import_module(mod), name)


@dataclasses.dataclass(frozen=True)
class _Request:
    """One planned round-2 request: its prompt, ``"fap"`` or ``"fill"``, the failed parent row (FAP) and
    the context ids it is sampled from."""

    prompt: int
    what: str
    parent: int | None
    context: list[int]


@dataclasses.dataclass
class _SecondRound:
    """The plan and bookkeeping of round 2 (``rows``: the request of each generated round-2 rollout)."""

    triggered: list[bool]
    requests: list[GenerationRequest] = dataclasses.field(default_factory=list)
    info: list[_Request] = dataclasses.field(default_factory=list)
    rows: list[_Request] = dataclasses.field(default_factory=list)
    fap_prompt_tokens: int = 0
    fap_truncated: int = 0

    def fap_rows(self, b2: RolloutBatch | None) -> list[int]:
        """Indices of the round-2 rollouts sampled from a FAP."""
        return [j for j, inf in enumerate(self.rows) if inf.what == "fap"] if b2 is not None else []

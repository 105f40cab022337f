"""The task protocol: a source of prompts plus a verifier that turns a completion into a reward.

``Problem`` and ``Verdict`` are the two values that cross the task boundary. Both are frozen and
picklable, so problems can travel to worker processes and be stored in checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Split = Literal["train", "eval"]


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer.

    Attributes:
        uid: identifier that is unique within a task and stable across runs with the same
            configuration (used as a cache key for rendered prompts and in logs).
        question: the user-turn text shown to the policy (the system prompt is added separately).
        answer: the reference answer as a string, or ``None`` when the task has no single gold
            answer (some reasoning-gym puzzles accept many answers and score them by rule).
        metadata: task-specific, picklable data the verifier needs (e.g. the reasoning-gym entry).

    Hashing uses ``uid`` only (``metadata`` is a dict and would make the default hash fail);
    equality still compares every field.
    """

    uid: str
    question: str
    answer: str | None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash(self.uid)


@dataclass(frozen=True)
class Verdict:
    """The verifier's judgement of one completion.

    Attributes:
        score: the reward, usually in ``[0, 1]``; partial credit is kept as is (reasoning-gym's
            ``countdown`` gives 0.05 to a wrong but well-formed answer).
        correct: whether the completion counts as solved (``score >= correct_threshold``); this is
            what pass@k and the feedback samplers use.
        feedback: short text for a feedback-guided second attempt (``docs/fbos_rl.md`` §2.4), or
            ``None`` when the answer is correct. Never contains the reference answer.
        extracted: the final answer pulled out of the completion, or ``None`` if none was found.
        source: which extraction rule produced ``extracted`` (``"boxed"``, ``"tag"``,
            ``"phrase"``, ``"last_number"``, ``"none"``), or ``None`` when the verifier did not
            extract (e.g. a user reward function). Lets the trainer log the format-compliance rate.
    """

    score: float
    correct: bool
    feedback: str | None = None
    extracted: str | None = None
    source: str | None = None


@runtime_checkable
class Task(Protocol):
    """What the trainer, samplers and evaluator need from a task.

    Attributes:
        name: short name used in logs and metric keys (``reward_components[name]``).
        system_prompt: the system instruction that fixes the answer format; pass it to
            :func:`rlvr.tasks.prompts.build_messages`.
    """

    name: str
    system_prompt: str

    def problems(self, split: Split) -> list[Problem]:
        """All problems of ``split`` (``"train"`` or ``"eval"``), in a deterministic order.

        Raises:
            ValueError: ``split`` is not ``"train"`` or ``"eval"``.
            DataError: the underlying data cannot be read.
        """
        ...

    def verify(self, problem: Problem, completion: str) -> Verdict:
        """Score ``completion`` (the decoded response text, without the prompt) for ``problem``."""
        ...


def check_split(split: str) -> None:
    """Raise ``ValueError`` unless ``split`` is ``"train"`` or ``"eval"``."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")

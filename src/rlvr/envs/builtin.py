"""Built-in environments over a task's verifier: ``single`` (one turn) and ``feedback`` (retries).

Source: issue 26 item 6. ``single`` is how every existing task runs as an environment: the same prompt
(:func:`rlvr.tasks.prompts.build_messages`) and the same verifier call on the same completion text as
the single-turn :class:`rlvr.rewards.Scorer`, so a recipe gives the same numbers through it.
"""

from __future__ import annotations

from typing import Any

from rlvr.envs.base import ENVS, Environment, Step
from rlvr.rewards.pool import checked_score
from rlvr.tasks.prompts import build_messages

__all__ = ["FeedbackEnv", "SingleTurnEnv", "TaskEnv"]


class TaskEnv(Environment):
    """An episode over ``task``'s problems, prompted with ``system_prompt`` (the run's)."""

    def __init__(self, task: Any, system_prompt: str | None = None) -> None:
        self.task = task
        self.system_prompt = system_prompt
        self.problem: Any = None
        self.reward_name = str(getattr(task, "name", "task"))

    def reset(self, problem: Any) -> list[dict[str, Any]]:
        """The task's prompt: system turn (when set) and the question."""
        self.problem = problem
        return build_messages(problem, self.system_prompt)

    def _judge(self, action: str) -> tuple[float, bool, str | None]:
        verdict = self.task.verify(self.problem, action)
        return checked_score(verdict.score), bool(verdict.correct), verdict.feedback


@ENVS.register("single")
class SingleTurnEnv(TaskEnv):
    """One turn: the model answers, the task's verifier scores it, done.

    The reward is the verifier's score (:func:`rlvr.rewards.pool.checked_score`: a non-finite score is an
    error of this step, the episode then scores 0). ``info["correct"]`` is the verdict.
    """

    observation_roles: tuple[str, ...] = ()  # never appends an observation: any chat template works

    def step(self, action: str) -> Step:
        """Score ``action`` and end the episode."""
        score, correct, feedback = self._judge(action)
        return Step([], score, True, feedback, {"correct": correct})


@ENVS.register("feedback")
class FeedbackEnv(TaskEnv):
    """Up to ``max_retries`` retries: a wrong answer gets the verifier's feedback as the next user turn.

    The reward is the score of the last attempt (given when the episode ends; earlier turns give 0), so
    the return does not grow with the number of tries (interpretation: a retry is a second chance, not
    a second reward). The episode ends at a correct answer, after ``max_retries`` retries, or at
    ``env.max_turns``.

    Args:
        task / system_prompt: from the run.
        max_retries: retries after the first answer (≥ 0).
        retry_message: the user turn after a wrong answer; ``{feedback}`` is replaced by the verifier's
            feedback (or "That is not correct." when it gives none).

    Raises:
        ValueError: ``max_retries < 0``.
    """

    def __init__(self, task: Any, system_prompt: str | None = None, max_retries: int = 1,
                 retry_message: str = "{feedback} Try again.") -> None:
        super().__init__(task, system_prompt)
        if int(max_retries) < 0:
            raise ValueError(f"env.max_retries must be >= 0, got {max_retries}")
        self.max_retries = int(max_retries)
        self.retry_message = retry_message
        self.attempts = 0

    def step(self, action: str) -> Step:
        """Score ``action``; done when correct or out of retries, else the feedback as the next turn."""
        score, correct, feedback = self._judge(action)
        self.attempts += 1
        if correct or self.attempts > self.max_retries:
            return Step([], score, True, feedback, {"correct": correct})
        text = self.retry_message.replace("{feedback}", feedback or "That is not correct.")
        return Step([{"role": "user", "content": text}], 0.0, False, feedback, {"correct": correct})

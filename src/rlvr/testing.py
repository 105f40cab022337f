"""Test utilities: a cheap synthetic task and a tiny-run config, for rlvr's tests and for users'.

Everything here is offline and fast; pair it with :func:`rlvr.models.tiny.build_tiny_model`. Module-level
classes only, so worker processes (reward timeouts) can unpickle them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.tasks.base import Problem, Verdict


@dataclass
class ToyTask:
    """A task whose verifier is cheap and gives within-group variance even for a random model.

    A completion "passes" when it has an even number of characters (a stand-in for correctness).
    Problems are ``"<i> + 1 ="``; train uids are ``train-<i>``, eval uids ``eval-<i>``.

    Args:
        n: problems per split.
        fail_on: problem uids whose verification raises ``RuntimeError`` (to test robustness).
    """

    name: str = "toy"
    system_prompt: str = "Answer with a number."
    n: int = 16
    fail_on: set = field(default_factory=set)

    def problems(self, split: str) -> list[Problem]:
        """``n`` problems of ``split`` (``"train"`` or ``"eval"``, disjoint)."""
        off = 0 if split == "train" else 1000
        return [Problem(uid=f"{split}-{i}", question=f"{i + off} + 1 =", answer=str(i + off + 1)) for i in range(self.n)]

    def verify(self, problem: Problem, completion: str) -> Verdict:
        """Score 1 for an even-length completion, else 0 with feedback.

        Raises:
            RuntimeError: ``problem.uid`` is in ``fail_on``.
        """
        if problem.uid in self.fail_on:
            raise RuntimeError("boom")
        ok = len(completion) % 2 == 0
        return Verdict(score=float(ok), correct=ok, feedback=None if ok else "odd length")


def small_config(output_dir: str | Path, *overrides: str) -> Any:
    """An :class:`rlvr.config.RLConfig` sized for a few-second CPU run on the tiny model:
    2 prompts × 4 completions, 8 new tokens, 2 steps, lr 1e-3, no progress bar.
    Later ``overrides`` (``key=value``) win."""
    from rlvr.config import build_config

    base = [
        "num_generations=4", "generation_batch_size=8", "per_device_train_batch_size=4",
        "max_completion_length=8", "max_prompt_length=64", "max_steps=2", "learning_rate=1e-3",
        f"logging.output_dir={output_dir}", "logging.progress=false", "logging.log_completions_steps=1",
    ]
    return build_config(overrides=base + list(overrides))


class ModelPlanContext:
    """A :class:`rlvr.schedules.PlanContext` over a bare model, for testing schedules without a trainer.

    Args:
        model: the policy ``logprobs`` runs (no grad, eval mode restored).
        pad_token_id: padding id.
        generation_round: the round a schedule plans (1-based; set it between ``plan`` calls).
        settings: the run's loss settings (default :class:`rlvr.core.objective.LossSettings`).
        global_step: optimizer updates done before the plan (set it between ``plan`` calls).
        max_steps: the run's ``max_steps``.
        config: the schedule's config section (``None``: none declared).

    Attributes:
        actions: start actions run through :meth:`reset_optimizer` / :meth:`reshuffle_prompts` (names, in order).
    """

    def __init__(self, model: Any, pad_token_id: int, generation_round: int = 1, settings: Any = None,
                 rows_per_micro: int = 8, global_step: int = 0, max_steps: int = 1, config: Any = None) -> None:
        from rlvr.core.objective import LossSettings

        self.model = model
        self.pad_token_id = pad_token_id
        self.generation_round = generation_round
        self.settings = settings if settings is not None else LossSettings()
        self.rows_per_micro = rows_per_micro
        self.global_step = global_step
        self.max_steps = max_steps
        self.config = config
        self.actions: list[str] = []

    def logprobs(self, batch: Any, *, with_entropy: bool = False):
        """``(logp [N, T], entropy [N, T] | None)`` under :attr:`model` (see :func:`rlvr.trainer.forward.batch_logprobs`)."""
        from rlvr.trainer.forward import batch_logprobs

        return batch_logprobs(self.model, batch, pad_token_id=self.pad_token_id, rows_per_micro=self.rows_per_micro,
                              with_entropy=with_entropy)

    def any_rank(self, flag: bool) -> bool:
        """One process: ``flag`` itself."""
        return bool(flag)

    def reset_optimizer(self) -> None:
        """Record the action (there is no optimizer)."""
        self.actions.append("reset_optimizer")

    def reshuffle_prompts(self) -> None:
        """Record the action (there is no loader)."""
        self.actions.append("reshuffle_prompts")


def even_length_reward(completion: str, problem: Any = None, **_: Any) -> float:
    """``task.reward_fn=rlvr.testing:even_length_reward``: 1.0 for an even number of characters, else
    0.0 — :class:`ToyTask`'s verifier as a reward function, so a command-line run on the tiny model
    (``model.name_or_path=tiny``) sees reward variance within groups (``tests/test_readme.py``)."""
    return float(len(completion) % 2 == 0)

"""The trainer's side of the schedule seam: :class:`TrainerPlanContext` implements
:class:`rlvr.schedules.base.PlanContext` and nothing more, so a schedule cannot reach the model, the
optimizer or the prompt loader.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from rlvr.core.objective import LossSettings
from rlvr.schedules.base import SCHEDULES
from rlvr.trainer.forward import batch_logprobs
from rlvr.types import RolloutBatch


class TrainerPlanContext:
    """:class:`~rlvr.schedules.base.PlanContext` over a :class:`rlvr.trainer.trainer.Trainer`.

    Args:
        trainer: the trainer whose policy, optimizer and loader the methods act on.

    Attributes (read through to the trainer): ``generation_round``, ``pad_token_id``, ``settings``,
    ``global_step``, ``max_steps``, ``config`` (the schedule's declared config section).
    """

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer

    @property
    def generation_round(self) -> int:
        """1-based index of the generation round just drawn."""
        return int(self._trainer.generation_round)

    @property
    def pad_token_id(self) -> int:
        """The tokenizer's padding id."""
        return int(self._trainer.pad_token_id)

    @property
    def settings(self) -> LossSettings:
        """The run's loss settings."""
        return self._trainer.settings

    @property
    def global_step(self) -> int:
        """Optimizer updates done so far (checkpointed and restored by the trainer)."""
        return int(self._trainer.global_step)

    @property
    def max_steps(self) -> int:
        """The run's ``max_steps``."""
        return int(self._trainer.cfg.max_steps)

    @property
    def config(self) -> Any:
        """The run's section for the schedule (``SCHEDULES.section_of(cfg.schedule)``), or ``None``."""
        cfg = self._trainer.cfg
        name = SCHEDULES.section_of(cfg.schedule)
        return None if name is None else getattr(cfg, name)

    def logprobs(self, batch: RolloutBatch, *, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """No-grad ``(logp [N, T], entropy [N, T] | None)`` under the current policy (micro-batched with the
        run's ``per_device_train_batch_size``, ``logprob_chunk_size`` and ``share_prompt_forward``)."""
        t, cfg = self._trainer, self._trainer.cfg
        return batch_logprobs(
            t.model, batch, pad_token_id=t.pad_token_id, rows_per_micro=cfg.per_device_train_batch_size,
            chunk_size=cfg.logprob_chunk_size, with_entropy=with_entropy, share_prompt=cfg.share_prompt_forward,
        )

    def any_rank(self, flag: bool) -> bool:
        """``flag`` on any rank (one all-reduce under ``torchrun``; ``flag`` itself in one process)."""
        t = self._trainer
        if t.dp is None or t.world_size == 1:
            return bool(flag)
        return t.dp.max([float(bool(flag))])[0] > 0

    def reset_optimizer(self) -> None:
        """Clear the optimizer's per-parameter state (AdamW moments); the LR schedule continues."""
        self._trainer.optimizer.state = defaultdict(dict)

    def reshuffle_prompts(self) -> None:
        """Move the prompt loader to the start of a fresh shuffle (its next epoch)."""
        self._trainer.loader.reshuffle()

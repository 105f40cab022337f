"""The prompt loader: an endless, seeded, epoch-wrapping shuffle over a task's training problems."""

from __future__ import annotations

from typing import Any, Sequence

import torch


class PromptLoader:
    """Yields problems in a seeded random order, reshuffling at every epoch boundary.

    Its position is part of a checkpoint (:meth:`state_dict`), so a resumed run continues with the
    very prompts it would have seen.

    Args:
        problems: the training problems (non-empty).
        seed: shuffling seed.

    Raises:
        ValueError: ``problems`` is empty.
    """

    def __init__(self, problems: Sequence[Any], seed: int) -> None:
        if not problems:
            raise ValueError("PromptLoader: the task has no training problems")
        self.problems = list(problems)
        self.seed = seed
        self.epoch = 0
        self.pos = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.problems), generator=g).tolist()

    def next(self, k: int) -> list[Any]:
        """The next ``k`` problems (wrapping into a fresh shuffle when an epoch ends)."""
        out = []
        while len(out) < k:
            if self.pos >= len(self._order):
                self.epoch += 1
                self.pos = 0
                self._order = self._permutation(self.epoch)
            out.append(self.problems[self._order[self.pos]])
            self.pos += 1
        return out

    def reshuffle(self) -> None:
        """Start a fresh shuffle now (the next epoch), dropping the rest of this one."""
        self.load_state_dict({**self.state_dict(), "epoch": self.epoch + 1, "pos": 0})

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "pos", "seed"}``: enough to continue exactly."""
        return {"epoch": self.epoch, "pos": self.pos, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore a position saved by :meth:`state_dict`."""
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.pos = int(state["pos"])
        self._order = self._permutation(self.epoch)

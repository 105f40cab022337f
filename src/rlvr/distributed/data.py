"""Rank-aware prompt drawing: every rank draws its own prompts, none twice in one round."""

from __future__ import annotations

from typing import Any


class RankPromptLoader:
    """Wraps a :class:`rlvr.trainer.data.PromptLoader` so that each rank gets its own slice of one
    global draw.

    ``next(k)`` on rank ``r`` of ``W`` draws ``k·W`` problems from the shared seeded order (every rank
    advances its copy of the loader identically) and returns items ``[r·k, (r+1)·k)``. So the draw is
    deterministic from seed, round and rank; within one draw no problem reaches two ranks (as long as
    ``k·W`` does not exceed the training set, where the epoch-wrapping order may repeat one); and a
    2-rank run with ``k`` prompts per rank sees the very prompts a 1-process run with ``2k`` sees.
    The loader's state is the same on every rank, so a checkpoint stores it once and a resumed job on
    another world size continues the same prompt order.

    Args:
        loader: the shared-order loader (``next``, ``state_dict``, ``load_state_dict``, ``problems``).
        rank: this rank.
        world_size: number of ranks.

    Raises:
        ValueError: ``rank`` not in ``[0, world_size)``.
    """

    def __init__(self, loader: Any, rank: int, world_size: int) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"RankPromptLoader: rank {rank} not in [0, {world_size})")
        self.inner = loader
        self.rank = rank
        self.world_size = world_size

    @property
    def problems(self) -> list[Any]:
        """The training problems (all of them, as the inner loader holds them)."""
        return self.inner.problems

    def next(self, k: int) -> list[Any]:
        """This rank's ``k`` problems of the next global draw of ``k × world_size``."""
        drawn = self.inner.next(k * self.world_size)
        return drawn[self.rank * k : (self.rank + 1) * k]

    def reshuffle(self) -> None:
        """The inner loader's fresh shuffle (the same on every rank)."""
        self.inner.reshuffle()

    def __getattr__(self, name: str) -> Any:
        """The inner loader's other attributes (a mixture's ``set_step``, ``observe``, ``labels``, ...)."""
        if name == "inner":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def state_dict(self) -> dict[str, int]:
        """The inner loader's position (identical on every rank)."""
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore :meth:`state_dict`."""
        self.inner.load_state_dict(state)

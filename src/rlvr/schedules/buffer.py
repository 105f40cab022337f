"""A FIFO buffer of rollout rows with an admission predicate, for schedules that train on stored rows
(UEC-RL's pending and replay buffers; reusable by any schedule). Checkpoint state goes through the one
batch serialiser, :mod:`rlvr.rollout_io`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from rlvr.rollout_io import rollouts_from_state, rollouts_to_state
from rlvr.types import RolloutBatch

AdmitFn = Callable[[RolloutBatch], torch.Tensor]
"""Admission predicate: ``batch -> [N] bool`` (rows to admit)."""

def _compact(batch: RolloutBatch) -> RolloutBatch:
    """Keep only the problems the rows reference (remapping ``prompt_index``) and drop the per-batch
    ``metrics`` and sampler structure (a buffer holds rows from many rounds)."""
    used = sorted(set(batch.prompt_index.tolist()))
    remap = {old: new for new, old in enumerate(used)}
    batch.problems = [batch.problems[i] for i in used] if batch.problems else []
    batch.prompt_index = torch.tensor([remap[i] for i in batch.prompt_index.tolist()], dtype=torch.long)
    batch.metrics, batch.tree_index, batch.fbos_parent_row, batch.generated_tokens = {}, None, None, None
    return batch


class TrajectoryBuffer:
    """FIFO buffer of rollout rows with an admission predicate.

    Rows are kept as one :class:`RolloutBatch` (``[S, T]`` fields padded to the widest stored row),
    oldest first. When a push exceeds ``capacity`` the oldest rows are evicted (the newest are kept).

    Args:
        capacity: most rows held (≥ 1).
        pad_token_id: padding id for ``completion_ids``.
        admit: optional predicate applied by :meth:`push` (``None`` admits every row).

    Attributes:
        seq: ``[S]`` admission sequence numbers of the stored rows (increasing: FIFO order).
        admitted_total, evicted_total: counters.

    Raises:
        ValueError: ``capacity < 1``.

    Source: docs/uec_rl.md §9, implementation notes (a generic ``TrajectoryBuffer(capacity,
    admission_predicate, sample_mode)``) and §2.5 (FIFO, newest kept) [code-precedent].
    """

    def __init__(self, capacity: int, pad_token_id: int, admit: AdmitFn | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"TrajectoryBuffer: capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.pad_token_id = pad_token_id
        self.admit = admit
        self.data: RolloutBatch | None = None
        self.seq: list[int] = []
        self.next_seq = 0
        self.admitted_total = 0
        self.evicted_total = 0

    def __len__(self) -> int:
        return 0 if self.data is None else len(self.data)

    @property
    def full(self) -> bool:
        """True when the buffer holds ``capacity`` rows."""
        return len(self) >= self.capacity

    def push(self, batch: RolloutBatch, mask: torch.Tensor | None = None) -> int:
        """Admit rows of ``batch`` (``mask`` ``[N]`` bool, else the admission predicate, else all).

        Returns:
            the number of rows admitted (before any eviction).

        Raises:
            ValueError: the rows have a different set of fields than the stored ones (e.g. ``old_logp``
                set on some rows only).
        """
        if mask is None:
            mask = self.admit(batch) if self.admit is not None else torch.ones(len(batch), dtype=torch.bool)
        idx = torch.as_tensor(mask, dtype=torch.bool).nonzero(as_tuple=True)[0]
        if idx.numel() == 0:
            return 0
        rows = _compact(batch.select(idx))
        if self.data is None:
            self.data = rows
        else:
            try:
                merged = RolloutBatch.concat([self.data, rows], self.pad_token_id)
            except ValueError as exc:
                raise ValueError(f"TrajectoryBuffer.push: rows do not match the stored ones: {exc}") from None
            self.data = _compact(merged)
        n = int(idx.numel())
        self.seq += list(range(self.next_seq, self.next_seq + n))
        self.next_seq += n
        self.admitted_total += n
        over = len(self) - self.capacity
        if over > 0:
            self.evicted_total += over
            self._keep(list(range(over, len(self))))
        return n

    def _keep(self, rows: list[int]) -> None:
        if not rows:
            self.data, self.seq = None, []
            return
        assert self.data is not None
        self.data = _compact(self.data.select(rows))
        self.seq = [self.seq[i] for i in rows]

    def pop_oldest(self, k: int) -> RolloutBatch:
        """Remove and return the ``k`` oldest rows (``0 < k ≤ len``).

        Raises:
            ValueError: ``k`` out of range.
        """
        if not 0 < k <= len(self):
            raise ValueError(f"TrajectoryBuffer.pop_oldest: k={k} not in [1, {len(self)}]")
        assert self.data is not None
        out = self.data.select(list(range(k)))
        self._keep(list(range(k, len(self))))
        return out

    def sample(self, k: int, generator: torch.Generator | None = None) -> tuple[RolloutBatch, list[int]]:
        """``k`` rows drawn uniformly without replacement (they stay in the buffer).

        Returns:
            ``(rows, positions)`` — positions index the current buffer (for :meth:`remove`).

        Raises:
            ValueError: ``k`` out of range.
        """
        if not 0 < k <= len(self):
            raise ValueError(f"TrajectoryBuffer.sample: k={k} not in [1, {len(self)}]")
        assert self.data is not None
        pos = sorted(torch.randperm(len(self), generator=generator)[:k].tolist())
        return self.data.select(pos), pos

    def all(self) -> RolloutBatch:
        """Every stored row, oldest first (they stay in the buffer).

        Raises:
            ValueError: the buffer is empty.
        """
        if self.data is None:
            raise ValueError("TrajectoryBuffer.all: the buffer is empty")
        return self.data.select(list(range(len(self))))

    def remove(self, positions: list[int]) -> None:
        """Drop the rows at ``positions`` (indices into the current buffer)."""
        drop = set(positions)
        self._keep([i for i in range(len(self)) if i not in drop])

    # ------------------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """Plain state: the stored rows' tensors under ``"tensors"`` (name → tensor), the rest JSON-serialisable
        (the rows through :func:`rlvr.rollout_io.rollouts_to_state`, the one batch serialiser)."""
        state: dict[str, Any] = {
            "capacity": self.capacity, "seq": list(self.seq), "next_seq": self.next_seq,
            "admitted_total": self.admitted_total, "evicted_total": self.evicted_total, "tensors": {},
        }
        if self.data is not None:
            state["tensors"], state["rows"] = rollouts_to_state(self.data, warn=False)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (bit-identical tensors)."""
        self.capacity = int(state["capacity"])
        self.seq = list(state["seq"])
        self.next_seq = int(state["next_seq"])
        self.admitted_total = int(state["admitted_total"])
        self.evicted_total = int(state["evicted_total"])
        rows = state.get("rows")
        self.data = None if rows is None else rollouts_from_state(state.get("tensors", {}), rows, where="replay buffer")

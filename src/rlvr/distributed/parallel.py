"""The data-parallel context the trainer's hooks call: reductions, gradient sync, sharded forwards.

One object per rank (:class:`DataParallel`). The trainer and ``policy_update`` call it at a few fixed
points; every call is a collective that every rank makes in the same order, whatever rows it holds:

========================== =================================================================
hook                       what it does across ranks
========================== =================================================================
``sum(values)``            all-reduce (sum) of a few floats: loss normalisers, counts
``max(values)``            all-reduce (max): e.g. the number of optimizer batches in a round
``accumulate(model)``      FSDP: gather parameters once for a whole update (``fsdp.unsharded``)
``reduce_gradients(...)``  replicated: one flat all-reduce of all gradients; FSDP: reduce-scatter
``grad_norm_clip(...)``    global-norm clipping over (sharded) gradients, returns the global norm
``inference(model)``       FSDP: gather parameters for a no-grad log-prob pass, reshard after
``gather(obj)``            all-gather of a small Python object (metric rows)
========================== =================================================================

Gradients are the sum over ranks of each rank's loss gradient: each rank's loss is its share of the
job's loss (numerators over all-reduced denominators), and since both reductions here average (as DDP
and FSDP do), the caller multiplies its loss by :attr:`loss_scale`.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist

from rlvr.distributed.env import DistEnv
from rlvr.distributed.fsdp import RUNNER_ATTR, reduce_gradients, unsharded

__all__ = ["DataParallel"]


class DataParallel:
    """Collective hooks of one rank.

    Args:
        env: this process's :class:`~rlvr.distributed.env.DistEnv` (a process group must exist when
            ``env.world_size > 1``).
        fsdp: the policy is sharded with :func:`rlvr.distributed.fsdp.shard_policy` (else it is
            replicated and gradients are all-reduced).
        pad_token_id: token of the dummy forward that drives FSDP's gradient reduction.
    """

    def __init__(self, env: DistEnv, *, fsdp: bool, pad_token_id: int = 0) -> None:
        self.env = env
        self.fsdp = fsdp
        self.pad_token_id = pad_token_id

    # ------------------------------------------------------------------ identity
    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_main(self) -> bool:
        return self.env.is_main

    @property
    def _active(self) -> bool:
        return self.env.backend is not None and dist.is_initialized()

    @property
    def _reduce_device(self) -> torch.device:
        return self.env.device if self.env.backend == "nccl" else torch.device("cpu")

    # ------------------------------------------------------------------ reductions
    def _reduce(self, values: Sequence[float], op: Any) -> list[float]:
        if not self._active:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self._reduce_device)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over ranks of ``values`` (float64; one all-reduce)."""
        return self._reduce(values, dist.ReduceOp.SUM if self._active else None)

    def max(self, values: Sequence[float]) -> list[float]:
        """Element-wise max over ranks of ``values``."""
        return self._reduce(values, dist.ReduceOp.MAX if self._active else None)

    def gather(self, obj: Any) -> list[Any]:
        """``[obj of rank 0, obj of rank 1, ...]`` on every rank (``all_gather_object``)."""
        if not self._active:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` on every rank."""
        if not self._active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def barrier(self) -> None:
        """Wait for every rank."""
        if self._active:
            dist.barrier()

    def loss_scale(self, loss_norm_scope: str) -> float:
        """Factor on each rank's loss: ``world_size`` with global normalisers (the averaging gradient
        reduction then yields the sum of the ranks' shares), 1 with ``micro`` scope (rank-local means,
        averaged over ranks as in TRL/DDP)."""
        return float(self.world_size) if loss_norm_scope == "global" else 1.0

    # ------------------------------------------------------------------ model hooks
    @staticmethod
    def _root(model: torch.nn.Module) -> torch.nn.Module | None:
        return getattr(model, RUNNER_ATTR, None)

    @contextlib.contextmanager
    def accumulate(self, model: torch.nn.Module) -> Iterator[None]:
        """Body: the micro-batch forwards/backwards of one update (FSDP: parameters gathered once)."""
        root = self._root(model) if self.fsdp else None
        if root is None:
            yield
            return
        with unsharded(root, training=True):
            yield

    @contextlib.contextmanager
    def inference(self, model: torch.nn.Module) -> Iterator[None]:
        """Body: a no-grad pass over ``model`` (FSDP: gathered before, resharded after)."""
        root = self._root(model) if self.fsdp else None
        if root is None:
            yield
            return
        with unsharded(root, training=False):
            yield

    def reduce_gradients(self, model: torch.nn.Module) -> None:
        """Average the accumulated gradients over ranks (call once per update, on every rank).

        Replicated: every trainable parameter's gradient (zeros where ``None``) is flattened into one
        buffer and all-reduced. FSDP: :func:`rlvr.distributed.fsdp.reduce_gradients`.
        """
        if not self._active:
            return
        root = self._root(model) if self.fsdp else None
        if root is not None:
            reduce_gradients(root, self.pad_token_id)
            return
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat.div_(self.world_size)
        off = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[off : off + n].view_as(p.grad))
            off += n

    def grad_norm_clip(self, params: Sequence[torch.nn.Parameter], max_norm: float | None) -> float:
        """Clip to the global L2 norm over every rank's (shard of the) gradients; returns that norm.

        With sharded (``DTensor``) gradients ``clip_grad_norm_`` already reduces the norm over the mesh;
        its result is made a plain float with ``full_tensor()``.
        """
        norm = torch.nn.utils.clip_grad_norm_(list(params), max_norm if max_norm else math.inf)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return float(norm)

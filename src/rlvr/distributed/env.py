"""The process group: who am I, on which device, with which backend, using how many CPU threads.

``torchrun`` (and every launcher built on ``torch.distributed.run``) sets ``WORLD_SIZE``, ``RANK``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``; :func:`init_distributed` reads
them, so ``torchrun --nnodes/--node-rank/--rdzv-endpoint`` work exactly as torchrun documents them.
Without ``WORLD_SIZE`` (plain ``rlvr train``) no process group is created and everything here answers
for one process.
"""

from __future__ import annotations

import datetime
import os
from typing import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["DistEnv", "init_distributed", "is_launched", "launched_world_size", "resolve_device", "set_cpu_threads",
           "shutdown"]


def is_launched(env: Mapping[str, str] | None = None) -> bool:
    """A launcher started this process: ``torchrun`` sets both ``WORLD_SIZE`` and ``RANK`` (``env``, default
    ``os.environ``); one without the other is a one-process run."""
    env = os.environ if env is None else env
    return "WORLD_SIZE" in env and "RANK" in env


def launched_world_size(env: Mapping[str, str] | None = None) -> int:
    """The world size a launcher set (``WORLD_SIZE``), 1 when not launched (:func:`is_launched`).

    Raises:
        ValueError: ``WORLD_SIZE`` is set (with ``RANK``) but is not an integer.
    """
    env = os.environ if env is None else env
    return int(env["WORLD_SIZE"]) if is_launched(env) else 1


@dataclass(frozen=True)
class DistEnv:
    """Where this process stands in the job.

    Attributes:
        rank: global rank ``0 ≤ rank < world_size``.
        world_size: number of processes in the job (1 without torchrun).
        local_rank: rank on this machine (selects the CUDA device).
        local_world_size: processes on this machine.
        device: the ``torch.device`` this rank trains on.
        backend: ``"gloo"`` (CPU), ``"nccl"`` (CUDA), or ``None`` when no process group exists.
        threads: intra-op CPU threads of this process (``torch.get_num_threads()`` after setup).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")
    backend: str | None = None
    threads: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes logs, the final model and prints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """A process group exists (``world_size > 1`` or torchrun with one process)."""
        return self.backend is not None


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """The device for ``device: auto|cpu|cuda`` (``auto``: CUDA when available, else CPU).

    Raises:
        ValueError: ``cuda`` was asked for but torch sees no CUDA device, or an unknown name.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device=cuda but torch sees no CUDA device (use device=cpu or device=auto)")
        return torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
    raise ValueError(f"device: expected auto, cpu or cuda, got {device!r}")


def set_cpu_threads(requested: int, local_world_size: int) -> int:
    """Set ``torch.set_num_threads`` for a CPU rank and return the value in effect.

    ``requested > 0`` wins. Otherwise ``OMP_NUM_THREADS`` (torchrun sets it to 1 when it starts more than
    one process per machine) wins, else the machine's usable cores divided by the processes on it.
    Interpretation: ranks on one machine share its cores; oversubscribing them (each rank using every
    core) makes OpenMP threads wait on each other, which on a 2-core machine costs more than it gains.
    """
    if requested > 0:
        n = requested
    elif os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        n = int(os.environ["OMP_NUM_THREADS"])
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        n = max(1, cores // max(local_world_size, 1))
    torch.set_num_threads(n)
    return torch.get_num_threads()


def init_distributed(
    device: str = "auto", *, backend: str = "auto", timeout_s: float = 600.0, num_threads: int = 0,
) -> DistEnv:
    """Join the torchrun job described by the environment, or describe a single process.

    Args:
        device: ``auto``, ``cpu`` or ``cuda`` (see :func:`resolve_device`).
        backend: ``auto`` (``nccl`` on CUDA, ``gloo`` on CPU), ``gloo`` or ``nccl``.
        timeout_s: collective timeout. A rank that dies leaves the others blocked in a collective for
            at most this long before they fail (and torchrun then stops the job). Interpretation: the
            default 10 minutes covers a slow generation round on CPU; lower it for fast failure.
        num_threads: CPU intra-op threads per process, 0 = automatic (:func:`set_cpu_threads`).

    Returns:
        the :class:`DistEnv`. A process group is created only when ``WORLD_SIZE`` is set.

    Raises:
        ValueError: ``nccl`` on a CPU device, an unknown backend, or a bad device.
    """
    env = os.environ
    launched = is_launched(env)
    world = launched_world_size(env)
    rank = int(env.get("RANK", 0)) if launched else 0
    local_rank = int(env.get("LOCAL_RANK", 0)) if launched else 0
    local_world = int(env.get("LOCAL_WORLD_SIZE", world)) if launched else 1
    dev = resolve_device(device, local_rank)
    if backend == "auto":
        backend = "nccl" if dev.type == "cuda" else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"distributed.backend: expected auto, gloo or nccl, got {backend!r}")
    if backend == "nccl" and dev.type != "cuda":
        raise ValueError("distributed.backend=nccl needs device=cuda (gloo is the CPU backend)")
    threads = set_cpu_threads(num_threads, local_world) if dev.type == "cpu" else torch.get_num_threads()
    if not launched:
        return DistEnv(device=dev, threads=threads)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        kw = {"device_id": dev} if dev.type == "cuda" else {}
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kw)
    return DistEnv(rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
                   device=dev, backend=backend, threads=threads)


def shutdown() -> None:
    """Destroy the process group if one exists (idempotent)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()

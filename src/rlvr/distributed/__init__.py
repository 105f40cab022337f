"""Scale-out on ``torch.distributed``: process group, rank-aware prompt drawing, all-reduced normalisers
and metrics, FSDP2 sharding, weight sync to the generation engine, DCP checkpoints.

Layering: this package sits beside the trainer (it imports ``core``, ``models`` and ``types``, never
``trainer`` or ``cli``); the trainer calls it through :class:`~rlvr.distributed.parallel.DataParallel`.
Launch: ``torchrun --nproc_per_node N -m rlvr train ...`` (``docs/usage.md``, "Many processes and machines").
"""

from rlvr.distributed.data import RankPromptLoader
from rlvr.distributed.env import DistEnv, init_distributed, resolve_device, set_cpu_threads, shutdown
from rlvr.distributed.metrics import reduce_metric_dicts, reduction_for
from rlvr.distributed.parallel import DataParallel

__all__ = [
    "DataParallel", "DistEnv", "RankPromptLoader", "init_distributed", "reduce_metric_dicts", "reduction_for",
    "resolve_device", "set_cpu_threads", "shutdown",
]

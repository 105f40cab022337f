"""Generation on full weights: a version counter and one sync point that any engine plugs into.

The trainer counts optimizer steps that changed the weights (``weight_version``). Before a generation
round it calls ``WeightSync.push`` when the engine's version is older; the default
(:class:`ModuleCopySync`) copies the full (gathered) tensors into a separate full copy of the policy
that the transformers engine generates with. A vLLM engine implements the same protocol (e.g. write
the tensors and reload, or stream them) and needs nothing else from the trainer.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Protocol, runtime_checkable

import torch

__all__ = ["WeightSync", "ModuleCopySync", "full_named_tensors"]


@runtime_checkable
class WeightSync(Protocol):
    """Where trained weights go before generation.

    ``version`` is the trainer's ``weight_version`` (optimizer steps taken); ``push`` is called on every
    rank, in the same order, with the same names; each rank's engine then generates with exactly those
    tensors. ``named_tensors`` yields ``(name, full tensor)`` pairs with the trained model's
    ``state_dict`` names (no FSDP prefix); a tensor may be freed by the caller once the next is drawn.
    """

    version: int

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Make the engine use these weights from now on."""


def full_named_tensors(
    model: torch.nn.Module, keep: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of ``model.state_dict()`` with sharded ``DTensor`` s gathered to full tensors.

    A collective when the model is sharded: every rank must drain the iterator (one all-gather per
    tensor, in ``state_dict`` order). ``keep(name)`` selects tensors (the same names on every rank; e.g.
    a LoRA policy's adapter tensors only); default all.
    """
    for name, t in model.state_dict().items():
        if keep is not None and not keep(name):
            continue
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        yield name, t.detach()


class ModuleCopySync:
    """Copies pushed tensors into ``target`` (a full, unsharded copy of the policy) in place.

    Memory: one more full copy of the parameters per rank (in the target's dtype), e.g. 0.54 GB for a
    135M-parameter model in fp32. Tied weights are copied once (the same storage).

    Args:
        target: the generation model (same architecture and ``state_dict`` names as the trained one).

    Raises:
        KeyError: a pushed name the target does not have (on push).
    """

    def __init__(self, target: torch.nn.Module) -> None:
        self.target = target
        self.version = 0
        self._params = dict(target.state_dict(keep_vars=True))

    @torch.no_grad()
    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy each ``(name, tensor)`` into the target and record ``version``."""
        for name, t in named_tensors:
            if name not in self._params:
                raise KeyError(f"ModuleCopySync: the generation model has no tensor {name!r}")
            dst = self._params[name]
            dst.data.copy_(t.to(device=dst.device, dtype=dst.dtype))
        self.version = version

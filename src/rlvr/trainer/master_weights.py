"""bf16 weights with a float32 master copy held by the optimizer (``model.dtype=bf16-master``).

The model's trainable weights are stored in bfloat16, so the forward and backward run in bf16 with no
autocast and no per-micro-batch cast of any weight (what ``bf16-pure`` costs). What ``bf16-pure`` loses is
kept here, in :class:`MasterWeightAdamW`:

* **float32 master weights.** AdamW updates an fp32 copy of every bf16 weight; after each step the masters
  are rounded into the bf16 weights, once per optimizer step (``torch._foreach_copy_``), not once per
  micro-batch as autocast converts them. An update smaller than half a bf16 quantum (a relative
  ``2**-9``: at a weight of 0.02 anything below ~4e-5) is not lost, it accumulates in the master.
* **float32 gradient accumulation.** A post-accumulate-grad hook on each bf16 weight adds its gradient into
  the master's fp32 ``.grad`` as soon as the micro-batch's backward has produced it, and frees the bf16
  one; the sum over micro-batches is never rounded to bf16. Clipping, the masks' rescale and the
  ``actor/grad_norm`` metric read the masters' gradients (:func:`rlvr.trainer.optim.gradient_params`).
* **float32 optimizer state** (AdamW's moments are kept for the fp32 masters).

Checkpoints keep the masters (:meth:`MasterWeightAdamW.state_dict` adds them under ``"master_weights"``),
so a resumed run continues from the fp32 values, not from their bf16 rounding; the exported ``final/`` folder
holds the bf16 weights only (what inference runs), and ``--resume force`` into another precision does not carry
the masters over (an fp32 optimizer ignores them; a ``bf16-master`` resume of an fp32 checkpoint makes its
masters from the weights). The masters start from the
model's bf16 weights, as DeepSpeed's bf16 optimizer starts them: a pretrained fp32 checkpoint is rounded
once, at load, exactly as under ``bf16-pure``. Weights that are already float32 (peft's LoRA adapters,
which it keeps in fp32 over a bf16 base) are updated in place with no copy.

Not for data parallelism: under ``torchrun`` FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16)`` already
gives fp32 sharded masters with bf16 compute copies (``model.dtype=bf16``), and the DDP-style gradient
reduction reads the model's own ``.grad``; :func:`rlvr.trainer.components.validate_run` refuses the
combination.

Source: Micikevicius et al. (2018), "Mixed Precision Training", §3.1 (an fp32 master copy of the weights,
updated with the reduced-precision gradients); the bf16 variant with fp32 gradient accumulation follows
Megatron-LM's ``Float16OptimizerWithFloat16Params`` and DeepSpeed's ``BF16_Optimizer``. Interpretation
(issue 28): on a CPU with native bf16, ``bf16`` (autocast over fp32 masters) converts every weight each
micro-batch and keeps the residual stream in fp32, which left its update at 1.53x fp32 against
``bf16-pure``'s 2.37x (``benchmarks/bench_update_dtype.py``); this mode has ``bf16-pure``'s forward and
backward with the masters' precision.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

__all__ = ["MasterWeightAdamW", "accumulate_gradient"]


class MasterWeightAdamW(torch.optim.AdamW):
    """AdamW over float32 master copies of a model's low-precision trainable weights.

    Args:
        params: the model's parameters, or parameter groups (dicts with ``"params"`` and per-group options, as
            ``torch.optim.AdamW`` takes them); those with ``requires_grad`` are trained (the others are
            ignored). Float32 ones are optimized directly; every other floating dtype (bf16, fp16) gets an fp32
            master.
        **kwargs: ``torch.optim.AdamW``'s (``lr``, ``betas``, ``eps``, ``weight_decay``, ``fused``...).

    Attributes:
        model_params: the trainable model weights, in order.
        master_params: their fp32 masters (the same tensor for an fp32 weight); what the optimizer steps
            and where the accumulated gradient lives.

    The gradient of a bf16 weight reaches its master after every backward (the hook), so after a backward
    ``model_params[i].grad`` is None and ``master_params[i].grad`` holds the fp32 sum. :meth:`step` steps the
    masters and then copies them into the bf16 weights; :meth:`zero_grad` clears both sides.

    Raises:
        ValueError: no trainable parameter, or one that is not floating point.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]], **kwargs: Any) -> None:
        items = list(params)
        groups = items if items and isinstance(items[0], dict) else [{"params": items}]
        model_params: list[torch.nn.Parameter] = []
        masters: list[torch.Tensor] = []
        master_groups = []
        for group in groups:
            trainable = [p for p in group["params"] if p.requires_grad]
            bad = [tuple(p.shape) for p in trainable if not p.is_floating_point()]
            if bad:
                raise ValueError(f"MasterWeightAdamW: trainable parameters must be floating point; got shapes {bad[:3]}")
            ms = [p if p.dtype == torch.float32 else torch.nn.Parameter(p.detach().float().clone()) for p in trainable]
            model_params += trainable
            masters += ms
            master_groups.append({**group, "params": ms})
        if not model_params:
            raise ValueError("MasterWeightAdamW: no trainable parameter (every requires_grad is False)")
        super().__init__([g for g in master_groups if g["params"]], **kwargs)
        self.model_params = model_params
        self.master_params = masters
        self._low = [(p, m) for p, m in zip(model_params, masters) if m is not p]
        self._hooks = [p.register_post_accumulate_grad_hook(_accumulate_into(m)) for p, m in self._low]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One AdamW step on the fp32 masters, then the masters rounded into the bf16 weights (one cast
        per weight per step)."""
        loss = super().step(closure)
        self.sync_model_weights()
        return loss

    @torch.no_grad()
    def sync_model_weights(self) -> None:
        """Copy the fp32 masters into the model's low-precision weights (round to nearest)."""
        if self._low:
            torch._foreach_copy_([p for p, _ in self._low], [m for _, m in self._low])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the masters' gradients and any gradient still on a bf16 weight (a backward that stopped
        before its hooks ran)."""
        super().zero_grad(set_to_none=set_to_none)
        for p, _ in self._low:
            p.grad = None

    def state_dict(self) -> dict[str, Any]:
        """AdamW's state dict plus ``"master_weights"``: the fp32 masters in ``model_params`` order (the
        bf16 weights alone cannot restore them)."""
        sd = super().state_dict()
        sd["master_weights"] = [m.detach() for m in self.master_params]
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load AdamW's state and, when present, the fp32 masters (then round them into the model's weights).

        Raises:
            ValueError: ``master_weights`` has a different count or a different shape than this optimizer's
                masters (a checkpoint of another model).
        """
        state_dict = dict(state_dict)
        masters = state_dict.pop("master_weights", None)
        super().load_state_dict(state_dict)
        if masters is None:  # a checkpoint written without masters: keep the ones made from the weights
            return
        if len(masters) != len(self.master_params):
            raise ValueError(f"optimizer state: {len(masters)} master weights, this model trains "
                             f"{len(self.master_params)} parameters")
        with torch.no_grad():
            for i, (m, saved) in enumerate(zip(self.master_params, masters)):
                if tuple(saved.shape) != tuple(m.shape):
                    raise ValueError(f"optimizer state: master weight {i} has shape {tuple(saved.shape)}, "
                                     f"the model's parameter {tuple(m.shape)}")
                m.copy_(saved)
        self.sync_model_weights()


def accumulate_gradient(p: torch.Tensor, master: torch.Tensor) -> None:
    """Move a low-precision weight's ``p.grad`` into ``master.grad`` (float32): converted when the master has
    none yet, else added in float32; ``p.grad`` is then freed (None). What the post-accumulate-grad hook of
    :class:`MasterWeightAdamW` runs after each backward."""
    g = p.grad
    if g is None:
        return
    if master.grad is None:
        master.grad = g.to(torch.float32)
    else:
        master.grad.add_(g)
    p.grad = None


def _accumulate_into(master: torch.Tensor):
    """The post-accumulate-grad hook of a low-precision weight whose master is ``master``."""

    def hook(p: torch.Tensor) -> None:
        accumulate_gradient(p, master)

    return hook

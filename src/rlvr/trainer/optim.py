"""Optimizer and learning-rate schedule (AdamW with linear warmup, then constant, linear or cosine)."""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: Any, *, master_weights: bool = False) -> torch.optim.AdamW:
    """AdamW over the trainable ``params`` with the config's ``learning_rate``, betas, eps and decay.

    Uses torch's fused kernel when every parameter is a floating-point tensor on CPU or CUDA (the same
    update; on a 2-core CPU a step over SmolLM2-135M takes 0.06 s fused vs 0.20 s with the default
    per-parameter loop, ``benchmarks/results/bench_optimizer.json``), the default implementation otherwise.
    With ``master_weights`` (the ``bf16-master`` precision, :attr:`rlvr.precision.PrecisionPolicy.master_weights`)
    it is a :class:`~rlvr.trainer.master_weights.MasterWeightAdamW`: fp32 masters of the bf16 weights, fp32
    gradient accumulation, the same fused kernel on the masters.
    """
    trainable = [p for p in params if p.requires_grad]
    kw: dict[str, Any] = dict(lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_epsilon,
                              weight_decay=cfg.weight_decay)
    cls: type[torch.optim.AdamW] = torch.optim.AdamW
    if master_weights:
        from rlvr.trainer.master_weights import MasterWeightAdamW

        cls = MasterWeightAdamW
    if trainable and all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in trainable):
        try:
            return cls(trainable, fused=True, **kw)
        except (RuntimeError, ValueError):  # a device/dtype this torch build has no fused kernel for
            pass
    return cls(trainable, **kw)


def gradient_params(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """The tensors whose ``.grad`` holds the accumulated gradient of an update: the optimizer's fp32
    masters under ``bf16-master`` (:attr:`~rlvr.trainer.master_weights.MasterWeightAdamW.master_params`),
    else the model's trainable parameters (after a data-parallel reduction: FSDP's shards)."""
    masters = getattr(optimizer, "master_params", None)
    if masters is not None:
        return list(masters)
    return [p for p in model.parameters() if p.requires_grad]


def lr_lambda(step: int, *, warmup_steps: int, total_steps: int, kind: str) -> float:
    """Multiplier of the base learning rate at optimizer step ``step`` (0-based).

    Linear warmup over ``warmup_steps`` from ``1/warmup_steps`` to 1, then ``constant``, ``linear``
    decay to 0 at ``total_steps``, or ``cosine`` decay to 0 (the usual transformers schedules).

    Raises:
        ValueError: unknown ``kind``.
    """
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if kind == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    progress = min(max(progress, 0.0), 1.0)
    if kind == "linear":
        return 1.0 - progress
    if kind == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"lr_scheduler_type: unknown schedule {kind!r} (constant, linear, cosine)")


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: Any) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` following :func:`lr_lambda` over ``cfg.max_steps`` optimizer steps."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_lambda(s, warmup_steps=cfg.warmup_steps, total_steps=cfg.max_steps, kind=cfg.lr_scheduler_type),
    )

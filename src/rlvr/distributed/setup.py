"""Turning a one-process run into one rank of a data-parallel job: per-rank config, sharded models.

:func:`local_config` divides the global batch geometry by the world size; :func:`prepare_models` shards
the policy and the reference model with FSDP2 (or leaves them replicated) and makes the generation copy.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from rlvr.distributed.env import DistEnv
from rlvr.distributed.fsdp import mixed_precision_for, shard_policy
from rlvr.errors import ConfigError

__all__ = ["local_config", "use_fsdp", "PreparedModels", "prepare_models"]


def use_fsdp(cfg: Any, world_size: int) -> bool:
    """``distributed.fsdp``, where ``None`` (auto) means: shard when ``world_size > 1``."""
    f = cfg.distributed.fsdp
    return world_size > 1 if f is None else bool(f)


def local_config(cfg: Any, world_size: int) -> Any:
    """The config one rank runs: ``generation_batch_size`` (global, TRL semantics) divided by the
    world size, so every rank draws ``prompts_per_generation / world_size`` whole groups per round.

    Raises:
        ConfigError: the global prompts per round are not divisible by the world size, or the per-rank
            prompts not by ``steps_per_generation`` (each optimizer batch must hold whole groups on
            every rank); the message gives the nearest valid ``generation_batch_size``.
    """
    if world_size == 1:
        return cfg
    P, G, spg = cfg.prompts_per_generation, cfg.num_generations, cfg.steps_per_generation
    unit = world_size * spg
    if P % unit:
        fix = max(unit, P - P % unit) * G
        raise ConfigError(
            f"generation_batch_size={cfg.generation_batch_size} ({P} prompts x {G}) cannot be split over "
            f"{world_size} ranks x steps_per_generation={spg} into whole groups: the prompts per round must "
            f"be a multiple of {unit}; use generation_batch_size={fix} (or a multiple of {unit * G})"
        )
    return cfg.model_copy(update={"generation_batch_size": cfg.generation_batch_size // world_size})


@dataclass
class PreparedModels:
    """The models of one rank.

    Attributes:
        model: the trained policy (FSDP2-sharded in place, or as given).
        ref_model: the reference policy (sharded the same way), or None.
        gen_model: the full copy the engine generates with (``model`` itself when not sharded).
        sharded: whether FSDP2 was applied.
    """

    model: torch.nn.Module
    ref_model: torch.nn.Module | None
    gen_model: torch.nn.Module
    sharded: bool


def prepare_models(model: torch.nn.Module, ref_model: torch.nn.Module | None, cfg: Any, env: DistEnv,
                   precision: Any) -> PreparedModels:
    """Move the models to the rank's device and shard them when :func:`use_fsdp`.

    With FSDP2 the generation copy is a ``deepcopy`` of the still-full policy, taken before sharding
    (kept in eval mode, no gradients), unless ``distributed.generation_weights=gathered``: the engine
    then gets the sharded policy itself (the trainer gathers it for each generation round). A LoRA
    policy (a ``peft`` model) is sharded whole — frozen base and adapters in the same per-layer groups —
    and its generation copy is :func:`rlvr.lora.generation_copy` (``share=False``): a plain causal LM
    whose adapted projections hold ``W + ΔW``, re-merged after each update (``Trainer.sync_weights``).
    The optimizer must be built after this call. ``precision``: the run's resolved
    :class:`~rlvr.precision.PrecisionPolicy` (FSDP2's mixed-precision policy follows it).
    """
    model.to(env.device)
    if ref_model is not None:
        ref_model.to(env.device)
    if not use_fsdp(cfg, env.world_size) or env.backend is None:
        return PreparedModels(model, ref_model, model, sharded=False)
    gathered = cfg.distributed.generation_weights == "gathered"
    from rlvr.lora import generation_copy, is_peft_model

    if gathered:
        gen = None
    elif is_peft_model(model):  # LoRA: a plain LM with W + ΔW in the adapted projections, owning its tensors
        gen = generation_copy(model, share=False)
    else:
        gen = copy.deepcopy(model).eval().requires_grad_(False)
    # activation checkpointing (model.gradient_checkpointing) was switched on by load_policy; it composes
    # with FSDP2 (each decoder layer recomputes inside its own, already gathered, parameter group)
    mp = mixed_precision_for(env.device, precision)
    shard_policy(model, device=env.device, mp_policy=mp)
    if ref_model is not None:
        shard_policy(ref_model, device=env.device, mp_policy=mp)
    return PreparedModels(model, ref_model, model if gen is None else gen, sharded=True)

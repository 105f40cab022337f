"""Run setup that needs no trainer state: the config's loss settings, seeding, the precision policy, dropout.

Separate from :mod:`rlvr.trainer.trainer` because these are plain functions of the config or the
model, used before the loop exists (and by tests and benchmarks that call ``policy_update``
directly with :func:`loss_settings`); they change when a config key or the precision policy
changes, not when the loop does.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from rlvr.config import RLConfig
from rlvr.core.kl import canonical_kl_estimator
from rlvr.core.objective import LossSettings
from rlvr.errors import RlvrError
from rlvr.precision import PrecisionPolicy, resolve_model_precision, set_model_precision


def apply_precision(model: torch.nn.Module, requested: str, policy: PrecisionPolicy) -> PrecisionPolicy:
    """Attach the run's precision ``policy`` (:func:`resolve_run_precision`) to the model (and so to every
    forward of it and to the default engine; :mod:`rlvr.precision`) after checking its weights are stored as
    the policy says; ``requested`` (``model.dtype``) only names the mode in the error.

    Raises:
        RlvrError: the model's floating-point weights are not in the policy's ``param_dtype`` (e.g.
            ``bf16-pure`` for an fp32 model, or ``bf16``/``fp32`` — fp32 master weights — for a bf16 one);
            the message says how to load it.
    """
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    if param is not None and param.dtype != policy.param_dtype:
        raise RlvrError(
            f"model.dtype={requested} (precision {policy.mode}) keeps the weights in "
            f"{str(policy.param_dtype).removeprefix('torch.')}, but the model's are "
            f"{str(param.dtype).removeprefix('torch.')}: load it with rlvr.models.load_policy(cfg.model) or "
            f"convert it first (model.to({policy.param_dtype}))"
        )
    set_model_precision(model, policy)
    return policy


def resolve_run_precision(model_cfg: Any, model: torch.nn.Module, device: torch.device | str | None = None) -> PrecisionPolicy:
    """The model section's ``dtype`` and agreement switches (``model_cfg``; :func:`rlvr.precision.resolve_model_precision`) resolved for where the run computes: ``device`` (a ``torchrun`` rank's
    device, where the models are placed) or, without one, the device of the model's first floating-point
    weight (the CPU when it has none). A trainer built without the run's policy resolves it here, once
    (interpretation: issue 24, item 6, "resolve precision once").

    Raises:
        ValueError: an unknown mode or a bad ``RLVR_CPU_BF16`` value (:func:`rlvr.precision.resolve_precision`).
    """
    if device is None:
        param = next((p for p in model.parameters() if p.is_floating_point()), None)
        device = param.device if param is not None else "cpu"
    return resolve_model_precision(model_cfg, device)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch RNGs (CPU runs are then reproducible)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def loss_settings(cfg: RLConfig) -> LossSettings:
    """The core's loss settings from the run config (``kl_in_reward`` moves KL out of the loss)."""
    return LossSettings(
        epsilon=cfg.epsilon,
        epsilon_high=cfg.epsilon_high,
        clip_ratio_c=cfg.clip_ratio_c,
        importance_sampling_level=cfg.importance_sampling_level,
        loss_agg_mode=cfg.loss_agg_mode,
        seq_denominator=cfg.seq_denominator,
        loss_scale_factor=cfg.loss_scale_factor if cfg.loss_scale_factor else float(cfg.max_completion_length),
        beta=0.0 if cfg.kl_in_reward else cfg.beta,
        kl_estimator=canonical_kl_estimator(cfg.kl_estimator),
        kl_is_correction=cfg.kl_is_correction,
        entropy_coef=cfg.entropy_coef,
        policy_loss=cfg.policy_loss,
        rollout_is_mode=cfg.vllm_importance_sampling_mode if cfg.vllm_importance_sampling_correction else None,
        rollout_is_clip_max=cfg.vllm_importance_sampling_clip_max,
        rollout_is_clip_min=cfg.vllm_importance_sampling_clip_min,
    )


def disable_dropout(model: torch.nn.Module) -> int:
    """Turn every dropout of ``model`` off in place, in train mode too; returns how many were on.

    The update runs the policy in train mode (gradient checkpointing needs it) while ``old_logp``,
    ``ref_logp`` and sampling run in eval mode; with dropout left on, the first update's ratio on the
    very weights ``old_logp`` came from is not 1 (``model.lora.dropout=0.3``: 0.50-1.51, 9 % of tokens
    clipped). Covered: ``torch.nn.Dropout`` modules of every kind (peft's ``lora_dropout`` included)
    and float attributes named ``*dropout*`` / ``*_pdrop`` on modules (Llama and Qwen attention pass
    ``self.attention_dropout``, copied from the config, to the attention kernel when training). The
    model's config is left as it is, so an exported model keeps its own dropout settings.

    Source: TRL ``disable_dropout_in_model`` (``GRPOConfig.disable_dropout``, TRL PR #3234), which sets
    ``p = 0`` on every ``nn.Dropout``; the float attributes are an interpretation for the models whose
    attention dropout is a number, not a module.
    """
    changed = 0
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            changed += m.p > 0
            m.p = 0.0
        for name, value in list(vars(m).items()):  # e.g. LlamaAttention.attention_dropout (a float)
            if ("dropout" in name or name.endswith("_pdrop")) and type(value) is float and value > 0:
                setattr(m, name, 0.0)
                changed += 1
    return changed

"""Other frameworks' spellings of config keys (TRL, verl, OpenRLHF, peft), translated to rlvr's names.

:func:`apply_aliases` flattens a raw YAML mapping, renames every alias key to its canonical path (with a
warning naming both) and normalises the two value vocabularies that differ between frameworks
(``scale_rewards`` booleans, ``loss_agg_mode`` underscores). Source: ``docs/grpo.md`` §12 (the alias table).
"""

from __future__ import annotations

import warnings
from typing import Any

from rlvr.errors import ConfigError

# alias path → (canonical path, value translation or None)

_BOOL_SCALE = {True: "group", False: "none", "true": "group", "false": "none"}
ALIASES: dict[str, tuple[str, Any]] = {
    "output_dir": ("logging.output_dir", None),  # TRL's TrainingArguments name
    "logging_steps": ("logging.logging_steps", None),
    "n": ("num_generations", None),
    "rollout.n": ("num_generations", None),
    "n_samples_per_prompt": ("num_generations", None),
    "num_generations_per_prompt": ("num_generations", None),
    "n_samples": ("num_generations", None),
    "ppo_epochs": ("num_iterations", None),
    "max_epochs": ("num_iterations", None),
    "clip_ratio_low": ("epsilon", None),
    "clip_ratio": ("epsilon", None),
    "eps_clip": ("epsilon", None),
    "eps_clip_low": ("epsilon", None),
    "clip_ratio_high": ("epsilon_high", None),
    "eps_clip_high": ("epsilon_high", None),
    "eps_clip_higher": ("epsilon_high", None),
    "dual_clip": ("clip_ratio_c", None),
    "ratio_clip_c": ("clip_ratio_c", None),
    "c_clip": ("clip_ratio_c", None),
    "kl_coef": ("beta", None),
    "kl_loss_coef": ("beta", None),
    "reference_policy_kl_penalty": ("beta", None),
    "kl_ctl": ("beta", None),
    "kl_loss_type": ("kl_estimator", None),
    "kl_estimator_type": ("kl_estimator", None),
    "reference_policy_kl_type": ("kl_estimator", None),
    "loss_reduction": ("loss_agg_mode", lambda v: str(v).replace("_", "-")),
    "token_level_loss": ("loss_agg_mode", lambda v: "token-mean" if v else "seq-mean-token-mean"),
    "loss_mode": ("policy_loss", None),
    "policy_loss_type": ("policy_loss", None),
    "advantage_estimator": ("adv_estimator", None),
    "norm_adv_by_std_in_grpo": ("scale_rewards", lambda v: "group" if v else "none"),
    "entropy_coeff": ("entropy_coef", None),
    "entropy_loss_coef": ("entropy_coef", None),
    "overlong_filtering": ("mask_truncated_completions", None),
    "mask_no_eos_with_zero": ("mask_truncated_completions", None),
    "filter_groups": ("dynamic_sampling", None),
    "use_dynamic_sampling": ("dynamic_sampling.enable", None),
    "overlong_buffer.len": ("overlong_buffer_len", None),
    "overlong_buffer.penalty_factor": ("overlong_penalty_factor", None),
    "data.max_response_length": ("max_completion_length", None),
    "lr": ("learning_rate", None),
    "train.fsdp": ("distributed.fsdp", None),
    "tis_imp_ratio_cap": ("vllm_importance_sampling_clip_max", None),
    "rollout_is_threshold": ("vllm_importance_sampling_clip_max", None),
    "cast_lm_head_to_fp32": ("model.cast_lm_head_to_fp32", None),  # TRL's GRPOConfig (top level)
    "vllm_importance_sampling_cap": ("vllm_importance_sampling_clip_max", None),
    "steps": ("max_steps", None),
    "uec.num_explore_generations": ("uec.explore_num_generations", None),
    "mu_grpo.mu": ("steps_per_generation", None),
    "uec.replay_admit": ("uec.replay_admission", None),
    "ib_tpo.lambda_ib": ("ib_tpo.ib_lambda", None),
    "fbos.combine": ("fbos.combine_mode", None),
    "model.lora_rank": ("model.lora.r", None),  # verl
    "model.lora.rank": ("model.lora.r", None),
    "model.lora_alpha": ("model.lora.alpha", None),  # verl
    "model.lora.lora_alpha": ("model.lora.alpha", None),  # peft
    "model.lora.lora_dropout": ("model.lora.dropout", None),  # peft
}


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key not in ("task.config",) and not _is_leaf_dict(key):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _is_leaf_dict(key: str) -> bool:
    return key.endswith(".config") and key.startswith("task")


def set_path(d: dict[str, Any], path: str, value: Any) -> None:
    """Set ``d[a][b][c] = value`` for ``path`` ``"a.b.c"``, creating the mappings on the way.

    Raises:
        ConfigError: a part of the path already holds something that is not a mapping.
    """
    parts = path.split(".")
    for p in parts[:-1]:
        nxt = d.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{path}: cannot set a sub-key of {p!r}, which is a {type(nxt).__name__}")
        d = nxt
    d[parts[-1]] = value


def apply_aliases(raw: dict[str, Any]) -> dict[str, Any]:
    """Nested mapping ``raw`` with every alias key renamed to its canonical path (a warning each).

    Raises:
        ConfigError: an alias or key would set a sub-key of a value that is not a mapping.
    """
    flat = _flatten(raw)
    out: dict[str, Any] = {}
    for key, value in flat.items():
        target, translate = key, None
        for alias, (canonical, fn) in ALIASES.items():
            if key == alias or key.startswith(alias + "."):
                target = canonical + key[len(alias):]
                translate = fn
                warnings.warn(f"config key {key!r} is an alias; use {target!r}", stacklevel=3)
                break
        if translate is not None:
            value = translate(value)
        if target == "scale_rewards" and isinstance(value, (bool, str)) and value in _BOOL_SCALE:
            value = _BOOL_SCALE[value]
        if target == "loss_agg_mode" and isinstance(value, str):
            value = value.replace("_", "-")
        set_path(out, target, value)
    return out

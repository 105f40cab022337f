"""The one typed, validated configuration tree: ``build_config(files, overrides)`` → :class:`RLConfig`.

The package re-exports what a user or a part names (``from rlvr.config import build_config, ModelConfig``);
the code lives in

* :mod:`rlvr.config.run` — :class:`RLConfig`, YAML + ``key=value`` overrides, error wording, recipes;
* :mod:`rlvr.config.sections` — the sections (``model``, ``task``, ``logging``, ``eval``, ``distributed``,
  ``vllm``, ``env``, ...), strict pydantic models;
* :mod:`rlvr.config.aliases` — other frameworks' spellings (:data:`ALIASES`) and dotted-path setting;
* :mod:`rlvr.config.mixture` — the task mixture's curriculum section.

The variants' sections live in their folders (``rlvr/variants/<name>/config.py``) and register
themselves; :mod:`rlvr.config.run` imports them. Layer 1 of ``docs/architecture.md``: imports only
``errors``, ``registry``, ``plugins``, ``util`` and the variants' config modules.
"""

from rlvr.config.aliases import ALIASES, apply_aliases, set_path
from rlvr.config.run import (
    RECIPES_DIR,
    RLConfig,
    build_config,
    config_model,
    config_to_dict,
    format_validation_error,
    load_yaml,
    parse_override,
    resolve_trl_batch_names,
    safe_load_unique,
)
from rlvr.config.sections import (
    DEFAULT_EVAL_SIZE,
    LORA_INIT_CHOICES,
    DistributedConfig,
    DynamicSamplingConfig,
    EnvConfig,
    EvalConfig,
    LoggingConfig,
    LoraConfig,
    MixtureSourceConfig,
    ModelConfig,
    StreamingConfig,
    StrictModel,
    TaskConfig,
    VLLMConfig,
)

__all__ = [
    "ALIASES", "DEFAULT_EVAL_SIZE", "LORA_INIT_CHOICES", "RECIPES_DIR", "DistributedConfig", "DynamicSamplingConfig",
    "EnvConfig", "EvalConfig", "LoggingConfig", "LoraConfig", "MixtureSourceConfig", "ModelConfig", "RLConfig",
    "StreamingConfig", "StrictModel", "TaskConfig", "VLLMConfig", "apply_aliases", "build_config", "config_model",
    "config_to_dict", "format_validation_error", "load_yaml", "parse_override", "resolve_trl_batch_names",
    "safe_load_unique", "set_path",
]

"""Policies: load one by name (:mod:`rlvr.models.loading`), build the tiny test one (:mod:`rlvr.models.tiny`),
split a causal LM into trunk and head for the trainer's forward (:mod:`rlvr.models.split`).

The package re-exports the names callers use (``from rlvr.models import load_policy, MODEL_SOURCES``);
code that replaces a loader's internals (tests) patches :mod:`rlvr.models.loading`, where they are looked up.
Layer 2 of ``docs/architecture.md``: imports ``config``, ``errors``, ``registry``, ``util`` and ``precision``.
"""

from rlvr.models.loading import (
    DEFAULT_CACHE_ROOT,
    DEFAULT_MODEL_CACHE_NAME,
    DEFAULT_MODEL_DIST,
    DEFAULT_MODEL_FILE,
    MODEL_SOURCES,
    PIP_INSTALL_DEFAULT,
    check_model_path,
    convert_gguf_to_folder,
    default_model_cache_dir,
    enable_gradient_checkpointing,
    ensure_default_model,
    find_default_gguf,
    load_policy,
)
from rlvr.models.split import decoder_of, lm_head_params, model_forward_hidden, positions_from_mask
from rlvr.models.tiny import TINY_CHAT_TEMPLATE, TINY_SPECIAL_TOKENS, build_tiny_model, build_tiny_tokenizer

__all__ = [
    "DEFAULT_CACHE_ROOT", "DEFAULT_MODEL_CACHE_NAME", "DEFAULT_MODEL_DIST", "DEFAULT_MODEL_FILE", "MODEL_SOURCES",
    "PIP_INSTALL_DEFAULT", "TINY_CHAT_TEMPLATE", "TINY_SPECIAL_TOKENS", "build_tiny_model", "build_tiny_tokenizer",
    "check_model_path", "convert_gguf_to_folder", "decoder_of", "default_model_cache_dir",
    "enable_gradient_checkpointing", "ensure_default_model", "find_default_gguf", "lm_head_params", "load_policy",
    "model_forward_hidden", "positions_from_mask",
]

"""Name → factory registries for the replaceable parts a run is built from.

A variant registers its sampler, schedule, loss masks or batch filters here and ships a recipe that
names them; the trainer never branches on an algorithm name (``design/ARCHITECTURE.md``).

| config key      | registry         | factory signature                                  |
|-----------------|------------------|----------------------------------------------------|
| ``sampler``     | :data:`SAMPLERS` | ``(SamplerContext) -> sampler``                    |
| ``schedule``    | ``SCHEDULES``    | ``(RLConfig) -> Schedule`` (``rlvr.trainer.schedule``) |
| ``loss_masks``  | :data:`MASKS`    | ``(RLConfig) -> MaskFn``                           |
| ``batch_filters`` | :data:`BATCH_FILTERS` | ``(RLConfig) -> (RolloutBatch -> RolloutBatch)`` |
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable

from rlvr.errors import ConfigError
from rlvr.samplers.group import GroupSampler, PromptEncoder
from rlvr.trainer.schedule import SCHEDULES
from rlvr.types import RolloutBatch


@dataclass
class SamplerContext:
    """What a sampler factory may use: the run config, engine, prompt encoder, scorer, tokenizer."""

    cfg: Any
    engine: Any
    encoder: PromptEncoder
    scorer: Any
    tokenizer: Any
    pad_token_id: int


SAMPLERS: dict[str, Callable[[SamplerContext], Any]] = {
    "group": lambda ctx: GroupSampler(ctx.engine, ctx.encoder, ctx.pad_token_id),
}
MASKS: dict[str, Callable[[Any], Callable[..., Any]]] = {}
BATCH_FILTERS: dict[str, Callable[[Any], Callable[[RolloutBatch], RolloutBatch]]] = {}


def _load_variant_parts() -> None:
    """Import the modules that register variant parts (each registers on import)."""
    import importlib

    for mod in ("rlvr.variants",):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:
                raise


def _check(name: str, registry: dict[str, Any], key: str) -> None:
    if name not in registry:
        close = difflib.get_close_matches(name, list(registry), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"{key}: unknown name {name!r} (registered: {', '.join(sorted(registry))}){hint}")


def validate_components(cfg: Any) -> None:
    """Check every part the config names is registered (cheap: no model needed).

    Raises:
        ConfigError: naming the key and the registered names.
    """
    _load_variant_parts()
    _check(cfg.sampler, SAMPLERS, "sampler")
    _check(cfg.schedule, SCHEDULES, "schedule")
    for m in cfg.loss_masks:
        _check(m, MASKS, "loss_masks")
    for f in cfg.batch_filters:
        _check(f, BATCH_FILTERS, "batch_filters")

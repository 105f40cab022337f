"""What a sampler factory is given (:class:`SamplerContext`).

In the samplers' layer, below :mod:`rlvr.parts` (which registers the factories and re-exports the class), so
a sampler module can build one without importing the registries (``rlvr.samplers.multiturn``'s
``episode_sampler_factory`` does, for evaluation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["SamplerContext"]


@dataclass
class SamplerContext:
    """What a sampler factory may use: the run config, engine, prompt encoder
    (:class:`rlvr.samplers.group.PromptEncoder`), scorer, tokenizer and the pad id."""

    cfg: Any
    engine: Any
    encoder: Any
    scorer: Any
    tokenizer: Any
    pad_token_id: int

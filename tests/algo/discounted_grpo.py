"""A fifth algorithm, added without touching ``src/rlvr`` (issue 13 item 5; ``docs/architecture.md`` "Add an
algorithm" walks through the command-line example ``examples/rloo_entropy_anneal/``, this is the second).

*Discounted GRPO*: the group advantage of a completion, discounted along it, ``A_t = γ^t · Â`` (early
tokens carry more of the credit), trained only on the first ``HEAD_TOKENS`` tokens of each completion
(its own loss mask). Interpretation: a toy objective chosen to exercise two seams at once — a
batch-level advantage estimator that needs the batch (the completion mask), and a loss mask with a
metric — not a published method.

Registering is importing this module; the recipe ``discounted_grpo.yaml`` next to it lists it under
``plugins:`` (found from the recipe's folder) and names the parts.
"""

from __future__ import annotations

from typing import Any

import torch

from rlvr.core.advantages import check_group_sizes, grpo_advantages
from rlvr.parts import ADV_ESTIMATORS, CONFIG_CHECKS, MASKS, AdvantageContext
from rlvr.errors import ConfigError
from rlvr.types import RolloutBatch

GAMMA = 0.9
"""Per-token discount ``γ`` of the advantage."""
HEAD_TOKENS = 6
"""Tokens of each completion that enter the loss."""


@ADV_ESTIMATORS.register("discounted_grpo")
def discounted_grpo_advantages(batch: RolloutBatch, ctx: AdvantageContext) -> tuple[torch.Tensor, dict[str, float]]:
    """Advantages ``[N, T]`` = ``γ^t · Â_i`` with ``Â`` the GRPO group advantage of the (shaped) rewards
    (``scale_rewards``, ``adv_eps``, ``adv_std_unbiased`` from the run config), 0 at padding, and
    ``{"discount/adv_token_mean": mean |A_t| over completion tokens}``.

    Raises:
        ValueError: a group is not ``num_generations`` rows.
    """
    cfg = ctx.cfg
    check_group_sizes(batch.group_id, cfg.num_generations)
    a = grpo_advantages(batch.rewards, batch.group_id, scale_rewards=cfg.scale_rewards, adv_eps=cfg.adv_eps,
                        std_unbiased=cfg.adv_std_unbiased)
    T = batch.completion_mask.shape[1]
    disc = GAMMA ** torch.arange(T, dtype=torch.float32)
    m = batch.completion_mask
    adv = a[:, None] * disc[None, :] * m
    return adv, {"discount/adv_token_mean": float((adv.abs() * m).sum() / m.sum().clamp(min=1))}


discounted_grpo_advantages.per_token = True  # the UEC retention filter's check refuses per-token advantages


class HeadTokensMask:
    """Mask hook keeping the first :data:`HEAD_TOKENS` completion tokens of every row; reports
    ``discount/head_token_frac`` (kept / completion tokens). The masked tokens leave the normaliser."""

    denominator = "drop"

    def __call__(self, micro: RolloutBatch, logp: torch.Tensor, old_logp: torch.Tensor | None):
        m = micro.completion_mask
        keep = (torch.arange(m.shape[1])[None, :] < HEAD_TOKENS).to(m.dtype).expand_as(m)
        return keep, {"discount/head_token_frac": (float((keep * m).sum()), float(m.sum()))}


@MASKS.register("head_tokens")
def make_head_tokens_mask(cfg: Any) -> HeadTokensMask:
    """``loss_masks: [head_tokens]``."""
    return HeadTokensMask()


@CONFIG_CHECKS.register("discounted_grpo")
def check_discounted_grpo(cfg: Any) -> None:
    """The discounted estimator is for the group sampler (it needs groups of ``num_generations`` rows).

    Raises:
        ConfigError: ``adv_estimator: discounted_grpo`` with another sampler.
    """
    if cfg.adv_estimator == "discounted_grpo" and cfg.sampler != "group":
        raise ConfigError(f"adv_estimator=discounted_grpo needs sampler: group (got {cfg.sampler!r})")

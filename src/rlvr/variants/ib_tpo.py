"""IB-TPO parts (``specs/ib_tpo.md``): the ``tree`` sampler, the ``ib_tree`` advantage name and the
``ib_logp_mismatch`` batch filter.

- ``SAMPLERS["tree"]``: :class:`rlvr.samplers.tree.IBTreeSampler` built from ``cfg.ib_tpo``; it scores
  its leaves and sets per-token ``advantages`` and ``token_weights`` itself, which the trainer keeps.
- ``ADV_ESTIMATORS["ib_tree"]``: a name for recipes; tree advantages need the tree, so calling it on
  flat ``(rewards, group_id)`` raises with a hint to use ``sampler: tree``.
- ``BATCH_FILTERS["ib_logp_mismatch"]``: logs ``ib/old_logp_mismatch`` (mean |trainer-recomputed −
  sampler| log-prob per token, spec §4) when the trainer computed ``old_logp``; passes rows through.
"""

from __future__ import annotations

from typing import Any

import torch

from rlvr.core.advantages import ADV_ESTIMATORS
from rlvr.samplers.tree import IBTreeSampler
from rlvr.trainer.components import BATCH_FILTERS, SAMPLERS, SamplerContext
from rlvr.types import RolloutBatch


def build_tree_sampler(ctx: SamplerContext) -> IBTreeSampler:
    """``SAMPLERS["tree"]`` factory: an :class:`IBTreeSampler` configured by ``ctx.cfg.ib_tpo``."""
    cfg = ctx.cfg
    return IBTreeSampler(
        ctx.engine, ctx.encoder, ctx.scorer, ctx.tokenizer, ctx.pad_token_id, cfg.ib_tpo,
        cfg.max_completion_length, seed=cfg.seed,
    )


def ib_tree_advantages(rewards: torch.Tensor, group_id: torch.Tensor, **_: Any) -> torch.Tensor:
    """Placeholder for ``adv_estimator: ib_tree``: the tree sampler sets step advantages itself.

    Raises:
        ValueError: always — reaching it means the sampler did not set ``batch.advantages``.
    """
    raise ValueError(
        "adv_estimator=ib_tree: tree advantages are computed by the tree sampler from the tree "
        "(specs/ib_tpo.md §2.6); set sampler: tree (the sampler in use left batch.advantages unset)"
    )


def logp_mismatch_filter(cfg: Any):
    """``BATCH_FILTERS["ib_logp_mismatch"]`` factory: records ``ib/old_logp_mismatch`` in
    ``batch.meta["metrics"]`` (mean over completion tokens of ``|old_logp − sampler_logp|``, nats)
    when both are present; never drops rows."""

    def apply(batch: RolloutBatch) -> RolloutBatch:
        if batch.old_logp is not None and batch.sampler_logp is not None and len(batch):
            m = batch.completion_mask
            diff = ((batch.old_logp - batch.sampler_logp).abs() * m).sum() / m.sum().clamp_min(1)
            batch.meta.setdefault("metrics", {})["ib/old_logp_mismatch"] = float(diff)
        return batch

    return apply


SAMPLERS["tree"] = build_tree_sampler
ADV_ESTIMATORS["ib_tree"] = ib_tree_advantages
BATCH_FILTERS["ib_logp_mismatch"] = logp_mismatch_filter

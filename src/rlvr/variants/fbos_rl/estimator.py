"""FBOS-RL's view advantages and the check that its parts go together (``docs/fbos_rl.md`` §2.6–§2.8):
``ADV_ESTIMATORS["fbos"]`` (EPA and ECC view advantages) and ``CONFIG_CHECKS["fbos"]``.

Importing this module also registers ``POLICY_LOSSES["fbos_epa"]`` (the EPA per-token loss, in
:mod:`rlvr.core.fbos` with the rest of the pure math).
"""

from __future__ import annotations

from typing import Any

import torch

import rlvr.core.fbos  # noqa: F401  (registers POLICY_LOSSES["fbos_epa"])
from rlvr.core.fbos import ecc_advantages, view_advantages
from rlvr.errors import ConfigError
from rlvr.parts import ADV_ESTIMATORS, CONFIG_CHECKS, AdvantageContext
from rlvr.types import RolloutBatch, is_epa_kind
from rlvr.variants.fbos_rl.config import FBOSConfig


@ADV_ESTIMATORS.register("fbos", config=FBOSConfig, section="fbos")
def fbos_advantages(batch: RolloutBatch, ctx: AdvantageContext) -> tuple[torch.Tensor, dict[str, float]]:
    """EPA advantages on the union (or initial-only) group of each prompt, ECC advantages on its
    feedback-guided group (``fbos.ecc_baseline``: ``group`` or ``parent``), from the batch's (shaped)
    rewards: ``(advantages [N], {})``.

    Reads ``context_kind`` and ``fbos_parent_row`` (the row of each feedback-guided row's
    parent attempt, −1 for the others; set by the feedback sampler).

    Raises:
        ValueError: the batch lacks the feedback sampler's ``context_kind`` / parent rows.

    Source: docs/fbos_rl.md §2.6–§2.8.
    """
    parents = batch.fbos_parent_row
    if batch.context_kind is None or parents is None or len(parents) != len(batch):
        raise ValueError("adv_estimator=fbos needs the context kinds and parent rows of sampler: feedback")
    cfg = ctx.cfg
    kw = {"scale_rewards": cfg.scale_rewards, "adv_eps": cfg.adv_eps, "std_unbiased": cfg.adv_std_unbiased}
    is_epa = torch.tensor([is_epa_kind(k) for k in batch.context_kind], dtype=torch.bool)
    parent = torch.tensor(parents, dtype=torch.long)
    parent_rewards = torch.where(parent >= 0, batch.rewards[parent.clamp(min=0)], torch.zeros_like(batch.rewards))
    adv = view_advantages(batch.rewards, batch.group_id, is_epa, **kw)
    adv_ecc = ecc_advantages(batch.rewards, batch.group_id, ~is_epa, baseline=ctx.config.ecc_baseline,
                             parent_rewards=parent_rewards, **kw)
    return torch.where(~is_epa, adv_ecc, adv), {}


@CONFIG_CHECKS.register("fbos")
def check_fbos(cfg: Any) -> None:
    """The FBOS-RL parts only work together: ``sampler: feedback``, ``adv_estimator: fbos`` and
    ``schedule: fbos`` (the views need the sampler's context kinds, the estimator its parent rows, the
    schedule one step per view); ``fbos.initial_rollouts`` in ``[1, G − 1]``; ``steps_per_generation = 1``
    with ``schedule: fbos``; behaviour log-probs from the trainer (each row under its own context).

    Raises:
        ConfigError: naming the conflicting keys.
    """
    on = {"sampler": cfg.sampler == "feedback", "adv_estimator": cfg.adv_estimator == "fbos", "schedule": cfg.schedule == "fbos"}
    if any(on.values()) and not all(on.values()):
        have = ", ".join(f"{k}={getattr(cfg, k)!r}" for k in on)
        raise ConfigError(f"FBOS-RL parts only work together ({have}): set sampler: feedback, adv_estimator: fbos, "
                          "schedule: fbos")
    if not any(on.values()):
        return
    g1 = cfg.fbos.initial_rollouts if cfg.fbos.initial_rollouts is not None else cfg.num_generations // 2
    if not 1 <= g1 < cfg.num_generations:
        raise ConfigError(
            f"fbos.initial_rollouts={g1} must be in [1, num_generations − 1] = [1, {cfg.num_generations - 1}]"
        )
    if cfg.steps_per_generation != 1:
        raise ConfigError(
            f"schedule=fbos: steps_per_generation={cfg.steps_per_generation} is not supported; each view is "
            "one optimizer batch (alternate: EPA then ECC). Use num_iterations for more passes"
        )
    if cfg.old_logprob_source != "trainer":
        raise ConfigError("schedule=fbos needs old_logprob_source=trainer (the EPA view of a feedback-guided "
                          "rollout is scored under the original prompt, not the one it was sampled from)")

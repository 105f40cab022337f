"""Pure tensor math of GRPO and its variants (``docs/grpo.md``): no I/O, models or configs.

Modules: :mod:`~rlvr.core.advantages` (group advantages; the estimator registry is ``rlvr.parts.ADV_ESTIMATORS``),
:mod:`~rlvr.core.masks`, :mod:`~rlvr.core.aggregation` (``loss_agg_mode``),
:mod:`~rlvr.core.policy_loss` (clipped surrogate, registry ``POLICY_LOSSES``), :mod:`~rlvr.core.kl`,
:mod:`~rlvr.core.logprobs` (chunked LM-head log-probs and entropy), :mod:`~rlvr.core.objective` (the total
loss and its metrics), :mod:`~rlvr.core.pass_at_k`.
"""

from rlvr.core.advantages import (
    SCALE_REWARDS_MODES,
    check_group_sizes,
    group_stats,
    grpo_advantages,
    mean_group_std,
    overlong_penalty,
    rloo_advantages,
    zero_std_group_fraction,
)
from rlvr.core.aggregation import (
    LOSS_AGG_MODES,
    SEQ_DENOMINATORS,
    AggDenominators,
    aggregate,
    compute_denominators,
    merge_denominators,
)
from rlvr.core.kl import KL_ESTIMATORS, canonical_kl_estimator, check_kl_is_correction, kl_is_corrected, kl_penalty
from rlvr.core.logprobs import entropy_from_logits, selective_log_softmax_and_entropy
from rlvr.core.masks import combine_masks, truncation_mask
from rlvr.core.objective import LossSettings, policy_objective, reduce_objective_metrics
from rlvr.core.pass_at_k import mean_pass_at_k, pass_at_k
from rlvr.core.policy_loss import (
    IMPORTANCE_SAMPLING_LEVELS,
    POLICY_LOSSES,
    clipped_surrogate,
    get_policy_loss,
    importance_log_ratio,
)

__all__ = [
    "IMPORTANCE_SAMPLING_LEVELS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "SCALE_REWARDS_MODES",
    "SEQ_DENOMINATORS",
    "AggDenominators",
    "LossSettings",
    "aggregate",
    "canonical_kl_estimator",
    "check_kl_is_correction",
    "check_group_sizes",
    "clipped_surrogate",
    "combine_masks",
    "compute_denominators",
    "entropy_from_logits",
    "get_policy_loss",
    "group_stats",
    "grpo_advantages",
    "importance_log_ratio",
    "kl_is_corrected",
    "kl_penalty",
    "mean_group_std",
    "mean_pass_at_k",
    "merge_denominators",
    "overlong_penalty",
    "pass_at_k",
    "policy_objective",
    "reduce_objective_metrics",
    "rloo_advantages",
    "selective_log_softmax_and_entropy",
    "truncation_mask",
    "zero_std_group_fraction",
]

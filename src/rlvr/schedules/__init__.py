"""Schedules: which prepared rows feed which optimizer updates (the seam is :mod:`rlvr.schedules.base`).

This package holds the seam (:class:`Schedule`, :class:`OptimizerStep`, :class:`PlanContext`,
:data:`SCHEDULES`), the generic ``on_policy`` schedule and reusable pieces (:mod:`rlvr.schedules.buffer`).
A variant's own schedule lives in its folder and registers itself in :data:`SCHEDULES` when that module
is imported (:mod:`rlvr.variants.builtin` imports them all):

========================  =========================================================  ===================
name                      class                                                      variant
========================  =========================================================  ===================
``on_policy``             :class:`~rlvr.schedules.base.OnPolicySchedule`              GRPO family
``staged``                :class:`~rlvr.variants.mu_grpo.schedule.StagedSchedule`     μ-GRPO
``fbos``                  :class:`~rlvr.variants.fbos_rl.schedule.AlternatingViews`    FBOS-RL
``uec_replay``            :class:`~rlvr.variants.uec_rl.schedule.UECReplaySchedule`    UEC-RL
========================  =========================================================  ===================
"""

from rlvr.schedules.base import (
    SCHEDULES,
    START_ACTIONS,
    OnPolicySchedule,
    OptimizerStep,
    PlanContext,
    Schedule,
    split_groups,
)

__all__ = ["SCHEDULES", "START_ACTIONS", "OnPolicySchedule", "OptimizerStep", "PlanContext", "Schedule", "split_groups"]

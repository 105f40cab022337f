"""Schedules: which prepared rows feed which optimizer updates (the seam is :mod:`rlvr.schedules.base`).

Built-in schedules register themselves in :data:`SCHEDULES` when this package is imported:

========================  ==============================================  ===================
name                      class                                           variant
========================  ==============================================  ===================
``on_policy``             :class:`~rlvr.schedules.base.OnPolicySchedule`   GRPO family
``staged``                :class:`~rlvr.schedules.staged.StagedSchedule`    μ-GRPO
``fbos``                  :class:`~rlvr.schedules.fbos.AlternatingViews`    FBOS-RL
``uec_replay``            :class:`~rlvr.schedules.uec_replay.UECReplaySchedule`  UEC-RL
========================  ==============================================  ===================

Schedules are a layer of their own (between samplers and the trainer) rather than part of
``rlvr.variants``: they are planners with a typed interface (:class:`OptimizerStep`, :class:`PlanContext`)
that a variant may reuse (UEC's :class:`~rlvr.schedules.uec_replay.TrajectoryBuffer`), while
``rlvr.variants`` only wires registry entries from the run config.
"""

from rlvr.schedules import fbos, staged, uec_replay  # noqa: F401 (each registers its schedule)
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

"""μ-GRPO (Tian, Xie, Wei 2026, "How Off-Policy Can GRPO Be?"; ``docs/mu_grpo.md``): GRPO on very stale data.

A schedule and a mask on top of GRPO, read in this order:

1. :mod:`~rlvr.variants.mu_grpo.config`: the ``mu_grpo:`` section (:class:`MuGRPOConfig`); μ itself is
   ``steps_per_generation`` (alias ``mu_grpo.mu``), the relaxed window plain ``epsilon=1.0, epsilon_high=4.0``.
2. :mod:`~rlvr.variants.mu_grpo.schedule`: ``SCHEDULES["staged"]``: one very large generation batch (a
   stage) cut into μ optimizer updates, whole groups shuffled, stage-entry actions (optimizer reset, fresh
   prompt shuffle); ``CONFIG_CHECKS["mu_grpo"]``.
3. :mod:`~rlvr.variants.mu_grpo.mask`: ``MASKS["veto"]``: the negative-advantage veto, recomputed from
   the current forward at every micro-batch; the math is :mod:`rlvr.core.veto`.

Advantages are plain GRPO (``adv_estimator: grpo``); the recipe is ``mu_grpo.yaml``. This package imports
nothing when imported (:mod:`rlvr.config` imports its ``config`` module before any part may load);
:mod:`rlvr.variants.builtin` imports the modules that register the parts.
"""

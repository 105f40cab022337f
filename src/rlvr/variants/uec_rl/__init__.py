"""UEC-RL (Wang et al. 2026, "Targeted Exploration via Unified Entropy Control for Reinforcement Learning";
``docs/uec_rl.md``): GRPO plus targeted exploration on hard prompts and a replay stabiliser.

Read in the order a round uses the parts:

1. :mod:`~rlvr.variants.uec_rl.config`: the ``uec:`` section (:class:`UECConfig`).
2. :mod:`~rlvr.variants.uec_rl.sampler`: ``SAMPLERS["hard_prompt"]``: a group of G at the run's
   temperature, then G′ tempered exploration rollouts for every prompt whose group did not pass (their own
   group id, so the unchanged ``grpo`` estimator gives exploration advantages within the G′ group alone).
3. Advantages: plain GRPO (``adv_estimator: grpo``), nothing of UEC's own.
4. :mod:`~rlvr.variants.uec_rl.retention`: ``BATCH_FILTERS["uec_retention"]``: which rows are trained
   (regular ``|Â| > τ_R``, exploration ``Â > τ_H``, truncated positives dropped); ``CONFIG_CHECKS["uec"]``.
5. :mod:`~rlvr.variants.uec_rl.schedule`: ``SCHEDULES["uec_replay"]``: accumulate retained rows to
   ``N_upd`` (pending FIFO), admit ``Â > A_0`` rows to a replay FIFO, replay it every ``f`` rounds with the
   stored ``old_logp`` and ``Â`` (both buffers :class:`rlvr.schedules.buffer.TrajectoryBuffer`).

The pure math (hard-prompt gate, filters, admission, entropy gradient, tempered IS weights) is
:mod:`rlvr.core.uec`; the recipes are ``uec_rl.yaml`` and ``uec_rl_release.yaml``. This package imports
nothing when imported (:mod:`rlvr.config` imports its ``config`` module before any part may load);
:mod:`rlvr.variants.builtin` imports the modules that register the parts.
"""

"""FBOS-RL (Zhang et al. 2026, arXiv 2605.20256; ``docs/fbos_rl.md``): a second round of rollouts from
feedback-augmented prompts (FAP) for prompts whose first rollouts failed, trained as two views of the same
tokens: EPA (scored under the original prompt) and ECC (on-policy GRPO in the FAP context).

Read in the order a round uses the parts:

1. :mod:`~rlvr.variants.fbos_rl.config`: the ``fbos:`` section (:class:`FBOSConfig`), every interpretation
   a named switch.
2. :mod:`~rlvr.variants.fbos_rl.fap`: the feedback text per level, the FAP template, round-robin parent
   choice and the ECC group ids.
3. :mod:`~rlvr.variants.fbos_rl.sampler`: ``SAMPLERS["feedback"]``: G1 rollouts from the prompt, scored;
   for a failing prompt G2 rollouts from FAPs built on failed attempts; one batch with three row kinds
   (``original``, ``original_offpolicy``, ``feedback``) and each FAP row's parent row.
4. :mod:`~rlvr.variants.fbos_rl.estimator`: ``ADV_ESTIMATORS["fbos"]``: EPA advantages on the union (or
   initial-only) group, ECC advantages on the FAP group (group or parent baseline), after reward shaping;
   ``CONFIG_CHECKS["fbos"]`` (sampler, estimator and schedule only together); importing it registers
   ``POLICY_LOSSES["fbos_epa"]``.
5. :mod:`~rlvr.variants.fbos_rl.schedule`: ``SCHEDULES["fbos"]``: the EPA and ECC views as alternate
   optimizer steps (or one joint step), the EPA step with the shaped / truncated-IS off-policy loss.

The pure math (EPA loss and weights, view advantages, per-view normalisation) is :mod:`rlvr.core.fbos`;
the recipe is ``fbos_rl.yaml``. This package imports nothing when imported (:mod:`rlvr.config` imports
its ``config`` module before any part may load); :mod:`rlvr.variants.builtin` imports the modules that
register the parts.
"""

"""IB-TPO (Jiang et al., "Long Live The Balance", arXiv 2605.28109; ``docs/ib_tpo.md``): step trees grown
where an Information-Bottleneck score is highest, under a budget of generated tokens, trained with
step-level advantages.

Read in the order a round uses the parts:

1. :mod:`~rlvr.variants.ib_tpo.config`: the ``ib_tpo:`` section (:class:`IBTPOConfig`), every switch a
   named knob.
2. :mod:`~rlvr.variants.ib_tpo.tree_struct`: a completion cut into steps (paragraph or fixed), the
   per-prompt trie of token-id spans (:class:`PromptTree`) and the :class:`TreeIndex` the estimator reads.
3. :mod:`~rlvr.variants.ib_tpo.sampler`: ``SAMPLERS["tree"]``: M initial chains, then rounds that fork
   continuations at the nodes with the highest IB score under the token budget; every root-to-leaf path
   becomes a row (scored, prefix ``token_weights``, the tree index attached).
4. :mod:`~rlvr.variants.ib_tpo.estimator`: ``ADV_ESTIMATORS["ib_tree"]``: values, IB statistics and step
   advantages ``[N, T]`` from the tree index and the shaped rewards; ``BATCH_FILTERS["ib_logp_mismatch"]``;
   ``CONFIG_CHECKS["ib_tpo"]`` (``sampler: tree`` and ``adv_estimator: ib_tree`` only together).
5. Schedule and loss: the standard ones (``on_policy``, the clipped surrogate with the token weights).

The pure math (values, ĥ, Ĥ, Î, IB̂, tree advantages, efficiency rates) is :mod:`rlvr.core.tree`; the
recipe is ``ib_tpo.yaml``. This package imports nothing when imported (:mod:`rlvr.config` imports its
``config`` module before any part may load); :mod:`rlvr.variants.builtin` imports the modules that
register the parts.
"""

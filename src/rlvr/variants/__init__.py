"""The algorithm variants, one folder each: ``rlvr/variants/<name>/`` holds the variant's config section,
sampler, estimator, schedule and masks; the pure math stays in :mod:`rlvr.core`.

Each folder's ``__init__`` docstring reads the algorithm in order. The folder's ``config`` module is pure
pydantic at the config layer (:mod:`rlvr.config` imports it, so a config with the variant's section
validates before any part loads); its other modules register their parts with the registries' decorators
(:mod:`rlvr.parts`, :mod:`rlvr.schedules`) when imported, and :mod:`rlvr.variants.builtin` imports them
all (:mod:`rlvr.trainer.components` imports that module). Importing this package, or a variant's
package, imports nothing else, so reading a config never loads torch through a variant. No module here
imports the trainer.
"""

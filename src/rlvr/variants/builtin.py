"""Registers every built-in variant's parts by importing the modules that declare them.

:mod:`rlvr.trainer.components` imports this module, so every built-in sampler, estimator, schedule, mask,
filter and combination check is known before a run is checked. The variants' ``config`` modules are
imported by :mod:`rlvr.config` instead (a section must validate before any part loads). A new built-in
variant adds its registering modules here (``tests/test_variants_layout.py`` checks none is missing).
"""

import rlvr.variants.fbos_rl.estimator  # noqa: F401
import rlvr.variants.fbos_rl.sampler  # noqa: F401
import rlvr.variants.fbos_rl.schedule  # noqa: F401
import rlvr.variants.ib_tpo.estimator  # noqa: F401
import rlvr.variants.ib_tpo.sampler  # noqa: F401
import rlvr.variants.mu_grpo.mask  # noqa: F401
import rlvr.variants.mu_grpo.schedule  # noqa: F401
import rlvr.variants.uec_rl.retention  # noqa: F401
import rlvr.variants.uec_rl.sampler  # noqa: F401
import rlvr.variants.uec_rl.schedule  # noqa: F401

"""Registration glue for the algorithm variants.

Each module here registers its parts (samplers, schedules, loss masks, batch filters, advantage
estimators) in the name-keyed registries when imported; the math lives in ``rlvr.core``, samplers in
``rlvr.samplers`` and schedules in ``rlvr.trainer``. Every module of this package is imported by
:func:`rlvr.trainer.components.validate_components`, so adding a file is enough.
"""

import importlib
import pkgutil

for _mod in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_mod.name}")

"""Registration glue for the algorithm variants.

Each module here registers its parts (samplers, batch-level advantage estimators, loss masks, batch
filters, config checks) with the registries' decorators (:mod:`rlvr.parts`) when imported; the math
lives in ``rlvr.core``, samplers in ``rlvr.samplers`` and schedules in ``rlvr.schedules``. Importing
this package imports every module in it (so adding a file is enough); :mod:`rlvr.trainer.components`
imports the package. No module here imports the trainer.
"""

import importlib
import pkgutil

for _mod in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_mod.name}")

"""Fast testbed: a tiny character-level policy pre-trained in-process on a synthetic task family.

``model.name_or_path=testbed`` (or ``testbed:<preset>[:<seed>]``) loads the policy through
:func:`rlvr.models.load_policy`; ``task.type=testbed`` with ``task.config: {min_level, max_level,
ops}`` builds :class:`TestbedTask`. See ``docs/testbed.md``. Importing this package registers both:
``MODEL_SOURCES["testbed"]`` (:mod:`rlvr.models`) and ``TASK_TYPES["testbed"]`` (:mod:`rlvr.tasks`).
"""

from rlvr.models import MODEL_SOURCES
from rlvr.tasks import TASK_TYPES

from rlvr.testbed.model import PRESETS, TestbedSpec, build_tokenizer, ensure_testbed_model, parse_spec, pretrain
from rlvr.testbed.mixture import FAP_TEMPLATE
from rlvr.testbed.task import OPS, TestbedTask, chain_answer, make_example, testbed_task_from_config

MODEL_SOURCES.register("testbed")(lambda name, cache_dir=None: ensure_testbed_model(name, cache_dir))
TASK_TYPES.register("testbed")(testbed_task_from_config)

__all__ = ["FAP_TEMPLATE", "OPS", "PRESETS", "chain_answer", "TestbedSpec", "TestbedTask", "build_tokenizer", "ensure_testbed_model", "make_example",
           "parse_spec", "pretrain"]

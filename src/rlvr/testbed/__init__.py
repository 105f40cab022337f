"""Fast testbed: a tiny character-level policy pre-trained in-process on a synthetic task family.

``model.name_or_path=testbed`` (or ``testbed:<preset>[:<seed>]``) loads the policy through
:func:`rlvr.models.load_policy`; ``task.type=testbed`` with ``task.config: {min_level, max_level,
ops}`` builds :class:`TestbedTask`. See ``docs/testbed.md``.
"""

from rlvr.testbed.model import PRESETS, TestbedSpec, build_tokenizer, ensure_testbed_model, parse_spec, pretrain
from rlvr.testbed.task import OPS, TestbedTask, make_example

__all__ = ["OPS", "PRESETS", "TestbedSpec", "TestbedTask", "build_tokenizer", "ensure_testbed_model", "make_example",
           "parse_spec", "pretrain"]

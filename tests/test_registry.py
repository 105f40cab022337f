"""One registry type for every part: decorator registration, one error type suggesting the nearest name."""

from __future__ import annotations

import pytest

from rlvr.errors import ConfigError
from rlvr.registry import Registry, UnknownNameError


def test_decorator_registers_and_unknown_names_suggest_the_nearest():
    reg: Registry = Registry("schedule", "tests.REG")

    @reg.register("on_policy")
    def make(cfg):
        return cfg

    assert reg["on_policy"] is make and "on_policy" in reg and list(reg) == ["on_policy"]
    assert reg.get("nope") is None and reg.get("nope", make) is make
    with pytest.raises(UnknownNameError, match=r"schedule: unknown name 'on_polcy' .*'on_policy'.*did you mean 'on_policy'\?") as e:
        reg["on_polcy"]
    assert isinstance(e.value, ConfigError) and isinstance(e.value, KeyError) and isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("on_policy")(lambda cfg: None)
    reg.register("on_policy", replace=True)(print)
    assert reg["on_policy"] is print


def test_every_built_in_registry_is_a_registry():
    import rlvr.trainer.components  # noqa: F401 (loads every built-in part)
    from rlvr.core.policy_loss import POLICY_LOSSES
    from rlvr.models import MODEL_SOURCES
    from rlvr.parts import ADV_ESTIMATORS, BATCH_FILTERS, CONFIG_CHECKS, MASKS, SAMPLERS
    from rlvr.schedules import SCHEDULES
    from rlvr.tasks import TASK_TYPES

    regs = (ADV_ESTIMATORS, POLICY_LOSSES, MODEL_SOURCES, BATCH_FILTERS, CONFIG_CHECKS,
            MASKS, SAMPLERS, SCHEDULES, TASK_TYPES)
    assert all(isinstance(r, Registry) for r in regs)
    assert {"on_policy", "staged", "fbos", "uec_replay"} <= set(SCHEDULES)
    assert {"group", "tree", "feedback", "hard_prompt"} <= set(SAMPLERS)
    assert {"grpo", "rloo", "ib_tree", "fbos"} <= set(ADV_ESTIMATORS)  # one advantage registry

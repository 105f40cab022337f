"""Validate once (issue 24, item 6): ``rlvr train`` runs each config check once, before the model loads;
a :class:`Trainer` built from Python still runs them itself."""

from __future__ import annotations

from collections import Counter

import pytest

import rlvr.trainer.components as components
import rlvr.trainer.rollout as rollout
from cli_fixtures import train_tiny
from rlvr.errors import ConfigError
from rlvr.testing import small_config
from rlvr.trainer.trainer import Trainer

CHECKS = ("validate_components", "check_report_to", "check_filter_metric")


@pytest.fixture
def calls(monkeypatch):
    """Counts of the run checks, wherever they are called from (the components module and the rollout
    module that defines the filter check)."""
    seen: Counter = Counter()

    def counted(name, fn):
        def wrapper(*a, **k):
            seen[name] += 1
            return fn(*a, **k)
        return wrapper

    for name in CHECKS:
        monkeypatch.setattr(components, name, counted(name, getattr(components, name)))
    monkeypatch.setattr(rollout, "check_filter_metric", counted("check_filter_metric", rollout.check_filter_metric))
    return seen


def test_cli_train_runs_each_check_once(tmp_path, calls):
    assert train_tiny(tmp_path, "max_steps=1") == 0
    assert dict(calls) == {name: 1 for name in CHECKS}


def test_trainer_from_python_validates_unless_told(tmp_path, tiny, toy_task, calls):
    factory, tok = tiny
    Trainer(small_config(tmp_path / "a"), factory(0), tok, toy_task)
    assert dict(calls) == {name: 1 for name in CHECKS}
    Trainer(small_config(tmp_path / "b"), factory(0), tok, toy_task, validated=True)
    assert dict(calls) == {name: 1 for name in CHECKS}  # the caller said it had validated: nothing ran again
    with pytest.raises(ConfigError, match="did you mean 'group'"):
        Trainer(small_config(tmp_path / "c", "sampler=groupp"), factory(0), tok, toy_task)

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


@pytest.fixture
def resolutions(monkeypatch):
    """The ``model.dtype`` values :func:`rlvr.precision.resolve_precision` was asked to resolve, wherever it
    was imported (every rlvr module that bound the name)."""
    import sys

    import rlvr.precision as precision

    real, seen = precision.resolve_precision, []

    def counted(requested="auto", device=None, **k):
        seen.append(requested)
        return real(requested, device, **k)

    for mod in [m for name, m in list(sys.modules.items()) if name.startswith("rlvr") and m is not None]:
        if getattr(mod, "resolve_precision", None) is real:
            monkeypatch.setattr(mod, "resolve_precision", counted)
    return seen


def test_cli_train_resolves_the_precision_once(tmp_path, resolutions):
    assert train_tiny(tmp_path, "max_steps=1", "model.dtype=auto") == 0
    assert resolutions == ["auto"]  # the load, the trainer and its engine share the one policy


def test_trainer_from_python_resolves_for_the_models_device_once(tmp_path, tiny, toy_task, resolutions):
    factory, tok = tiny
    tr = Trainer(small_config(tmp_path), factory(0), tok, toy_task)
    assert resolutions == [tr.cfg.model.dtype] and tr.precision.device_type == "cpu"
    given = tr.precision
    again = Trainer(small_config(tmp_path / "b"), factory(0), tok, toy_task, precision=given)
    assert len(resolutions) == 1 and again.precision is given

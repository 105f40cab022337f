"""build_task dispatch and validate_task_config (fails fast, before any data)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from rlvr.config import TaskConfig
from rlvr.errors import ConfigError
from rlvr.tasks import DEFAULT_SYSTEM_PROMPT, MathTask, ReasoningGymTask, RewardFnTask, Task, build_task, validate_task_config

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}


def test_build_reasoning_gym():
    cfg = TaskConfig(name="chain_sum", config=SMALL, train_size=10, eval_size=5, system_prompt="Be brief.")
    task = build_task(cfg)
    assert isinstance(task, ReasoningGymTask) and isinstance(task, Task)
    assert task.system_prompt == "Be brief." and len(task.problems("train")) == 10


def test_default_system_prompt_and_hint():
    task = build_task(TaskConfig(config=SMALL, train_size=4, eval_size=2, feedback_hint=True))
    assert task.system_prompt == DEFAULT_SYSTEM_PROMPT
    p = task.problems("train")[0]
    assert "Hint:" in task.verify(p, "\\boxed{-1000}").feedback


def test_build_jsonl(tmp_path):
    f = tmp_path / "mini.jsonl"
    f.write_text("\n".join(json.dumps({"question": f"q{i}", "answer": f"#### {i}"}) for i in range(6)))
    task = build_task(TaskConfig(type="jsonl", path=str(f), eval_size=2))
    assert isinstance(task, MathTask) and task.name == "mini"
    assert len(task.problems("train")) == 4 and len(task.problems("eval")) == 2
    named = build_task(TaskConfig(type="jsonl", path=str(f), eval_size=2, name="gsm"))
    assert named.name == "gsm"


def test_build_with_reward_fn(tmp_path, monkeypatch):
    (tmp_path / "rlvr_build_reward_mod.py").write_text("def r(completion, problem):\n    return 0.25\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = TaskConfig(config=SMALL, train_size=4, eval_size=2, reward_fn="rlvr_build_reward_mod:r",
                     correct_threshold=0.2)
    task = build_task(cfg)
    assert isinstance(task, RewardFnTask)
    v = task.verify(task.problems("train")[0], "anything")
    assert v.score == 0.25 and v.correct


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        (dict(name="chain_summ"), "did you mean chain_sum"),
        (dict(name="chain_sum", config={"max_term": 2}), r"task\.config\.max_term"),
        (dict(train_size=20000), "overlap"),
        (dict(type="jsonl", path="/nonexistent/x.jsonl"), r"task\.path.*not found"),
        (dict(reward_fn="rlvr_no_such_mod_abc:f"), "failed to import: ModuleNotFoundError"),
    ],
)
def test_validate_task_config_errors(kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern):
        validate_task_config(TaskConfig(**kwargs))


def test_validate_hf_without_datasets(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "datasets" else real(n, *a))
    with pytest.raises(ConfigError, match="pip install datasets"):
        validate_task_config(TaskConfig(type="hf_dataset", name="openai/gsm8k", hf_config="main"))

"""User reward functions: loading by spec and every accepted return type."""

from __future__ import annotations

import pickle
import textwrap

import numpy as np
import pytest
import torch

from rlvr.errors import ConfigError
from rlvr.tasks import MathTask, Problem, RewardFnTask, Verdict, load_reward_fn

P = Problem("u", "What is 3 + 4?", "7")
BASE = MathTask("base", [P], [], correct_threshold=0.5)


def _verify(ret, **kw):
    return RewardFnTask(BASE, lambda completion, problem: ret, **kw).verify(P, "so \\boxed{7}")


@pytest.mark.parametrize(
    "ret,score,correct,feedback",
    [
        (0.7, 0.7, True, None),
        (0.2, 0.2, False, None),
        (1, 1.0, True, None),
        (True, 1.0, True, None),
        (False, 0.0, False, None),
        ((0.0, "too long"), 0.0, False, "too long"),
        ((1.0, None), 1.0, True, None),
        ({"score": 0.3, "feedback": "close"}, 0.3, False, "close"),
        ({"score": 0.3, "correct": True}, 0.3, True, None),
        (np.float32(0.75), 0.75, True, None),
        (torch.tensor(1.0), 1.0, True, None),
    ],
)
def test_return_types(ret, score, correct, feedback):
    v = _verify(ret)
    assert v.score == pytest.approx(score) and v.correct is correct and v.feedback == feedback
    assert v.extracted == "7" and v.source == "boxed"


def test_verdict_passes_through_and_threshold_override():
    v = Verdict(0.4, True, "fb", "x")
    assert _verify(v) is v
    assert not _verify(0.7, correct_threshold=0.9).correct


def named_bad_fn(completion, problem):
    return "yes"


@pytest.mark.parametrize("ret", ["1.0", [1.0], None, {"feedback": "x"}, (1.0, 2.0), (1, "a", "b")])
def test_bad_return_type_is_type_error_naming_fn_and_type(ret):
    def my_reward(completion, problem):
        return ret

    with pytest.raises(TypeError, match=r"my_reward returned a (tuple|dict|list|str|NoneType)"):
        RewardFnTask(BASE, my_reward).verify(P, "x")


def test_non_finite_score():
    with pytest.raises(ValueError, match="non-finite"):
        _verify(float("nan"))


def test_keyword_call_and_delegation():
    seen = {}

    def fn(*, completion, problem):
        seen.update(completion=completion, uid=problem.uid)
        return 1.0

    t = RewardFnTask(BASE, fn)
    t.verify(P, "abc")
    assert seen == {"completion": "abc", "uid": "u"}
    assert t.problems("train") == [P] and t.name == "base" and t.system_prompt == BASE.system_prompt


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    (tmp_path / "rlvr_test_rewards_mod.py").write_text(
        textwrap.dedent(
            """
            NOT_CALLABLE = 3
            def length_reward(completion, problem):
                return min(len(completion) / 10, 1.0), None
            class Scorer:
                @staticmethod
                def score(completion, problem):
                    return 1.0
            """
        )
    )
    (tmp_path / "rlvr_test_broken_mod.py").write_text("raise RuntimeError('kaput')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_load_reward_fn(module_dir):
    fn = load_reward_fn("rlvr_test_rewards_mod:length_reward")
    assert fn(completion="12345", problem=P) == (0.5, None)
    assert load_reward_fn("rlvr_test_rewards_mod:Scorer.score")(completion="", problem=P) == 1.0
    from_file = load_reward_fn(f"{module_dir / 'rlvr_test_rewards_mod.py'}:length_reward")
    assert from_file(completion="1", problem=P) == (0.1, None)


@pytest.mark.parametrize(
    "spec,pattern",
    [
        ("no_colon_here", "module:function"),
        ("rlvr_no_such_module_xyz:f", "failed to import: ModuleNotFoundError: No module named 'rlvr_no_such_module_xyz'"),
        ("rlvr_test_rewards_mod:lenght_reward", "no attribute 'lenght_reward'.*length_reward"),
        ("rlvr_test_rewards_mod:NOT_CALLABLE", "not a callable"),
        ("rlvr_test_broken_mod:f", "RuntimeError: kaput"),
        ("missing_dir/x.py:f", "not found"),
    ],
)
def test_load_reward_fn_errors(module_dir, spec, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_reward_fn(spec)


def test_import_from_working_directory(tmp_path, monkeypatch):
    (tmp_path / "rlvr_cwd_reward_mod.py").write_text("def f(completion, problem):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    assert load_reward_fn("rlvr_cwd_reward_mod:f")(completion="", problem=P) == 1.0


def test_task_from_spec_pickles(module_dir):
    t = RewardFnTask(BASE, f"{module_dir / 'rlvr_test_rewards_mod.py'}:length_reward")
    t2 = pickle.loads(pickle.dumps(t))
    assert t2.verify(P, "1234567890").score == 1.0


@pytest.mark.parametrize("flag,want", [(False, False), (np.bool_(True), True), (0, False), (1, True)])
def test_dict_correct_accepts_bools_and_0_1(flag, want):
    assert _verify({"score": 0.9, "correct": flag}).correct is want


@pytest.mark.parametrize("flag", ["false", "no", 2, 0.5, [True]])
def test_dict_correct_of_another_type_is_a_type_error(flag):
    """``bool("false")`` is True: a dict's ``correct: "false"`` counted the completion as solved."""
    with pytest.raises(TypeError, match=r"returned correct=.*expected a bool"):
        _verify({"score": 0.0, "correct": flag})

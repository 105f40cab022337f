"""Task mixtures: config validation (errors name task.mixture[i].key), the MixtureTask's problems and
dispatch, the seeded weighted prompt stream, its exact resume, the curriculum and per-source eval."""

from __future__ import annotations

import json

import pytest

from rlvr.config import build_config
from rlvr.errors import ConfigError
from rlvr.eval.summary import summarize_records
from rlvr.tasks import build_task
from rlvr.tasks.base import Problem
from rlvr.tasks.mixture import MixtureSource, MixtureTask
from rlvr.tasks.prompts import build_messages
from rlvr.testing import ToyTask
from rlvr.trainer.mixture import MixtureLoader, pick, weights_at_step

TWO = "task.mixture=[{type: reasoning_gym, name: chain_sum, train_size: 6, eval_size: 3, weight: 1}, " \
      "{type: code, config: {backend: local, allow_local_hidden_tests: true}, weight: 3}]"


def _err(*overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        build_config(overrides=list(overrides))
    return str(e.value)


def test_each_entry_validates_with_errors_naming_its_index():
    msg = _err("task.mixture=[{type: reasoning_gym, name: chain_sum}, {type: code, nam: x, weight: -1}]")
    assert "task.mixture[1].nam: unknown key; did you mean 'task.mixture[1].name'?" in msg
    assert "task.mixture[1].weight: Input should be greater than or equal to 0" in msg
    assert "task.mixture[0].type: Input should be" in _err("task.mixture=[{type: reasoning_gm}]")
    assert "cannot hold its own mixture" in _err("task.mixture=[{mixture: [{type: code}]}]")
    assert "task.mixture[1].label" in _err("task.mixture=[{type: code}, {type: code, label: 'a/b'}]")


def test_top_level_keys_beside_a_mixture_and_curricula_without_one_are_refused():
    assert "task.config, task.train_size set beside task.mixture" in _err(
        "task.mixture=[{type: code}]", "task.config={a: 1}", "task.train_size=5")
    assert "read only with task.mixture" in _err("task.curriculum={solved: {window: 2}}")
    assert "strictly increasing" in _err("task.mixture=[{type: code}]", "task.curriculum={weights_by_step: "
                                         "[{step: 3, weights: {a: 1}}, {step: 3, weights: {a: 2}}]}")
    assert "at least one entry needs weight > 0" in _err("task.mixture=[{type: code, weight: 0}]")
    # the top-level defaults a recipe spells out (type: reasoning_gym, name: chain_sum) are not "set"
    build_config(overrides=["task.type=reasoning_gym", "task.system_prompt=x", "task.mixture=[{type: code}]"])


def test_an_entry_error_found_when_building_names_the_entry():
    cfg = build_config(overrides=["task.mixture=[{type: code}, {type: reasoning_gym, name: no_such_dataset}]"])
    with pytest.raises(ConfigError, match=r"task\.mixture\[1\]\.name"):
        build_task(cfg.task)
    cfg = build_config(overrides=["task.mixture=[{type: code, config: {backend: local, allow_local_hidden_tests: true}}, "
                                  "{type: code, config: {backend: local, allow_local_hidden_tests: true}}]"])
    with pytest.raises(ConfigError, match=r"both named 'code_builtin'.*task\.mixture\[1\]\.label"):
        build_task(cfg.task)


def test_problems_carry_their_source_and_prompt_and_verify_dispatches_to_it():
    task = build_task(build_config(overrides=[TWO]).task)
    assert isinstance(task, MixtureTask) and task.labels == ["chain_sum", "code_builtin"]
    math, code = task.source_problems("train")
    assert len(math) == 6 and task.problems("train") == math + code
    p, q = math[0], code[0]
    assert p.uid.startswith("chain_sum/") and p.metadata["source"] == "chain_sum"
    assert build_messages(p, "ignored")[0]["content"] == task.sources[0].task.system_prompt
    assert build_messages(q, "ignored")[0]["content"] == task.sources[1].task.system_prompt != task.prompts[0]
    assert task.verify(p, f"\\boxed{{{p.answer}}}").correct and not task.verify(p, "\\boxed{x}").correct
    assert not task.verify(q, "no code").correct  # the code verifier's own verdict on the code problem
    assert task.verify(q, "no code").feedback.startswith("No ```python code block")


def test_unwrap_restores_the_source_problem_exactly_even_with_clashing_keys():
    inner = Problem("u1", "q", "a", {"source": "theirs", "system_prompt": "theirs too", "x": 1})
    mixed = MixtureTask._wrap("s", "mine", inner)
    assert mixed.uid == "s/u1" and mixed.metadata["source"] == "s" and mixed.metadata["system_prompt"] == "mine"
    assert MixtureTask.unwrap(mixed) == ("s", inner)


def test_top_level_system_prompt_is_the_default_of_entries_without_their_own():
    mt = MixtureTask([MixtureSource("a", 1, ToyTask()), MixtureSource("b", 1, ToyTask())],
                     system_prompt="shared", source_prompts=[None, "own"])
    assert mt.prompts == ["shared", "own"]


def test_weights_at_step_is_piecewise_linear_and_flat_outside():
    pts = [(0, [1.0, 0.0]), (10, [0.0, 1.0]), (20, [0.5, 0.5])]
    assert weights_at_step(pts, 3) == pytest.approx([0.7, 0.3])
    assert weights_at_step(pts, 15) == pytest.approx([0.25, 0.75])
    assert weights_at_step(pts, 99) == [0.5, 0.5] and weights_at_step([(5, [2.0, 1.0])], 0) == [2.0, 1.0]
    assert pick([0.25, 0.0, 0.75], 0.2) == 0 and pick([0.25, 0.0, 0.75], 0.25) == 2 and pick([0, 1], 0.999) == 1
    with pytest.raises(ValueError, match="every source's weight is 0"):
        pick([0.0, 0.0], 0.5)


def _loader(seed=0, curriculum=None, weights=(1.0, 3.0)):
    a = [Problem(f"a/{i}", "q", None, {"source": "a"}) for i in range(5)]
    b = [Problem(f"b/{i}", "q", None, {"source": "b"}) for i in range(7)]
    return MixtureLoader(["a", "b"], [a, b], list(weights), seed=seed, curriculum=curriculum)


def test_the_stream_is_seeded_follows_the_weights_and_covers_each_source_per_epoch():
    uids = [p.uid for p in _loader().next(4000)]
    assert uids == [p.uid for p in _loader().next(4000)] and uids != [p.uid for p in _loader(seed=1).next(4000)]
    share_b = sum(u.startswith("b/") for u in uids) / len(uids)
    assert abs(share_b - 0.75) < 0.03  # binomial sd ≈ 0.007
    first_a = [u for u in uids if u.startswith("a/")][:5]
    assert sorted(first_a) == [f"a/{i}" for i in range(5)]  # each source: a shuffle of its problems per epoch


def test_a_state_saved_mid_run_resumes_the_same_prompts_and_curriculum():
    from rlvr.config.mixture import CurriculumConfig

    cur = CurriculumConfig.model_validate({"solved": {"window": 2, "threshold": 0.5, "factor": 0.5},
                                           "weights_by_step": [{"step": 0, "weights": {"a": 1, "b": 1}},
                                                               {"step": 4, "weights": {"a": 0, "b": 1}}]})

    def rounds(loader, start, n, out):
        for r in range(start, start + n):
            loader.set_step(r)
            drawn = loader.next(3)
            out.append([p.uid for p in drawn])
            loader.observe({"a": (float(r % 2), 1.0), "b": (1.0, 2.0)})

    ref: list = []
    full = _loader(curriculum=cur)
    rounds(full, 0, 6, ref)
    part: list = []
    first = _loader(curriculum=cur)
    rounds(first, 0, 3, part)
    state = json.loads(json.dumps(first.state_dict()))  # as trainer_state.json stores it
    resumed = _loader(seed=5, curriculum=cur)
    resumed.load_state_dict(state)
    rounds(resumed, 3, 3, part)
    assert part == ref and resumed.state_dict() == full.state_dict()
    # each source: its window fills every 2 rounds with mean 0.5 ≥ 0.5 (a: 0,1; b: 0.5,0.5) → × 0.5 three times
    assert full.multipliers == [0.125, 0.125]


def test_the_solved_rule_cuts_a_source_but_never_the_last_one_standing():
    from rlvr.config.mixture import SolvedRule
    from types import SimpleNamespace

    lo = _loader(curriculum=SimpleNamespace(solved=SolvedRule(window=1, threshold=0.9, factor=0.0),
                                            weights_by_step=None))
    assert lo.observe({"a": (1.0, 1.0), "b": (0.0, 4.0)}) == ["a"] and lo.weights() == [0.0, 1.0]
    assert lo.observe({"b": (4.0, 4.0)}) == [] and lo.weights() == [0.0, 1.0]  # b is the last: kept
    assert all(p.uid.startswith("b/") for p in lo.next(50))


def test_weights_by_step_must_name_the_mixtures_sources():
    from rlvr.config.mixture import CurriculumConfig

    cur = CurriculumConfig.model_validate({"weights_by_step": [{"step": 0, "weights": {"a": 1, "c": 1}}]})
    with pytest.raises(ConfigError, match=r"weights_by_step\[0\]\.weights names \['a', 'c'\]"):
        _loader(curriculum=cur)


def test_eval_summary_reports_each_source():
    def rec(source, n, c, reward):
        samples = [{"extracted": "1", "reward": reward, "length": 4, "truncated": False}] * n
        return {"uid": f"{source}/x", "n": n, "correct": c, "mean_reward": reward, "source": source,
                "pass": {"1": c / n}, "maj": {"1": float(c > 0)}, "samples": samples}

    out = summarize_records([rec("a", 4, 4, 1.0), rec("a", 4, 0, 0.0), rec("b", 4, 1, 0.25)], [1])
    assert out["pass@1"] == pytest.approx((1 + 0 + 0.25) / 3)
    assert out["source/a/pass@1"] == 0.5 and out["source/a/num_problems"] == 2
    assert out["source/b/pass@1"] == 0.25 and out["source/b/reward/mean"] == 0.25
    assert out["source/a/reward/pass_rate"] == 0.5 and "source/b/source/b/pass@1" not in out


def test_training_checks_run_before_the_model_names_the_source_and_the_knot():
    from rlvr.config.mixture import CurriculumConfig
    from rlvr.errors import DataError

    empty = ToyTask(n=0)
    mt = MixtureTask([MixtureSource("a", 1, ToyTask()), MixtureSource("b", 1, empty)])
    with pytest.raises(DataError, match=r"task\.mixture\[1\] \(b\): no training problems"):
        mt.check_training()
    mt = MixtureTask([MixtureSource("a", 1, ToyTask()), MixtureSource("b", 1, ToyTask())])
    cur = CurriculumConfig.model_validate({"weights_by_step": [{"step": 0, "weights": {"a": 1, "x": 1}}]})
    with pytest.raises(ConfigError, match=r"weights_by_step\[0\]\.weights names \['a', 'x'\]"):
        mt.check_training(cur)
    mt.check_training(CurriculumConfig.model_validate({"weights_by_step": [{"step": 0, "weights": {"a": 1, "b": 0}}]}))

"""reasoning-gym adapter: chain_sum end to end, config errors, partial credit, picklability."""

from __future__ import annotations

import pickle
import re

import pytest

from rlvr.errors import ConfigError
from rlvr.tasks import ReasoningGymTask

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}


pytestmark = pytest.mark.filterwarnings("ignore:.*eval questions also occur")


def _task(**kw):
    args = dict(name="chain_sum", config=SMALL, train_size=40, eval_size=15, seed=0, eval_seed=1000)
    args.update(kw)
    return ReasoningGymTask(**args)


def test_problems_deterministic_per_seed():
    a, b = _task(), _task()
    assert a.problems("train") == b.problems("train")
    assert a.problems("eval") == b.problems("eval")
    c = _task(seed=500)
    assert [p.question for p in c.problems("train")] != [p.question for p in a.problems("train")]
    assert len(a.problems("train")) == 40 and len(a.problems("eval")) == 15


def test_train_eval_disjoint(recwarn):
    wide = {"min_terms": 2, "max_terms": 3, "min_digits": 2, "max_digits": 3}
    t = _task(config=wide)
    train, ev = t.problems("train"), t.problems("eval")
    assert not {p.uid for p in train} & {p.uid for p in ev}
    assert not {p.question for p in train} & {p.question for p in ev}
    assert not any(p.metadata.get("seen_in_train") for p in ev)
    assert not [w for w in recwarn if "eval questions" in str(w.message)]


def test_small_space_repeats_are_kept_flagged_and_warned():
    # 1-digit, 2-term sums: ~200 distinct questions, all seen by a 2000-problem train split
    cfg = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    t = ReasoningGymTask("chain_sum", cfg, train_size=2000, eval_size=5, seed=0, eval_seed=5000)
    with pytest.warns(UserWarning, match="5 of 5 eval questions also occur"):
        ev = t.problems("eval")
    assert len(ev) == 5 and all(p.metadata["seen_in_train"] for p in ev)
    assert not {p.uid for p in t.problems("train")} & {p.uid for p in ev}


def test_verify_correct_and_incorrect():
    t = _task()
    for p in t.problems("eval"):
        good = t.verify(p, f"Adding up step by step.\n\\boxed{{{p.answer}}}")
        assert (good.score, good.correct, good.feedback, good.source) == (1.0, True, None, "boxed")
        wrong = str(int(p.answer) + 1)
        bad = t.verify(p, f"I think it is\n\\boxed{{{wrong}}}")
        assert bad.score == 0.0 and not bad.correct and bad.extracted == wrong
        assert bad.feedback and wrong in bad.feedback
        assert not re.search(rf"(?<![\d-]){re.escape(p.answer)}(?!\d)", bad.feedback), bad.feedback


def test_verify_without_answer_and_with_bare_number():
    t = _task()
    p = t.problems("train")[0]
    none = t.verify(p, "I do not know")
    assert none.score == 0.0 and none.source == "none" and "\\boxed{}" in none.feedback
    bare = t.verify(p, f"so it is {p.answer}")
    # the bare-number fallback still scores (reported through source) - a format nudge, not a zero
    assert bare.correct and bare.source == "last_number"


def test_correct_threshold_and_partial_credit():
    t = ReasoningGymTask("countdown", {}, train_size=2, eval_size=1, seed=0, eval_seed=100)
    p = t.problems("train")[0]
    wrong = t.verify(p, "\\boxed{1 + 2}")
    assert 0.0 < wrong.score < 1.0 and not wrong.correct  # 0.05 partial credit is kept
    assert t.verify(p, f"\\boxed{{{p.answer}}}").correct
    lenient = ReasoningGymTask("countdown", {}, 2, 1, 0, 100, None, correct_threshold=0.01)
    assert lenient.verify(p, "\\boxed{1 + 2}").correct


def test_problems_and_task_pickle():
    t = _task()
    probs = t.problems("train")
    assert pickle.loads(pickle.dumps(probs)) == probs
    t2 = pickle.loads(pickle.dumps(t))
    assert t2.verify(probs[0], f"\\boxed{{{probs[0].answer}}}").correct


def test_unknown_dataset_suggests_close_names():
    with pytest.raises(ConfigError, match="chain_sum"):
        ReasoningGymTask("chain_summ", {}, 2, 2, 0, 100)


@pytest.mark.parametrize(
    "config,pattern",
    [
        ({"max_term": 2}, r"task\.config\.max_term.*max_terms"),
        ({"size": 3}, r"task\.config\.size.*train_size"),
        ({"seed": 3}, r"task\.config\.seed.*task\.seed"),
        ({"min_terms": 0}, r"min_terms must be positive"),
    ],
)
def test_bad_config_names_key(config, pattern):
    with pytest.raises(ConfigError, match=pattern):
        ReasoningGymTask("chain_sum", config, 2, 2, 0, 100)


def test_overlapping_seed_ranges_rejected():
    with pytest.raises(ConfigError, match="eval_seed >= 1000"):
        ReasoningGymTask("chain_sum", SMALL, train_size=1000, eval_size=10, seed=0, eval_seed=500)


def test_bad_split():
    with pytest.raises(ValueError, match="split"):
        _task().problems("test")

"""Feedback text: None when correct, label-free otherwise."""

from __future__ import annotations

from rlvr.tasks import make_feedback


def test_correct_gives_none():
    assert make_feedback("7", "boxed", True) is None
    assert make_feedback("7", "boxed", True, hint="h") is None


def test_wrong_boxed_names_the_models_answer():
    assert make_feedback("8", "boxed", False) == "Your final answer `8` is incorrect."


def test_format_violations():
    assert "no final answer in \\boxed{}" in make_feedback(None, "none", False).lower()
    msg = make_feedback("8", "last_number", False)
    assert "bare number" in msg and "`8`" in msg and "\\boxed{}" in msg
    assert "not in \\boxed{}" in make_feedback("8", "phrase", False)
    assert "cut off" in make_feedback(None, "none", False, truncated=True)
    assert "could not be parsed" in make_feedback("\\frac{", "boxed", False, unparseable=True)


def test_hint_only_when_given():
    assert make_feedback("8", "boxed", False).endswith("incorrect.")
    assert make_feedback("8", "boxed", False, hint="Hint: check.").endswith(" Hint: check.")


def test_long_answers_are_shortened():
    msg = make_feedback("1" * 1000, "boxed", False)
    assert len(msg) < 200

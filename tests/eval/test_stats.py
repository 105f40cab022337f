"""maj@k voting and the 95 % intervals of rlvr.eval.stats, on hand-made samples and known cases."""

from __future__ import annotations

import math

import pytest

from rlvr.eval.stats import answer_key, bootstrap_interval, maj_at_k, majority_vote, mean_with_ci, wilson_interval


def test_answer_key_merges_equal_numbers_and_abstains_on_none():
    assert answer_key("18") == answer_key("18.0") == answer_key("$18") == answer_key(" 18. ")
    assert answer_key("1,800") == answer_key("1800") != answer_key("18")
    assert answer_key("x + 1") == answer_key("x  +  1") != answer_key("x+1")
    assert answer_key(None) is None and answer_key("  ") is None


def test_majority_vote_most_frequent_then_first_given_on_ties():
    k = [answer_key(a) for a in ["5", "7", "7", None, "5", "7"]]
    assert majority_vote(k) == 1  # "7" x3 beats "5" x2; index of its first sample
    tie = [answer_key(a) for a in ["9", "4", "4", "9"]]
    assert majority_vote(tie) == 0  # 2-2 tie: "9" was given first
    assert majority_vote([answer_key(a) for a in ["4", "9", "9", "4"]]) == 0  # now "4" is first
    assert majority_vote([None, None]) is None  # everyone abstained
    assert majority_vote([None, answer_key("3")]) == 1  # abstentions do not vote


def test_maj_at_k_hand_made_problem():
    # gold 18; 8 samples in draw order
    answers = ["18", "20", "18.0", None, "20", "20", "18", "7"]
    correct = [True, False, True, False, False, False, True, False]
    keys = [answer_key(a) for a in answers]
    # k = 8: one vote of all: "18" x3 (18, 18.0, 18) vs "20" x3 -> tie, "18" given first -> correct
    assert maj_at_k(keys, correct, 8) == 1.0
    # k = 4: blocks [18, 20, 18.0, None] -> 18 wins (2 vs 1): 1; [20, 20, 18, 7] -> 20 wins: 0 -> mean 0.5
    assert maj_at_k(keys, correct, 4) == 0.5
    # k = 3: blocks [18,20,18.0] -> 1; [None,20,20] -> 0; last 2 samples unused -> 0.5
    assert maj_at_k(keys, correct, 3) == 0.5
    # k = 1: each sample alone; an abstaining sample scores 0 -> the per-sample accuracy 3/8
    assert maj_at_k(keys, correct, 1) == pytest.approx(3 / 8)
    # the verdict comes from the winner's first sample, not from a text comparison
    assert maj_at_k([answer_key("a")] * 2, [False, True], 2) == 0.0


def test_maj_at_k_rejects_bad_k():
    with pytest.raises(ValueError, match="k=3"):
        maj_at_k([None, None], [False, False], 3)
    with pytest.raises(ValueError, match="verdicts"):
        maj_at_k([None], [False, True], 1)


def test_wilson_interval_known_cases():
    # hand-computed from (p + z²/2n ± z sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n), z = 1.95996
    lo, hi = wilson_interval(3, 100)
    assert lo == pytest.approx(0.010254, abs=2e-6) and hi == pytest.approx(0.084520, abs=2e-6)
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.277533, abs=2e-6)
    lo, hi = wilson_interval(10, 10)  # symmetric to 0 of 10
    assert hi == pytest.approx(1.0) and lo == pytest.approx(1 - 0.277533, abs=2e-6)
    with pytest.raises(ValueError, match="trials"):
        wilson_interval(0, 0)


def test_bootstrap_interval_matches_the_normal_width_on_a_known_case():
    # 400 problems, half 0.25 and half 0.75: mean 0.5, SE = 0.25 / sqrt(400) = 0.0125
    values = [0.25, 0.75] * 200
    lo, hi = bootstrap_interval(values, seed=0)
    assert lo < 0.5 < hi
    assert (hi - lo) == pytest.approx(2 * 1.96 * 0.0125, rel=0.15)
    assert bootstrap_interval(values, seed=0) == (lo, hi)  # reproducible
    assert bootstrap_interval([0.5] * 7) == (0.5, 0.5)  # no spread, no interval


def test_mean_with_ci_picks_wilson_for_binary_outcomes_else_bootstrap():
    binary = mean_with_ci([1.0] * 3 + [0.0] * 97)
    assert binary["ci_method"] == "wilson" and binary["mean"] == pytest.approx(0.03)
    assert binary["ci95"] == pytest.approx(list(wilson_interval(3, 100)))
    frac = mean_with_ci([0.25, 0.5, 1.0, 0.0])
    assert frac["ci_method"] == "bootstrap" and frac["ci95"][0] <= frac["mean"] <= frac["ci95"][1]
    assert not math.isnan(frac["ci95"][1])

"""Unbiased pass@k (Chen et al. 2021 §2.1): pass@k = 1 − C(n−c, k)/C(n, k)."""

from fractions import Fraction
from math import comb

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.core import mean_pass_at_k, pass_at_k


@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        (4, 1, 2, 0.5),  # 1 − C(3,2)/C(4,2) = 1 − 3/6
        (5, 2, 2, 0.7),  # 1 − C(3,2)/C(5,2) = 1 − 3/10
        (10, 3, 1, 0.3),  # k = 1: c/n
        (10, 0, 5, 0.0),  # nothing correct
        (4, 3, 2, 1.0),  # n − c = 1 < k: every 2-subset holds a correct sample
        (5, 5, 5, 1.0),
        (6, 2, 3, 0.8),  # 1 − C(4,3)/C(6,3) = 1 − 4/20
        (200, 1, 100, 0.5),  # 1 − C(199,100)/C(200,100) = 1 − 100/200
        (10, 1, 10, 1.0),
    ],
)
def test_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_large_n_is_stable():
    # C(1000, 500) overflows a float; the product form does not. 1 − C(998,500)/C(1000,500)
    # = 1 − (500·499)/(1000·999) = 1 − 249500/999000 = 0.7502502502502503
    assert pass_at_k(1000, 2, 500) == pytest.approx(0.7502502502502503, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_matches_exact_binomial_ratio(data):
    n = data.draw(st.integers(1, 60))
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    exact = 1 - Fraction(comb(n - c, k), comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)
    # monotone in k and c
    if k < n:
        assert pass_at_k(n, c, k + 1) >= pass_at_k(n, c, k) - 1e-12
    if c < n:
        assert pass_at_k(n, c + 1, k) >= pass_at_k(n, c, k) - 1e-12


@pytest.mark.parametrize(
    "args",
    [(4, 1, 5), (4, 5, 2), (-1, 0, 1), (4, -1, 1), (4, 1, -1), (4, 1, 0), (0, 0, 0), (4.5, 1, 2), (4, 1, "2"), (True, 1, 1)],
)
def test_invalid_arguments(args):
    with pytest.raises(ValueError):
        pass_at_k(*args)


def test_mean_pass_at_k():
    # (0.5 + 0.7)/2
    assert mean_pass_at_k([4, 5], [1, 2], 2) == pytest.approx(0.6, abs=1e-12)
    # one n for all problems: (0.5 + 0 + 1)/3
    assert mean_pass_at_k(4, [1, 0, 4], 2) == pytest.approx(0.5, abs=1e-12)
    with pytest.raises(ValueError):
        mean_pass_at_k([], [], 1)
    with pytest.raises(ValueError):
        mean_pass_at_k([4, 4], [1], 1)
    with pytest.raises(ValueError):
        mean_pass_at_k([4, 1], [1, 1], 2)  # k > n for the second problem

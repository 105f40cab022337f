"""Evaluation statistics: majority voting (maj@k) and 95 % confidence intervals.

* **maj@k** (self-consistency; Wang et al. 2023, "Self-Consistency Improves Chain of Thought
  Reasoning", §2; the ``maj1@k`` of Lewkowycz et al. 2022, Minerva §3): k samples vote with their
  extracted final answers and the problem counts as solved when the most frequent answer is correct.
* **Intervals** over problems: Wilson score when every problem contributes a 0/1 outcome (one
  sample per problem, e.g. greedy, or k equal to the number of samples), else a percentile
  bootstrap over problems. Both describe the uncertainty from the finite set of problems (the
  variance a different draw of test problems would show), which dominates at these sizes.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any, Hashable, Sequence

import numpy as np

__all__ = [
    "Z95",
    "answer_key",
    "bootstrap_interval",
    "maj_at_k",
    "majority_vote",
    "mean_with_ci",
    "wilson_interval",
]

Z95 = 1.959963984540054
"""The two-sided 95 % standard-normal quantile, Φ⁻¹(0.975)."""

_SPACES = re.compile(r"\s+")


def answer_key(extracted: str | None) -> Hashable | None:
    """The vote an extracted answer casts: equal keys are the same answer.

    Plain numbers vote by value (``"18"``, ``"18.0"``, ``"$18"`` and ``"1,800"``/``"1800"`` pair
    up, via :func:`rlvr.tasks.math.plain_number`); anything else by its text with whitespace
    collapsed and a trailing full stop removed. ``None`` (no answer found) and empty strings
    abstain (return None).

    Interpretation: value equality for numbers because GSM8K-style answers are numbers and a
    vote split between ``18`` and ``18.00`` would under-count the majority; no symbolic equivalence
    beyond that (math-verify per pair would cost O(k²) calls per problem).
    """
    if extracted is None:
        return None
    text = _SPACES.sub(" ", str(extracted)).strip().rstrip(".").strip()
    if not text:
        return None
    from rlvr.tasks.math import plain_number

    num = plain_number(text)
    if num is not None:
        return ("num", num.normalize())
    return ("text", text)


def majority_vote(keys: Sequence[Hashable | None]) -> int | None:
    """Index of the sample whose answer wins the vote among ``keys`` (``None`` entries abstain).

    The winner is the most frequent key; a tie goes to the tied answer given first (lowest sample
    index), the rule of ``collections.Counter.most_common`` on insertion-ordered votes that
    lm-evaluation-harness's majority filter uses. Returns the index of the winner's first sample,
    or None when every sample abstained.
    """
    counts = Counter(k for k in keys if k is not None)  # insertion order = first appearance
    if not counts:
        return None
    winner = counts.most_common(1)[0][0]  # stable: the first-inserted among equal counts
    return next(i for i, k in enumerate(keys) if k == winner)


def maj_at_k(keys: Sequence[Hashable | None], correct: Sequence[bool], k: int) -> float:
    """maj@k of one problem from its ``n`` samples (in the order they were drawn).

    The ``n`` samples are cut into ``n // k`` consecutive blocks of ``k`` (the last ``n % k`` are
    unused); each block votes (:func:`majority_vote`) and scores 1 when its winning answer is
    correct — the verdict of the winner's first sample in the block —, 0 when it is wrong or every
    sample abstained. Returns the mean over blocks: the samples are i.i.d., so each block is an
    independent draw of maj@k and the mean is unbiased (with ``k == n``: the single vote of all samples).

    Args:
        keys: ``[n]`` vote keys (:func:`answer_key`), None = abstain.
        correct: ``[n]`` verifier verdicts.
        k: voters per block, ``1 <= k <= n``.

    Raises:
        ValueError: lengths differ, or ``k`` outside ``[1, n]``.
    """
    n = len(keys)
    if len(correct) != n:
        raise ValueError(f"maj_at_k: {n} keys but {len(correct)} verdicts")
    if not 1 <= k <= n:
        raise ValueError(f"maj_at_k: k={k} must be in [1, n={n}]")
    blocks = n // k
    wins = 0
    for b in range(blocks):
        lo = b * k
        j = majority_vote(keys[lo : lo + k])
        wins += int(j is not None and bool(correct[lo + j]))
    return wins / blocks


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion.

    ``(p̂ + z²/2n ± z·sqrt(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n)`` with ``p̂ = successes / trials``;
    unlike the normal ("Wald") interval it stays inside [0, 1] and is not empty at 0 or n successes.

    Source: Wilson (1927), "Probable inference, the law of succession, and statistical inference",
    JASA 22(158); recommended by Brown, Cai & DasGupta (2001), Statist. Sci. 16(2).

    Raises:
        ValueError: ``trials < 1`` or ``successes`` outside ``[0, trials]``.
    """
    if trials < 1:
        raise ValueError(f"wilson_interval: trials must be >= 1, got {trials}")
    if not 0 <= successes <= trials:
        raise ValueError(f"wilson_interval: successes={successes} outside [0, trials={trials}]")
    n, p = float(trials), successes / trials
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_interval(
    values: Sequence[float], *, num_resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-problem ``values``.

    Problems are resampled with replacement ``num_resamples`` times (NumPy ``default_rng(seed)``,
    so the interval is reproducible); the interval is the ``(1 − level)/2`` and ``(1 + level)/2``
    quantiles of the resampled means.

    Source: Efron & Tibshirani (1993), "An Introduction to the Bootstrap", §13.3 (percentile interval).

    Raises:
        ValueError: no values, ``num_resamples < 1`` or ``level`` outside (0, 1).
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("bootstrap_interval: no values")
    if num_resamples < 1 or not 0 < level < 1:
        raise ValueError(f"bootstrap_interval: need num_resamples >= 1 and 0 < level < 1, got {num_resamples}, {level}")
    rng = np.random.default_rng(seed)
    means = np.empty(num_resamples)
    step = max(1, 2_000_000 // x.size)  # bound the index matrix to ~16 MB
    for lo in range(0, num_resamples, step):
        hi = min(num_resamples, lo + step)
        means[lo:hi] = x[rng.integers(0, x.size, size=(hi - lo, x.size))].mean(axis=1)
    a = (1 - level) / 2
    q_lo, q_hi = np.quantile(means, [a, 1 - a])
    return float(q_lo), float(q_hi)


def mean_with_ci(values: Sequence[float], *, seed: int = 0) -> dict[str, Any]:
    """Mean of per-problem ``values`` in [0, 1] with a 95 % interval.

    Returns:
        ``{"mean": m, "ci95": [lo, hi], "ci_method": "wilson" | "bootstrap"}``: Wilson
        (:func:`wilson_interval`) when every value is 0 or 1, else the percentile bootstrap over
        problems (:func:`bootstrap_interval`, 2,000 resamples, ``seed``).

    Raises:
        ValueError: no values.
    """
    x = [float(v) for v in values]
    if not x:
        raise ValueError("mean_with_ci: no values")
    m = sum(x) / len(x)
    if all(v in (0.0, 1.0) for v in x):
        lo, hi = wilson_interval(int(sum(x)), len(x))
        method = "wilson"
    else:
        lo, hi = bootstrap_interval(x, seed=seed)
        method = "bootstrap"
    return {"mean": m, "ci95": [lo, hi], "ci_method": method}

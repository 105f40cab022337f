"""Statistical rules for paper claims over seeds: paired tests, a bootstrap interval, TOST, Holm, power.

Every comparison of an arm with a reference (GRPO) is **paired by seed**: the same seed gives both
runs the same prompt order, the same held-out problems and the same evaluation sampling, so the
per-seed difference ``d_s = g(arm_s, ref_s)`` removes the between-seed variance the two arms share.
The rules, each a function below:

* :func:`pair_by_seed` — the two arms' per-seed values, paired; mismatched seed sets raise
  :class:`UnpairedSeedsError` (a comparison over different seeds is not paired);
* :func:`paired_t` — one-sample Student t-test of ``mean d = 0`` (``scipy.stats.ttest_1samp``);
* :func:`wilcoxon_signed_rank` — the Wilcoxon signed-rank test of the same (exact null distribution
  for small samples, ``scipy.stats.wilcoxon``), robust to one outlying seed;
* :func:`bootstrap_mean_ci` — a seeded BCa (or percentile) bootstrap interval of the mean difference
  (``scipy.stats.bootstrap``);
* :func:`tost` — two one-sided t-tests of equivalence within ``± margin`` (what "matches" means);
* :func:`regime_counts` — per arm, how many seeds collapsed and how many took off (thresholds are
  parameters), reported as counts such as ``1/5 collapsed`` beside every mean;
* :func:`holm` — Holm's step-down adjustment of the p-values of a family of primary claims;
* :func:`paired_t_power` / :func:`min_detectable_effect` — power of the one-sided paired t-test for an
  effect of a stated size (noncentral t), and the effect the design detects with 80 % power.

Sources: Student (1908) and Wilcoxon (1945) for the tests; Efron (1987), "Better bootstrap confidence
intervals", JASA 82(397) for BCa; Schuirmann (1987), "A comparison of the two one-sided tests
procedure ...", J. Pharmacokin. Biopharm. 15(6) for TOST; Holm (1979), "A simple sequentially
rejective multiple test procedure", Scand. J. Statist. 6(2); Cohen (1988), "Statistical Power
Analysis for the Behavioral Sciences", ch. 2 for power via the noncentral t. The verdict built from
them lives in :mod:`rlvr.compare.claims` (issue 29 item 1).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from scipy import stats as sps

from rlvr.errors import ConfigError

__all__ = [
    "Paired",
    "Regimes",
    "UnpairedSeedsError",
    "bootstrap_mean_ci",
    "holm",
    "largest_stable_rate",
    "min_detectable_effect",
    "pair_by_seed",
    "paired_t",
    "paired_t_power",
    "regime_counts",
    "t_bound",
    "tost",
    "wilcoxon_signed_rank",
]

ALTERNATIVES = ("greater", "less", "two-sided")
"""``alternative`` values of the tests (as in ``scipy.stats``): ``greater`` tests ``mean d > 0``."""


class UnpairedSeedsError(ConfigError):
    """The arm and the reference were not run on the same seeds (a paired test needs both per seed)."""


@dataclass(frozen=True)
class Paired:
    """Per-seed values of an arm and its reference on the same ``seeds`` (ascending)."""

    seeds: tuple[int, ...]
    arm: np.ndarray
    ref: np.ndarray


def pair_by_seed(arm: Mapping[int, float], ref: Mapping[int, float], *, name: str = "claim") -> Paired:
    """Pair two ``{seed: value}`` maps (non-finite values count as missing runs).

    Raises:
        UnpairedSeedsError: the finite seeds differ between the two maps (names the seeds each
            side lacks) — a claim must compare the same seeds or it is not paired.
    """
    a = {int(s): float(v) for s, v in arm.items() if v is not None and math.isfinite(float(v))}
    r = {int(s): float(v) for s, v in ref.items() if v is not None and math.isfinite(float(v))}
    if set(a) != set(r):
        raise UnpairedSeedsError(
            f"{name}: the arm and the reference must share their seeds for a paired comparison; arm has "
            f"{sorted(a)}, reference {sorted(r)} (arm lacks {sorted(set(r) - set(a))}, reference lacks "
            f"{sorted(set(a) - set(r))})")
    seeds = tuple(sorted(a))
    return Paired(seeds, np.array([a[s] for s in seeds]), np.array([r[s] for s in seeds]))


def _check_alt(alternative: str) -> None:
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {alternative!r}")


def _as_1d(d: Sequence[float], fn: str, least: int = 2) -> np.ndarray:
    x = np.asarray(d, dtype=np.float64).ravel()
    if x.size < least or not np.all(np.isfinite(x)):
        raise ValueError(f"{fn}: need at least {least} finite differences, got {x.tolist()}")
    return x


def paired_t(d: Sequence[float], *, alternative: str = "greater", mu: float = 0.0) -> tuple[float, float]:
    """Student t-test of the mean of the paired differences ``d`` (shape ``[n]``) against ``mu``.

    Returns ``(t, p)``; ``t = (mean − mu) / (s / √n)`` with ``n − 1`` degrees of freedom. Zero spread
    (every ``d`` equal) gives ``t = ±inf`` and ``p`` 0 or 1 by the side of ``mean − mu`` (``0`` exactly
    on ``mu`` gives ``p = 1``): a constant difference is certain, not undefined.

    Raises:
        ValueError: fewer than 2 values, a non-finite value or a bad ``alternative``.
    """
    _check_alt(alternative)
    x = _as_1d(d, "paired_t")
    gap = float(x.mean() - mu)
    if float(np.ptp(x)) == 0.0:
        if gap == 0.0:
            return 0.0, 1.0
        t = math.copysign(math.inf, gap)
        hit = {"greater": gap > 0, "less": gap < 0, "two-sided": True}[alternative]
        return t, 0.0 if hit else 1.0
    res = sps.ttest_1samp(x, mu, alternative=alternative)
    return float(res.statistic), float(res.pvalue)


def wilcoxon_signed_rank(d: Sequence[float], *, alternative: str = "greater") -> tuple[float, float]:
    """Wilcoxon signed-rank test of the paired differences ``d`` (``[n]``) being centred at 0.

    Returns ``(W+, p)``: ``W+`` the sum of the ranks of |d| over the positive ``d``; ``p`` from the exact
    null distribution when ``n ≤ 50`` without ties or zeros (``scipy.stats.wilcoxon``, ``method='auto'``),
    else its normal approximation. Zero differences are dropped (Wilcoxon's own convention); when
    every difference is zero, ``(0, 1)``.

    Raises:
        ValueError: fewer than 2 values, a non-finite value or a bad ``alternative``.
    """
    _check_alt(alternative)
    x = _as_1d(d, "wilcoxon_signed_rank")
    if not np.any(x != 0):
        return 0.0, 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "exact p unavailable with ties/zeros": the normal approximation is used
        res = sps.wilcoxon(x, alternative=alternative, zero_method="wilcox")
    nz = x[x != 0]
    ranks = sps.rankdata(np.abs(nz))
    return float(ranks[nz > 0].sum()), float(res.pvalue)


def bootstrap_mean_ci(d: Sequence[float], *, level: float = 0.95, n_resamples: int = 9999, seed: int = 0,
                      method: str = "BCa") -> tuple[float, float, str]:
    """Bootstrap interval of the mean of ``d`` (``[n]``): ``(low, high, method used)``.

    Seeds are resampled with replacement (``scipy.stats.bootstrap``, ``rng = default_rng(seed)``, so
    the interval is reproducible). ``BCa`` (bias-corrected and accelerated; Efron 1987) falls back to
    the percentile interval when its corrections are undefined (e.g. too few distinct resamples); a
    constant ``d`` gives the point interval. With n ≈ 5 seeds any bootstrap interval is too narrow
    (it cannot see beyond the observed values); it is reported beside the t-test, not instead of it.

    Raises:
        ValueError: fewer than 2 values, ``level`` outside (0, 1) or an unknown ``method``.
    """
    x = _as_1d(d, "bootstrap_mean_ci")
    if not 0 < level < 1 or method not in ("BCa", "percentile"):
        raise ValueError(f"bootstrap_mean_ci: need 0 < level < 1 and method BCa or percentile, got {level}, {method!r}")
    if float(np.ptp(x)) == 0.0:
        return float(x[0]), float(x[0]), "constant"
    for m in dict.fromkeys([method, "percentile"]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scipy's DegenerateDataWarning for tiny samples: checked below
            res = sps.bootstrap((x,), np.mean, confidence_level=level, n_resamples=n_resamples, method=m,
                                rng=np.random.default_rng(seed), vectorized=True)
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(lo) and math.isfinite(hi):
            return lo, hi, m
    return math.nan, math.nan, "none"


def t_bound(d: Sequence[float], *, level: float = 0.95, side: str = "upper") -> float:
    """One-sided Student-t confidence bound of ``mean d``: ``mean ± t_{level, n−1} · s/√n``.

    ``side='upper'``: the mean is below it with confidence ``level``; ``'lower'``: above it.

    Raises:
        ValueError: fewer than 2 values, ``level`` outside (0, 1) or a bad ``side``.
    """
    x = _as_1d(d, "t_bound")
    if not 0 < level < 1 or side not in ("upper", "lower"):
        raise ValueError(f"t_bound: need 0 < level < 1 and side upper|lower, got {level}, {side!r}")
    half = float(sps.t.ppf(level, x.size - 1)) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return float(x.mean()) + (half if side == "upper" else -half)


def tost(d: Sequence[float], margin: float) -> tuple[float, float, float]:
    """Two one-sided t-tests (TOST) that the mean of ``d`` lies inside ``(−margin, +margin)``.

    Returns ``(p, p_low, p_high)``: ``p_low`` tests H0 ``mean ≤ −margin`` against ``> −margin``,
    ``p_high`` tests H0 ``mean ≥ margin`` against ``< margin`` and ``p = max(p_low, p_high)``.
    Equivalence is shown at level α when ``p < α`` — the same as the two-sided ``1 − 2α`` t-interval
    lying inside the margin (Schuirmann 1987).

    Raises:
        ValueError: ``margin`` not positive, or the input errors of :func:`paired_t`.
    """
    if not margin > 0:
        raise ValueError(f"tost: margin must be > 0, got {margin!r}")
    _, p_lo = paired_t(d, alternative="greater", mu=-margin)
    _, p_hi = paired_t(d, alternative="less", mu=margin)
    return max(p_lo, p_hi), p_lo, p_hi


@dataclass(frozen=True)
class Regimes:
    """Thresholds that sort a run's final value into collapsed / stayed / took off.

    A run **collapsed** when its value is below ``collapse_below`` or (with ``collapse_drop``) below
    ``start − collapse_drop``; it **took off** when (with ``takeoff_above``) above ``takeoff_above`` or
    (with ``takeoff_gain``) above ``start + takeoff_gain``. ``start`` is the pre-trained policy's value.
    Defaults (interpretation, issue 29: testbed v2l outcomes at lr 3e-4 were trimodal, ~0.0 / ~0.43 /
    ~0.68 from a start of 0.316): collapse below 0.05 or more than 0.10 below the start; take-off
    more than 0.25 above the start.
    """

    collapse_below: float = 0.05
    collapse_drop: float | None = 0.10
    takeoff_above: float | None = None
    takeoff_gain: float | None = 0.25


def regime_counts(values: Sequence[float], start: float | None = None, regimes: Regimes = Regimes()) -> dict:
    """Counts of collapsed and taken-off runs among ``values`` (one final value per seed).

    Returns ``{"n", "collapsed", "took_off", "text"}``, ``text`` e.g. ``"1/5 collapsed, 2/5 took off"``.
    The start-relative thresholds are skipped when ``start`` is None.
    """
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    low = [regimes.collapse_below]
    high: list[float] = []
    if start is not None and regimes.collapse_drop is not None:
        low.append(start - regimes.collapse_drop)
    if regimes.takeoff_above is not None:
        high.append(regimes.takeoff_above)
    if start is not None and regimes.takeoff_gain is not None:
        high.append(start + regimes.takeoff_gain)
    collapsed = sum(v < max(low) for v in vals)
    took_off = sum(bool(high) and v > min(high) for v in vals)
    n = len(vals)
    return {"n": n, "collapsed": collapsed, "took_off": took_off,
            "text": f"{collapsed}/{n} collapsed, {took_off}/{n} took off"}


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order.

    Sort ascending, ``p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) · p_(j))`` for ``m`` p-values; rejecting
    every claim with ``p̃ < α`` controls the family-wise error rate at α (Holm 1979). NaN entries (a
    claim that could not be tested) stay NaN and do not count in ``m``.
    """
    p = [float(x) for x in pvalues]
    idx = sorted((i for i, x in enumerate(p) if math.isfinite(x)), key=lambda i: p[i])
    m = len(idx)
    out = [math.nan] * len(p)
    running = 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def paired_t_power(effect: float, sd: float, n: int, *, alpha: float = 0.05, alternative: str = "greater") -> float:
    """Power of the paired t-test with ``n`` pairs to detect a true mean difference ``effect``.

    With ``δ = effect / sd · √n`` (noncentrality) and ``df = n − 1``: one-sided
    ``1 − F_{t'(df, δ)}(t_{1−α, df})``; two-sided ``1 − F(t_{1−α/2}) + F(−t_{1−α/2})`` with ``F`` the
    noncentral t CDF (``scipy.stats.nct``; Cohen 1988 ch. 2). ``sd`` is the standard deviation of the
    per-seed differences (from a pilot or the data); ``alternative='less'`` mirrors ``'greater'``.

    Raises:
        ValueError: ``n < 2``, ``sd ≤ 0``, α outside (0, 1) or a bad ``alternative``.
    """
    _check_alt(alternative)
    if n < 2 or not sd > 0 or not 0 < alpha < 1:
        raise ValueError(f"paired_t_power: need n >= 2, sd > 0 and 0 < alpha < 1, got n={n}, sd={sd}, alpha={alpha}")
    df, nc = n - 1, effect / sd * math.sqrt(n)
    if alternative == "less":
        nc = -nc
    if alternative == "two-sided":
        tc = float(sps.t.ppf(1 - alpha / 2, df))
        return float(sps.nct.sf(tc, df, nc) + sps.nct.cdf(-tc, df, nc))
    return float(sps.nct.sf(float(sps.t.ppf(1 - alpha, df)), df, nc))


def min_detectable_effect(sd: float, n: int, *, alpha: float = 0.05, power: float = 0.8,
                          alternative: str = "greater") -> float:
    """The smallest true mean difference the paired t-test detects with probability ``power``.

    Solves :func:`paired_t_power` ``= power`` for ``effect`` (``scipy.optimize.brentq``); same units
    as ``sd``, a magnitude (``alternative='less'`` is solved as its mirror ``'greater'``). E.g. ``n = 5``
    seeds at α = 0.05 one-sided give ``≈ 1.36 · sd`` for 80 % power (``n = 8``: ``0.98 · sd``).

    Raises:
        ValueError: ``power`` outside (α, 1), or the input errors of :func:`paired_t_power`.
    """
    from scipy.optimize import brentq

    if not alpha < power < 1:
        raise ValueError(f"min_detectable_effect: power must be in (alpha, 1), got {power}")
    alternative = "greater" if alternative == "less" else alternative
    paired_t_power(sd, sd, n, alpha=alpha, alternative=alternative)  # validates the arguments
    hi = sd
    while paired_t_power(hi, sd, n, alpha=alpha, alternative=alternative) < power:
        hi *= 2
    return float(brentq(lambda e: paired_t_power(e, sd, n, alpha=alpha, alternative=alternative) - power,
                        0.0, hi, xtol=1e-10 * sd))


def largest_stable_rate(finals: Mapping[float, Sequence[float]], start: float | None = None,
                        regimes: Regimes = Regimes()) -> tuple[float, bool]:
    """The learning-rate rule of the pre-registered study: the largest rate with no collapsed tuning seed.

    Args:
        finals: ``{learning rate: [final value of each tuning seed]}`` (e.g. held-out pass@1).
        start: the pre-trained value (for the start-relative collapse threshold of ``regimes``).

    Returns:
        ``(rate, stable)``; when every rate collapsed on some seed, the smallest rate and ``False``.

    Raises:
        ValueError: no rates, or a rate without any finished seed.

    Source: interpretation of issue 29 item 3 ("the largest rate with no collapse on any tuning seed").
    """
    if not finals:
        raise ValueError("largest_stable_rate: no learning rates")
    for lr in sorted(finals, reverse=True):
        counts = regime_counts(finals[lr], start, regimes)
        if counts["n"] == 0:
            raise ValueError(f"largest_stable_rate: rate {lr:g} has no finished tuning seed")
        if counts["collapsed"] == 0:
            return lr, True
    return min(finals), False

"""The v4 verdict rule of a paper claim: one rule for both directions, Holm over the family for both.

The v3 rule (:func:`rlvr.compare.claims.decide`, kept for the pre-registered v3 tables) called a claim
*reproduced* when the mean paired difference was shown > 0, and *refuted* when its upper bound lay below the
effect of interest, so two similar small gains could get opposite labels; it Holm-adjusted only the
"reproduced" side and printed a 95 % interval beside a TOST at α = 0.05. The v4 rule (issue 38 item 3;
``docs/results/preregistration_v4.md``) tests every side against the **same** line, the effect of interest
``e`` (``effect``; 0 when the claim states none), with one-sided t-tests at α (or Wilcoxon with ``test:
wilcoxon``), each side Holm-adjusted over the file's primaries:

* ``higher`` / ``lower`` / ``faster`` (paired differences ``d``, positive when the claim holds):
  **reproduced** when ``p(mean d ≤ e)`` (H0) is rejected — the one-sided ``1 − α`` lower bound exceeds
  ``e``; **positive, below effect of interest** when ``p(mean d ≥ e)`` and ``p(mean d ≤ 0)`` are both
  rejected — ``0 < lower bound`` and ``upper bound < e``; **refuted** when ``p(mean d ≥ e)`` is rejected
  but the gain is not shown positive; **inconclusive** otherwise.
* ``match`` (``± margin``) and ``band`` (``[lo, hi]``): **reproduced (equivalent)** when TOST rejects both
  one-sided nulls at α — the two-sided ``1 − 2α`` (90 %) t-interval lies inside the margin (Schuirmann
  1987); **refuted (not equivalent)** when the 90 % interval lies wholly outside it (one of the two
  one-sided tests ``mean ≥ hi`` / ``mean ≤ lo`` rejected at α: their rejection regions are disjoint, so the
  test has size α); **inconclusive** otherwise.

Source: interpretation of issue 38 item 3 (Holm 1979 applied to each side's family; Schuirmann 1987).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from rlvr.compare import stats_rules as sr

SIDES = ("reproduce", "refute", "positive")
"""The three one-sided p-values a v4 claim carries (``p_<side>``; ``positive`` only for higher/lower/faster)."""

V4_VERDICTS = ("reproduced", "positive, below effect of interest", "inconclusive", "refuted", "untestable here")
"""The v4 verdict vocabulary (match/band claims say "equivalent" / "not equivalent" in the rule text)."""


def _p_one(d: np.ndarray, mu: float, alternative: str, test: str) -> float:
    if test == "t":
        return sr.paired_t(d, alternative=alternative, mu=mu)[1]
    return sr.wilcoxon_signed_rank(d - mu, alternative=alternative)[1]


def v4_stats(direction: str, d: Sequence[float], *, effect: float | None, lo: float, hi: float,
             alpha: float = 0.05, test: str = "t") -> dict[str, Any]:
    """The v4 one-sided p-values and the two-sided ``1 − 2α`` t-interval of ``mean d`` (``d``: ``[n]``, n ≥ 2).

    ``lo``/``hi``: the equivalence range of ``match`` (``∓ margin``) or ``band``; ignored otherwise.
    Returns ``{"p_reproduce", "p_refute", "p_positive" (None for match/band), "interval90": [low, high]}``
    (``interval90`` is the ``1 − 2α`` interval: 90 % at α = 0.05).

    Raises:
        ValueError: fewer than 2 values or a non-finite value (from :mod:`rlvr.compare.stats_rules`).
    """
    x = np.asarray(d, dtype=float)
    iv = [sr.t_bound(x, level=1 - alpha, side="lower"), sr.t_bound(x, level=1 - alpha, side="upper")]
    if direction in ("match", "band"):
        p_in = max(_p_one(x, lo, "greater", test), _p_one(x, hi, "less", test))
        p_out = min(_p_one(x, hi, "greater", test), _p_one(x, lo, "less", test))
        return {"p_reproduce": p_in, "p_refute": p_out, "p_positive": None, "interval90": iv}
    e = float(effect or 0.0)
    return {"p_reproduce": _p_one(x, e, "greater", test), "p_refute": _p_one(x, e, "less", test),
            "p_positive": _p_one(x, 0.0, "greater", test), "interval90": iv}


def holm_sides(rows: list[dict[str, Any]], family: Sequence[int]) -> None:
    """Holm-adjust each side's p-values (:data:`SIDES`) over the claims ``family`` (row indices), in place:
    ``rows[i]["p_holm_<side>"]``. Rows without a side's p-value (untestable, or match's ``positive``) are
    left out of that side's family."""
    for side in SIDES:
        idx = [i for i in family if rows[i].get(f"p_{side}") is not None]
        for i, p in zip(idx, sr.holm([rows[i][f"p_{side}"] for i in idx])):
            rows[i][f"p_holm_{side}"] = p


def decide_v4(direction: str, stats: dict[str, Any], *, primary: bool, alpha: float = 0.05,
              effect: float | None = None, lo: float = 0.0, hi: float = 0.0) -> tuple[str, str]:
    """``(verdict, rule text)`` under the v4 rule (module docstring) from :func:`v4_stats`' values in ``stats``
    (Holm-adjusted ``p_holm_<side>`` for a primary claim, raw ``p_<side>`` otherwise)."""
    if "untestable" in stats:
        return "untestable here", str(stats["untestable"])

    def p(side: str) -> float:
        v = stats.get(f"p_holm_{side}" if primary else f"p_{side}")
        return math.nan if v is None else float(v)

    which = "Holm " if primary else ""
    a, b = stats["interval90"]
    pct = f"{100 * (1 - 2 * alpha):g} %"
    iv = f"{pct} t-interval [{a:.3g}, {b:.3g}]"
    if direction in ("match", "band"):
        rng = f"[{lo:g}, {hi:g}]"
        if p("reproduce") < alpha:
            return "reproduced", f"equivalent: TOST {which}p = {p('reproduce'):.3g} < {alpha:g}, {iv} inside {rng}"
        if p("refute") < alpha:
            return "refuted", f"not equivalent: {which}p = {p('refute'):.3g} < {alpha:g}, {iv} outside {rng}"
        return "inconclusive", f"TOST {which}p = {p('reproduce'):.3g}, {iv} overlaps the edge of {rng}"
    e = float(effect or 0.0)
    if p("reproduce") < alpha:
        return "reproduced", f"gain > {e:g}: {which}p = {p('reproduce'):.3g} < {alpha:g}; {iv}"
    if p("refute") < alpha:
        if e > 0 and p("positive") < alpha:
            return ("positive, below effect of interest",
                    f"0 < gain < {e:g}: {which}p = {p('positive'):.3g} (> 0), {p('refute'):.3g} (< {e:g}); {iv}")
        return "refuted", f"gain < {e:g}: {which}p = {p('refute'):.3g} < {alpha:g}; {iv}"
    pos = f"; shown > 0 ({which}p = {p('positive'):.3g})" if p("positive") < alpha and e > 0 else ""
    return "inconclusive", f"{which}p(> {e:g}) = {p('reproduce'):.3g}, p(< {e:g}) = {p('refute'):.3g}{pos}; {iv}"

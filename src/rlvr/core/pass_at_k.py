"""Unbiased pass@k estimator (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", §2.1).

With ``n`` samples of which ``c`` are correct::

    pass@k = 1 − C(n − c, k) / C(n, k) = 1 − Π_{i = n−c+1}^{n} (1 − k / i)

The product form avoids the huge binomials of the ratio form (it is the numerically stable
implementation given in the paper's Figure 3).
"""

from __future__ import annotations

import operator
from typing import Sequence

__all__ = ["mean_pass_at_k", "pass_at_k"]


def _as_int(x, name: str) -> int:
    if isinstance(x, bool):
        raise ValueError(f"pass_at_k: {name} must be an integer, got {x!r}")
    try:
        return operator.index(x)
    except TypeError:
        if isinstance(x, float) and x.is_integer():
            return int(x)
        raise ValueError(f"pass_at_k: {name} must be an integer, got {x!r}") from None


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of the probability that at least one of ``k`` samples is correct.

    Args:
        n: samples drawn for the problem (``>= 1``).
        c: correct samples among them (``0 <= c <= n``).
        k: budget (``1 <= k <= n``).

    Returns:
        A float in ``[0, 1]``: ``0.0`` when ``c == 0``, ``1.0`` when ``n − c < k``, and ``c / n`` for
        ``k == 1``.

    Raises:
        ValueError: a non-integer or negative argument, ``n == 0``, ``k == 0``, ``k > n`` or ``c > n``.

    Source: Chen et al. 2021 (Codex paper) §2.1, Eq. 1 and Figure 3 (numerically stable product).
    """
    n, c, k = _as_int(n, "n"), _as_int(c, "c"), _as_int(k, "k")
    if n < 0 or c < 0 or k < 0:
        raise ValueError(f"pass_at_k: n, c, k must be non-negative, got n={n}, c={c}, k={k}")
    if n == 0:
        raise ValueError("pass_at_k: n must be >= 1 (no samples)")
    if k == 0:
        raise ValueError("pass_at_k: k must be >= 1")
    if k > n:
        raise ValueError(f"pass_at_k: k={k} exceeds the number of samples n={n}")
    if c > n:
        raise ValueError(f"pass_at_k: c={c} correct exceeds the number of samples n={n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(ns: Sequence[int] | int, cs: Sequence[int], k: int) -> float:
    """Mean of :func:`pass_at_k` over problems.

    Args:
        ns: samples per problem, one per entry of ``cs``; an ``int`` means the same ``n`` for all.
        cs: correct samples per problem.
        k: budget, ``1 <= k <= min(ns)``.

    Returns:
        The mean over problems, a float in ``[0, 1]``.

    Raises:
        ValueError: no problems, ``ns`` and ``cs`` of different lengths, or any invalid
            ``(n, c, k)`` (see :func:`pass_at_k`).

    Source: Chen et al. 2021 §2.1 (pass@k averaged over problems).
    """
    cs = list(cs)
    try:
        ns_list = [operator.index(ns)] * len(cs)  # one n for every problem
    except TypeError:
        ns_list = list(ns)
    if not cs:
        raise ValueError("mean_pass_at_k: no problems given")
    if len(ns_list) != len(cs):
        raise ValueError(f"mean_pass_at_k: ns has {len(ns_list)} entries but cs has {len(cs)}")
    return sum(pass_at_k(n, c, k) for n, c in zip(ns_list, cs)) / len(cs)

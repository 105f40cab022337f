"""Wording of counts in messages: ``1 step``, ``2 steps`` (never ``1 steps``).

Imports nothing from rlvr (layer 0), so every module that prints a count can use it.
"""

from __future__ import annotations


def plural(n: int | float, noun: str, many: str | None = None) -> str:
    """``"<n> <noun>"`` with the noun in the plural unless ``n`` is exactly 1.

    Args:
        n: the count (an integral float such as ``1.0`` counts as 1), or a phrase such as ``"2 of 4"``
            (then the plural).
        noun: the singular, e.g. ``"step"``.
        many: the plural where it is not ``noun + "s"`` (e.g. ``"matrices"``).

    Returns:
        e.g. ``plural(1, "step") == "1 step"``, ``plural(0, "error") == "0 errors"``,
        ``plural(3, "process", "processes") == "3 processes"``, ``plural("2 of 4", "problem") == "2 of 4 problems"``.
    """
    try:
        one = float(n) == 1
        shown = int(n) if float(n).is_integer() else n
    except (TypeError, ValueError):  # already words, e.g. eval's "2 of 4" for a shard: plural
        one, shown = str(n).strip() == "1", n
    return f"{shown} {noun if one else (many or noun + 's')}"

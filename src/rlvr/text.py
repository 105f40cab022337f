"""Wording of counts in messages: ``1 step``, ``2 steps`` (never ``1 steps``).

Imports nothing from rlvr (layer 0), so every module that prints a count can use it.
"""

from __future__ import annotations


def plural(n: int | float, noun: str, many: str | None = None) -> str:
    """``"<n> <noun>"`` with the noun in the plural unless ``n`` is exactly 1.

    Args:
        n: the count (an integral float such as ``1.0`` counts as 1).
        noun: the singular, e.g. ``"step"``.
        many: the plural where it is not ``noun + "s"`` (e.g. ``"matrices"``).

    Returns:
        e.g. ``plural(1, "step") == "1 step"``, ``plural(0, "error") == "0 errors"``,
        ``plural(3, "process", "processes") == "3 processes"``.
    """
    shown = int(n) if float(n).is_integer() else n
    return f"{shown} {noun if n == 1 else (many or noun + 's')}"

"""Name-keyed registries shared by the core (advantage estimators, policy losses).

A lookup of an unknown name raises :class:`UnknownNameError`, which is at the same time a
``KeyError`` (it is a failed mapping lookup), a ``ValueError`` (it is a bad configuration value) and
an :class:`rlvr.errors.ConfigError` (so the CLI reports it as a configuration error). Its message
names the registry and every registered key.
"""

from __future__ import annotations

from typing import Callable, Mapping, TypeVar

from rlvr.errors import ConfigError

F = TypeVar("F", bound=Callable)


class UnknownNameError(ConfigError, KeyError, ValueError):
    """A name is not in a core registry. The message names the registry and its keys."""

    def __str__(self) -> str:  # KeyError would otherwise repr() the message (adding quotes)
        return str(self.args[0]) if self.args else ""


def lookup(registry: Mapping[str, F], name: str, registry_name: str, hint: str = "") -> F:
    """Return ``registry[name]``.

    Raises:
        UnknownNameError: ``name`` is not registered; the message names ``registry_name``, the
            registered keys and ``hint`` (if given).
    """
    try:
        return registry[name]
    except (KeyError, TypeError):
        keys = ", ".join(repr(k) for k in sorted(registry))
        msg = f"unknown name {name!r} for {registry_name}: registered names are {keys}"
        if hint:
            msg += f". {hint}"
        raise UnknownNameError(msg) from None

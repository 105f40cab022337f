"""Name-keyed registries: the one way a part (estimator, loss, sampler, schedule, mask, filter) is
made available to a recipe.

Every registry is a :class:`Registry` and is filled with its decorator::

    from rlvr.schedules import SCHEDULES

    @SCHEDULES.register("my_schedule")
    def make_my_schedule(cfg): ...

A lookup of an unknown name raises :class:`UnknownNameError`, which is at the same time a ``KeyError``
(a failed mapping lookup), a ``ValueError`` (a bad configuration value) and an
:class:`rlvr.errors.ConfigError` (the CLI exits 2); its message names the config key, every registered
name and the nearest one.
"""

from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterator, TypeVar

from rlvr.errors import ConfigError

F = TypeVar("F", bound=Callable)


class UnknownNameError(ConfigError, KeyError, ValueError):
    """A name is not registered. The message names the registry, its keys and the nearest key."""

    def __str__(self) -> str:  # KeyError would otherwise repr() the message (adding quotes)
        return str(self.args[0]) if self.args else ""


class Registry(Generic[F]):
    """A mapping ``name → factory`` filled by :meth:`register`.

    Args:
        key: the config key the names come from (``"schedule"``), used in error messages.
        where: where the registry lives (``"rlvr.schedules.SCHEDULES"``), used in error messages.
        hint: extra sentence for the unknown-name message.
        initial: entries to start with.
    """

    def __init__(self, key: str, where: str, hint: str = "", initial: dict[str, F] | None = None) -> None:
        self.key = key
        self.where = where
        self.hint = hint
        self._items: dict[str, F] = dict(initial or {})

    def register(self, name: str, *, replace: bool = False) -> Callable[[F], F]:
        """Decorator adding the decorated callable under ``name``; returns it unchanged.

        Raises:
            ValueError: ``name`` is already registered with another object and ``replace`` is false.
        """

        def deco(fn: F) -> F:
            old = self._items.get(name)
            if old is not None and old is not fn and not replace:
                raise ValueError(f"{self.where}: {name!r} is already registered ({old!r}); pass replace=True")
            self._items[name] = fn
            return fn

        return deco

    def unknown(self, name: object, hint: str = "") -> UnknownNameError:
        """The error for an unknown ``name`` (nearest registered name suggested)."""
        keys = sorted(self._items)
        close = difflib.get_close_matches(str(name), keys, n=1)
        msg = (f"{self.key}: unknown name {name!r} (registered in {self.where}: "
               f"{', '.join(repr(k) for k in keys)})")
        if close:
            msg += f"; did you mean {close[0]!r}?"
        if hint or self.hint:
            msg += f" {hint or self.hint}"
        return UnknownNameError(msg)

    def lookup(self, name: str, hint: str = "") -> F:
        """``self[name]`` with an optional extra ``hint`` in the error.

        Raises:
            UnknownNameError: ``name`` is not registered.
        """
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise self.unknown(name, hint) from None

    def check(self, name: str) -> None:
        """Raise :class:`UnknownNameError` unless ``name`` is registered (config validation)."""
        self.lookup(name)

    def get(self, name: str, default: F | None = None) -> F | None:
        """``self[name]``, or ``default`` when not registered (as :meth:`dict.get`)."""
        return self._items.get(name, default)

    def __getitem__(self, name: str) -> F:
        return self.lookup(name)

    def __setitem__(self, name: str, fn: F) -> None:  # tests swap entries in and out
        self._items[name] = fn

    def __delitem__(self, name: str) -> None:
        del self._items[name]

    def pop(self, name: str, *default):
        """Remove and return ``name`` (as :meth:`dict.pop`)."""
        return self._items.pop(name, *default)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def keys(self):
        """Registered names."""
        return self._items.keys()

    def items(self):
        """``(name, factory)`` pairs."""
        return self._items.items()

    def __repr__(self) -> str:
        return f"Registry({self.where}: {sorted(self._items)})"

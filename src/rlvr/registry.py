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

A part may declare its own typed config section when it registers (``config=`` a pydantic model,
``section=`` the top-level YAML key, default the part's name)::

    @SCHEDULES.register("entropy_annealed", config=EntropyAnnealConfig, section="entropy_anneal")
    def make(cfg): ...          # cfg.entropy_anneal is an EntropyAnnealConfig

The section joins :data:`CONFIG_SECTIONS`, which :func:`rlvr.config.build_config` validates the YAML
against (strict keys, nearest-name errors), so it must be registered before the config is built: the
CLI imports plugins first (:mod:`rlvr.plugins`).
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
        self._sections: dict[str, str] = {}

    def register(
        self, name: str, *, replace: bool = False, config: type | None = None, section: str | None = None
    ) -> Callable[[F], F]:
        """Decorator adding the decorated callable under ``name``; returns it unchanged.

        Args:
            name: the name a recipe uses.
            replace: allow replacing another object already registered under ``name``.
            config: the part's typed config section (a pydantic model class with defaults for every
                field); added to :data:`CONFIG_SECTIONS` under ``section``.
            section: the top-level config key of ``config`` (default ``name``); several parts may
                share one section (FBOS-RL's sampler, estimator and schedule all read ``fbos``).

        Raises:
            ValueError: ``name`` is already registered with another object and ``replace`` is false;
                ``section`` given without ``config``; ``section`` already holds another model.
        """
        if section is not None and config is None:
            raise ValueError(f"{self.where}: {name!r}: section={section!r} needs config= (its pydantic model)")
        if config is not None:
            register_section(section or name, config)

        def deco(fn: F) -> F:
            old = self._items.get(name)
            if old is not None and old is not fn and not replace:
                raise ValueError(f"{self.where}: {name!r} is already registered ({old!r}); pass replace=True")
            self._items[name] = fn
            if config is not None:
                self._sections[name] = section or name
            return fn

        return deco

    def section_of(self, name: str) -> str | None:
        """The config section the part ``name`` declared when it registered (``None``: none)."""
        return self._sections.get(name)

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


CONFIG_SECTIONS: Registry[type] = Registry("config section", "rlvr.registry.CONFIG_SECTIONS")
"""Top-level config key → the pydantic model of that section (declared by parts when they register,
see :meth:`Registry.register`; :func:`rlvr.config.config_model` makes each a field of the run config)."""


def register_section(name: str, model: type) -> type:
    """Declare the config section ``name`` (a top-level YAML key) validated by ``model``; returns ``model``.

    Registering the same model again under the same name is a no-op (several parts share a section).

    Raises:
        ValueError: ``name`` already holds another model.
    """
    return CONFIG_SECTIONS.register(name)(model)

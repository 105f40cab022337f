"""Plugins: user modules that register parts (and their config sections) before a config is validated.

Three ways in, all imported before :func:`rlvr.config.build_config` validates anything:

* ``plugins: [my_pkg.my_algo, algo/my_algo.py]`` in a config file (or ``plugins=[...]`` override);
* ``--plugin MODULE`` (repeatable) on every ``rlvr`` subcommand;
* the entry-point group ``rlvr.plugins`` of an installed package (``pyproject.toml``:
  ``[project.entry-points."rlvr.plugins"] my_algo = "my_pkg.my_algo"``), loaded once per process.

An entry is a module name or a ``.py`` file. A module name is imported as Python would, with the working
directory and each config file's folder also searched (after ``sys.path``, so an installed package of
that name wins). A file (a name ending in ``.py`` or holding a ``/``) is looked up from the working
directory, then from each config file's folder; it is imported as a module named after its stem, and
its folder joins ``sys.path`` so it can import its siblings. Importing is registering: the module's
decorators (``@SCHEDULES.register(..., config=...)``) run on import.

Interpretation: torchtune's dotted-path components and pytest's ``-p`` / entry-point plugins, reduced to
"import these modules first"; a failure is a configuration error (exit 2) that names the module and the
import error, before any model loads.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any, Iterable

from rlvr.errors import ConfigError
from rlvr.user_modules import import_user_module

ENTRY_POINT_GROUP = "rlvr.plugins"
"""The ``importlib.metadata`` entry-point group an installed package registers its plugin modules under."""

_entry_points_loaded = False


def import_plugin(name: str, search: Iterable[Path] = ()):
    """Import one plugin (a module name or a ``.py`` file, see the module docstring); returns the module.
    The loader is :func:`rlvr.user_modules.import_user_module` (a file is imported under its stem).

    Args:
        name: ``pkg.module`` or ``path/to/file.py``.
        search: extra folders (the config files' folders) to look in after the working directory.

    Raises:
        ConfigError: the file does not exist, or importing raised (the message names the plugin and
            the error, e.g. ``plugin 'my_algo' failed to import: ModuleNotFoundError: No module named 'x'``).
    """
    return import_user_module(name, f"plugin {name!r}", search)


def plugin_list(value: Any, where: str) -> list[str]:
    """A config's ``plugins`` value as a list of names (``None``: none; one string is a list of one).

    Raises:
        ConfigError: not a string or a list of strings.
    """
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"{where}: expected a list of module names or .py files, got {value!r}")
    return [v.strip() for v in value]


def load_plugins(names: Iterable[str], search: Iterable[Path] = ()) -> list[str]:
    """Import every plugin in ``names`` in order (each once: a second import is Python's no-op).

    Returns:
        The names imported.

    Raises:
        ConfigError: see :func:`import_plugin`.
    """
    names = list(names)
    search = list(search)
    for n in names:
        import_plugin(n, search)
    return names


def load_entry_points(*, force: bool = False) -> list[str]:
    """Import the modules of every installed ``rlvr.plugins`` entry point, once per process
    (``force``: again, e.g. after installing a package in a test).

    Returns:
        ``"name = module"`` of each entry point loaded now (empty when already loaded).

    Raises:
        ConfigError: an entry point fails to load (named with its distribution's value and the error).
    """
    global _entry_points_loaded
    if _entry_points_loaded and not force:
        return []
    done = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as exc:  # noqa: BLE001
            raise ConfigError(f"plugin entry point {ep.name!r} ({ep.value}, group {ENTRY_POINT_GROUP}) failed to "
                              f"import: {type(exc).__name__}: {exc}") from exc
        done.append(f"{ep.name} = {ep.value}")
    _entry_points_loaded = True
    return done

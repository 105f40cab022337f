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

import importlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from typing import Any, Iterable

from rlvr.errors import ConfigError

ENTRY_POINT_GROUP = "rlvr.plugins"
"""The ``importlib.metadata`` entry-point group an installed package registers its plugin modules under."""

_entry_points_loaded = False


def _is_file(name: str) -> bool:
    return name.endswith(".py") or "/" in name or "\\" in name


def _add_to_path(folder: Path) -> None:
    f = str(folder)
    if f not in sys.path:
        sys.path.append(f)


def _import_file(name: str, search: list[Path]):
    p = Path(name)
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, *(d / p for d in search)]
    found = next((c.resolve() for c in candidates if c.is_file()), None)
    if found is None:
        looked = ", ".join(str(c) for c in candidates)
        raise ConfigError(f"plugin {name!r}: file not found (looked for {looked})")
    mod_name = found.stem
    old = sys.modules.get(mod_name)
    if old is not None:
        if Path(getattr(old, "__file__", "") or "").resolve() == found:
            return old
        raise ConfigError(f"plugin {name!r}: a module named {mod_name!r} is already imported "
                          f"(from {getattr(old, '__file__', None)}); rename the file")
    spec = importlib.util.spec_from_file_location(mod_name, found)
    if spec is None or spec.loader is None:
        raise ConfigError(f"plugin {name!r}: {found} cannot be imported as a Python module")
    _add_to_path(found.parent)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    return module


def import_plugin(name: str, search: Iterable[Path] = ()):
    """Import one plugin (a module name or a ``.py`` file, see the module docstring); returns the module.

    Args:
        name: ``pkg.module`` or ``path/to/file.py``.
        search: extra folders (the config files' folders) to look in after the working directory.

    Raises:
        ConfigError: the file does not exist, or importing raised (the message names the plugin and
            the error, e.g. ``plugin 'my_algo' failed to import: ModuleNotFoundError: No module named 'x'``).
    """
    search = [Path(d) for d in search]
    try:
        if _is_file(name):
            return _import_file(name, search)
        for d in [Path.cwd(), *search]:
            _add_to_path(d)
        return importlib.import_module(name)
    except ConfigError as exc:
        if str(exc).startswith(f"plugin {name!r}"):
            raise
        raise ConfigError(f"plugin {name!r} failed to import: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 (any import-time error is the plugin's, reported as such)
        raise ConfigError(f"plugin {name!r} failed to import: {type(exc).__name__}: {exc}") from exc


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

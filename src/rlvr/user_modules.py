"""Importing a user's module, by dotted name or by ``.py`` path, with errors that name it.

The one loader behind plugins (:func:`rlvr.plugins.import_plugin`) and every ``module:attribute`` key
(``task.reward_fn``, ``env.type``, ``env.tools``; :func:`rlvr.tasks.custom.load_attribute`):

* a name ending in ``.py`` or holding a path separator is a file, looked up from the working directory,
  then from each folder in ``search``; it is imported under the module name ``module_name(path)`` gives
  (an already imported module of that name from the same file is reused), and its folder joins
  ``sys.path`` so it can import its siblings;
* any other name is imported as Python would, with the working directory and the ``search`` folders
  also on ``sys.path`` (appended: an installed package of that name wins).

Interpretation: issue 24, item 6 (the plugin and reward-function loaders had grown two copies of this).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterable

from rlvr.errors import ConfigError
from rlvr.util.file_kinds import not_regular_file

__all__ = ["import_user_module", "is_file_name"]


def is_file_name(name: str) -> bool:
    """True when ``name`` names a file (ends in ``.py`` or holds a path separator), not a dotted module."""
    return name.endswith(".py") or "/" in name or "\\" in name or os.sep in name


def _add_to_path(folder: Path) -> None:
    f = str(folder)
    if f not in sys.path:
        sys.path.append(f)


def _import_file(name: str, label: str, search: list[Path], module_name: Callable[[Path], str]) -> ModuleType:
    p = Path(name)
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, *(d / p for d in search)]
    found = next((c.resolve() for c in candidates if c.is_file()), None)
    if found is None:
        why = not_regular_file(candidates[0])
        if why not in (None, "does not exist"):
            raise ConfigError(f"{label}: {candidates[0]} {why} (expected a Python file)")
        looked = ", ".join(str(c) for c in candidates)
        raise ConfigError(f"{label}: file not found (looked for {looked})")
    mod_name = module_name(found)
    old = sys.modules.get(mod_name)
    if old is not None:
        if Path(getattr(old, "__file__", "") or "").resolve() == found:
            return old
        raise ConfigError(f"{label}: a module named {mod_name!r} is already imported "
                          f"(from {getattr(old, '__file__', None)}); rename the file")
    spec = importlib.util.spec_from_file_location(mod_name, found)
    if spec is None or spec.loader is None:  # pragma: no cover - only for odd suffixes
        raise ConfigError(f"{label}: {found} cannot be imported as a Python module")
    _add_to_path(found.parent)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    return module


def import_user_module(name: str, label: str, search: Iterable[Path] = (), *,
                       module_name: Callable[[Path], str] = lambda path: path.stem) -> ModuleType:
    """Import the user's module ``name`` (a dotted name or a ``.py`` file; see the module docstring).

    Args:
        name: ``pkg.module`` or ``path/to/file.py``.
        label: how errors name what was asked for (``"plugin 'my_algo'"``, ``"task.reward_fn='f.py:fn'"``).
        search: extra folders (e.g. the config files' folders) to look in after the working directory.
        module_name: the module name a file is imported under (default: its stem).

    Returns:
        The module (importing it ran its top level: its registrations).

    Raises:
        ConfigError: the file does not exist (the places looked in are named), is not a regular file,
            clashes with an imported module of the same name, or importing raised: ``{label} failed to
            import: {error type}: {error}`` (a missing top-level module adds where it must be).

    Source: interpretation (torchtune's dotted-path components, pytest's ``-p`` plugins).
    """
    search = [Path(d) for d in search]
    try:
        if is_file_name(name):
            return _import_file(name, label, search, module_name)
        for d in [Path.cwd(), *search]:
            _add_to_path(d)
        return importlib.import_module(name)
    except ConfigError as exc:
        if str(exc).startswith(label):
            raise
        raise ConfigError(f"{label} failed to import: {exc}") from exc
    except ModuleNotFoundError as exc:
        where = ("; it must be importable (installed, on PYTHONPATH or in the working directory), or be given "
                 "as a .py file" if exc.name == name.split(".")[0] else "")
        raise ConfigError(f"{label} failed to import: ModuleNotFoundError: {exc}{where}") from exc
    except Exception as exc:  # noqa: BLE001 (any import-time error is the user module's, reported as such)
        raise ConfigError(f"{label} failed to import: {type(exc).__name__}: {exc}") from exc

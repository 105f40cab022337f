"""Each variant in one folder (issue 24 item 7): ``rlvr/variants/<name>/`` holds its config section and parts.

The layout has two rules that nothing else checks: every registering module of a folder is imported by
:mod:`rlvr.variants.builtin` (else its parts silently stay unregistered), and importing :mod:`rlvr.config`
loads only the folders' pure-pydantic ``config`` modules (a part loaded there would import torch and
close an import circle through ``rlvr.tasks`` → ``rlvr.config``).
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import rlvr.variants

ROOT = Path(__file__).resolve().parents[1]


def _folders() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(rlvr.variants.__path__) if m.ispkg)


def _modules(folder: str) -> list[str]:
    pkg = __import__(f"rlvr.variants.{folder}", fromlist=["_"])
    return sorted(f"rlvr.variants.{folder}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__))


def test_every_variant_folder_has_a_config_section_and_a_docstring_that_points_to_its_page():
    assert _folders(), "no variant folders found"
    for folder in _folders():
        pkg = __import__(f"rlvr.variants.{folder}", fromlist=["_"])
        assert f"rlvr.variants.{folder}.config" in _modules(folder), folder
        doc = pkg.__doc__ or ""
        pages = [p for p in (ROOT / "docs").glob("*.md") if f"docs/{p.name}" in doc]
        assert pages, f"rlvr.variants.{folder}: the docstring names no docs/<page>.md"


def test_builtin_imports_every_registering_module_and_config_imports_only_the_sections():
    code = ("import json, sys; import rlvr.config; first = sorted(m for m in sys.modules if m.startswith('rlvr.variants'));"
            " torch = 'torch' in sys.modules; import rlvr.variants.builtin;"
            " print(json.dumps([first, torch, sorted(m for m in sys.modules if m.startswith('rlvr.variants'))]))")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    after_config, torch_loaded, after_builtin = json.loads(out.strip().splitlines()[-1])
    folders = _folders()
    sections = {f"rlvr.variants.{f}.config" for f in folders}
    assert set(after_config) == {"rlvr.variants", *(f"rlvr.variants.{f}" for f in folders), *sections}
    assert not torch_loaded, "importing rlvr.config loaded torch (through a variant's config module?)"
    missing = sorted({m for f in folders for m in _modules(f)} - set(after_builtin))
    assert not missing, f"rlvr.variants.builtin does not import {missing}: their parts are never registered"

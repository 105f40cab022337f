"""Failures injected into the writers' file operations (imported by tests as ``from fault_injection import ...``)."""

from __future__ import annotations

import errno
from typing import Any


def fail_staging_rename(monkeypatch: Any, module: Any) -> None:
    """Make ``module.os.replace`` raise ``OSError(EIO)`` when it renames a staging folder (``.tmp-`` in the
    source); every other rename, e.g. moving the old copy aside or back, goes through."""
    real = module.os.replace

    def replace(src, dst):
        if ".tmp-" in str(src):
            raise OSError(errno.EIO, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(module.os, "replace", replace)

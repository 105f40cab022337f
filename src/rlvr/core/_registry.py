"""Core's view of :mod:`rlvr.registry` (kept for imports of ``rlvr.core._registry.UnknownNameError``)."""

from rlvr.registry import Registry, UnknownNameError

__all__ = ["Registry", "UnknownNameError"]

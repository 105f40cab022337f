"""Exceptions with messages meant for the user: each names the key, row or file at fault."""


class RlvrError(Exception):
    """Base class of rlvr's user-facing errors."""


class ConfigError(RlvrError):
    """A configuration value, key or combination is invalid. The CLI exits with code 2."""


class DataError(RlvrError):
    """A dataset file or row is missing, unreadable or lacks a field."""


class ModelLoadError(RlvrError):
    """A model or tokenizer could not be found or loaded."""


class IdleRunError(RlvrError):
    """A run stopped because ``max_idle_rounds`` generation rounds in a row gave no trainable update
    (a checkpoint was written first). The CLI exits with code 3."""

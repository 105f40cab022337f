"""Exceptions with messages meant for the user: each names the key, row or file at fault."""


class RlvrError(Exception):
    """Base class of rlvr's user-facing errors. ``exit_code`` is the CLI's exit status for it."""

    exit_code = 1


class ConfigError(RlvrError):
    """A configuration value, key or combination is invalid. The CLI exits with code 2."""

    exit_code = 2


class EnvVarError(ConfigError, ValueError):
    """An environment variable rlvr reads holds a value it cannot use (e.g. ``RLVR_CPU_BF16=yes``):
    bad configuration, found before any model loads. Exit code 2; a ``ValueError`` too, for callers
    that catch that."""


class DataError(RlvrError):
    """A dataset file or row is missing, unreadable or lacks a field."""


class ModelLoadError(RlvrError):
    """A model or tokenizer could not be found or loaded."""


class ModelPathError(ConfigError, ModelLoadError):
    """A model path names nothing a model could be loaded from (``model.name_or_path``, ``--checkpoint``,
    ``rlvr export``'s folder): it does not exist, or it is a file or folder of the wrong kind. Bad input,
    found before any model loads, so the CLI exits 2 as for other configuration errors (a model that is
    there but fails to load is a :class:`ModelLoadError`, exit 1); a ``ModelLoadError`` too, for callers
    that catch that."""


class OutputDirError(ConfigError):
    """The output directory cannot be used: a file, not writable, or holding another run. Exit code 2."""


class TrainingError(RlvrError):
    """Training cannot continue (e.g. too many consecutive non-finite updates)."""


class IdleRunError(RlvrError):
    """A run stopped because ``max_idle_rounds`` generation rounds in a row gave no trainable update
    (a checkpoint was written first). The CLI exits with code 3."""

    exit_code = 3


class RunStopped(RlvrError):
    """A part of the run (a sampler wrapper, a callback) ended it early on purpose, e.g. a comparison's
    rollout or token budget is spent (:class:`rlvr.compare.budget.BudgetExhausted`). A normal end, not
    a failure: the trainer's summary reads ``rlvr: run stopped (<message>)`` and the exception
    propagates to whoever set the limit. No checkpoint is written for it."""


class RewardFailureError(TrainingError):
    """Every reward call failed (raised, returned a non-number or timed out) in
    :data:`rlvr.trainer.lifecycle.REWARD_FAILURE_ROUNDS` generation rounds in a row, counted over the
    whole job: the run stopped with a checkpoint instead of training on zeros. The CLI exits with code 1."""

"""What every ``rlvr`` subcommand shares: the exit codes, loading and checking a config, argparse types."""

from __future__ import annotations

import argparse
from pathlib import Path

EXIT_CONFIG = 2
EXIT_RUNTIME = 1
REWARD_FAILURE_LIMIT = 0.5
"""``rlvr train`` exits 1 when more than this fraction of the run's reward calls failed (error or timeout)."""
EXIT_IDLE = 3  # max_idle_rounds generation rounds without an update (a checkpoint was written)


def _load_config(args: argparse.Namespace, *, training: bool = False):
    """The run's config from ``--config`` files and ``key=value`` overrides, with the parts and the task
    checked (no model loaded). A ``--resume key=value`` is taken as an override and ``--resume auto``.

    ``training=True`` (``rlvr train``) checks the parts with the config half of
    :func:`~rlvr.trainer.components.validate_run` (also the trackers); the caller runs the task's half
    once the task is built and then builds the trainer with ``validated=True``.

    Raises:
        ConfigError: an unknown key, a bad value, parts that cannot work together, a missing tracker
            package (``training``), a bad task config.
    """
    import rlvr.testbed  # noqa: F401 (registers the testbed's model source and task type)
    from rlvr.config import build_config
    from rlvr.tasks import validate_task_config
    from rlvr.trainer.components import validate_components, validate_run

    resume = getattr(args, "resume", None)
    if resume and "=" in resume and not Path(resume).exists():  # `--resume key=value`: an override, not a path
        args.overrides = [resume, *args.overrides]
        args.resume = "auto"
    from rlvr.precision import check_environment

    check_environment()  # a bad RLVR_CPU_BF16 is a configuration error now, not a traceback after the model loads
    cfg = build_config(args.config, args.overrides, plugins=getattr(args, "plugins", ()))
    if training:
        validate_run(cfg)  # the parts and the trackers; the task's check follows once it is built
    else:
        validate_components(cfg)
    validate_task_config(cfg.task)
    return cfg


def _load_cli_plugins(args: argparse.Namespace) -> None:
    """Import the ``--plugin`` modules of any subcommand (before its config is read).

    Raises:
        ConfigError: a module fails to import (named, with the import error).
    """
    from rlvr.plugins import load_plugins

    load_plugins(getattr(args, "plugins", None) or [])


def _int_at_least(lo: int):
    """An argparse ``type`` that accepts an integer >= ``lo`` and names what it expected otherwise."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {text!r}") from None
        if n < lo:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {n}")
        return n

    return parse


_nonnegative_int = _int_at_least(0)
_positive_int = _int_at_least(1)


def _nonnegative_float(text: str) -> float:
    """An argparse ``type``: a finite number of seconds >= 0 (named in the error otherwise)."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}") from None
    if not (0 <= x < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text}")
    return x


def _yaml(d: dict) -> str:
    import yaml

    return yaml.safe_dump(d, sort_keys=False)

"""Command line: ``rlvr train``, ``rlvr eval``, ``rlvr eval-merge``, ``rlvr export``, ``rlvr plot``, ``rlvr compare``,
``rlvr doctor``.

Exit codes: 0 done; 1 a run-time failure (a model that cannot be loaded, a file that cannot be
written, more than half of a run's reward calls failed, non-finite updates); 2 bad configuration or
data, found before any model is loaded where possible; 3 a run stopped because no generation round
gave a trainable group for ``max_idle_rounds`` rounds; 130 / 143 stopped by SIGINT / SIGTERM after
writing a checkpoint.

One module per subcommand group: :mod:`~rlvr.cli.parser` (flags), :mod:`~rlvr.cli.train`,
:mod:`~rlvr.cli.evaluate` (eval, eval-merge, plot), :mod:`~rlvr.cli.export`,
:mod:`~rlvr.cli.compare`, :mod:`~rlvr.cli.doctor` (which sandbox a run gets), :mod:`~rlvr.cli.common` (exit codes, config loading) and
:mod:`~rlvr.cli.app` (``main``: dispatch and the exit-code mapping). The names below are re-exported
so that ``rlvr.cli:main`` (the console script) and ``from rlvr.cli import ...`` keep working.
"""

from rlvr.cli.app import main
from rlvr.cli.common import (
    EXIT_CONFIG,
    EXIT_IDLE,
    EXIT_RUNTIME,
    REWARD_FAILURE_LIMIT,
    _load_config,
)
from rlvr.cli.compare import cmd_compare
from rlvr.cli.evaluate import cmd_eval, cmd_eval_merge, cmd_plot
from rlvr.cli.export import cmd_export
from rlvr.cli.parser import build_parser, parse_args
from rlvr.cli.train import _resume_target, _train, cmd_train

__all__ = [
    "EXIT_CONFIG", "EXIT_IDLE", "EXIT_RUNTIME", "REWARD_FAILURE_LIMIT", "build_parser", "cmd_compare", "cmd_eval",
    "cmd_eval_merge", "cmd_export", "cmd_plot", "cmd_train", "main", "parse_args", "_load_config", "_resume_target",
    "_train",
]

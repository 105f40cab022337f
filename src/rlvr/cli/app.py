"""The ``rlvr`` entry point: dispatch to a subcommand and turn its errors into exit codes."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Sequence

from rlvr.cli.common import EXIT_CONFIG, EXIT_IDLE, EXIT_RUNTIME, _load_cli_plugins
from rlvr.cli.compare import cmd_compare
from rlvr.cli.doctor import cmd_doctor
from rlvr.cli.evaluate import cmd_eval, cmd_eval_merge, cmd_plot
from rlvr.cli.export import cmd_export
from rlvr.cli.parser import parse_args
from rlvr.cli.train import cmd_train
from rlvr.errors import ConfigError, DataError, IdleRunError, ModelLoadError, RlvrError


class _Terminated(KeyboardInterrupt):
    """SIGTERM outside the training loop (which handles it itself, see rlvr.trainer.lifecycle)."""


def _on_sigterm(signum, frame):  # noqa: ARG001
    raise _Terminated()


_RLVR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _format_warning(message, category, filename, lineno, line=None):  # noqa: ANN001
    """rlvr's own warnings as one line, ``rlvr: warning: <message>``; others as Python formats them.

    Python's default shows the caller's path, line number and source line (e.g. ``combine.py:171:
    UserWarning: judge: judge call failed ...`` and then ``raw = self.learned[i].score(...)``), which reads
    like a crash to a user; rlvr's warnings are written to stand alone. Only the printed text changes: the
    filters (``once``) still decide what is shown, and recorded warnings (``catch_warnings(record=True)``,
    pytest) never reach this. Interpretation: presentation only."""
    if issubclass(category, UserWarning) and os.path.abspath(str(filename)).startswith(_RLVR_DIR):
        return f"rlvr: warning: {message}\n"
    return _python_format_warning(message, category, filename, lineno, line)


_python_format_warning = warnings.formatwarning


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code (see the module docstring)."""
    import signal
    import threading

    from rlvr.trainer.lifecycle import RunInterrupted

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.command != "plot" and "HF_HUB_OFFLINE" not in os.environ:
        os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    warnings.filterwarnings("once", category=UserWarning)
    old_format, warnings.formatwarning = warnings.formatwarning, _format_warning
    handlers = {"train": cmd_train, "eval": cmd_eval, "eval-merge": cmd_eval_merge, "export": cmd_export, "plot": cmd_plot, "compare": cmd_compare,
                "doctor": cmd_doctor}
    old_term = signal.signal(signal.SIGTERM, _on_sigterm) if threading.current_thread() is threading.main_thread() else None
    try:
        _load_cli_plugins(args)
        return handlers[args.command](args)
    except ConfigError as exc:
        print(f"rlvr: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (DataError, ModelLoadError) as exc:
        print(f"rlvr: {exc}", file=sys.stderr)
        return EXIT_CONFIG if isinstance(exc, DataError) else EXIT_RUNTIME
    except IdleRunError as exc:
        print(f"rlvr: stopped: {exc}", file=sys.stderr)
        return EXIT_IDLE
    except RlvrError as exc:
        print(f"rlvr: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", EXIT_RUNTIME)
    except OSError as exc:  # disk full, permissions, a file vanished: name the file, no traceback
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        print(f"rlvr: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_RUNTIME
    except RunInterrupted as exc:
        print(f"rlvr: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        term = isinstance(exc, _Terminated)
        print(f"rlvr: {'terminated (SIGTERM)' if term else 'interrupted'}", file=sys.stderr)
        return 143 if term else 130
    finally:
        warnings.formatwarning = old_format
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)

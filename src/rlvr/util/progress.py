"""Progress display for every phase longer than a few seconds, on a terminal and in a log file.

On a terminal (or in a notebook) this is an ordinary tqdm bar. On any other stream (a log file, a
job scheduler's captured stderr) tqdm would append one ``\\r``-separated status per refresh; here it
writes instead a whole line every ``LOG_INTERVAL_S`` seconds (and one at the end), e.g.
``train:  40%|####      | 8/20 [01:30<02:15, 11.3s/step, mean=0.375]``.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from tqdm import tqdm

LOG_INTERVAL_S = 30.0
"""Seconds between two progress lines on a non-terminal stream."""


class _Lines:
    """A file-like wrapper turning tqdm's ``\\r`` status rewrites into one full line per refresh."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, s: str) -> int:
        text = s.replace("\r", "").strip("\n")
        if text.strip():
            self.stream.write(text + "\n")
        return len(s)

    def flush(self) -> None:
        self.stream.flush()


def is_interactive(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal or a notebook's output (then bars redraw in place)."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) or "ipykernel" in sys.modules


def progress_bar(total: int | None = None, *, desc: str, unit: str, initial: int = 0, disable: bool = False,
                 delay: float = 0.0, leave: bool = True, stream: TextIO | None = None,
                 interval: float | None = None) -> Any:
    """A tqdm bar that behaves on terminals and in log files (see the module docstring).

    Args:
        total: expected count (None: a counter with a rate, no ETA).
        desc, unit: tqdm's label and unit name.
        initial: count already done (a resumed run).
        disable: show nothing.
        delay: seconds before anything is shown (short phases stay silent).
        leave: keep the finished bar on a terminal.
        stream: where to write (default ``sys.stderr``).
        interval: seconds between lines on a non-terminal stream (default :data:`LOG_INTERVAL_S`).

    Returns:
        a ``tqdm`` instance (``update``, ``set_postfix``, ``write``, ``close``).
    """
    stream = sys.stderr if stream is None else stream
    if is_interactive(stream):
        from tqdm.auto import tqdm as auto_tqdm

        return auto_tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=disable, delay=delay,
                         leave=leave, file=stream, dynamic_ncols=True)
    every = LOG_INTERVAL_S if interval is None else interval
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=disable, delay=delay, leave=True,
                file=_Lines(stream), mininterval=every, maxinterval=max(every, 10.0), miniters=1, ncols=100,
                ascii=True)

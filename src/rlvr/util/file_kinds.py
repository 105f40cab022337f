"""What kind of file a path names, for refusing inputs that are not regular files.

Interpretation (issue 25, item 4.10): a config or data path naming a FIFO blocks ``open`` forever
(nobody writes to it), and ``/dev/zero`` or ``/dev/urandom`` never end; rlvr reads configs, JSONL
task files and reward modules whole, so every such input must be a regular file (a symlink to one
is fine). Imports nothing from rlvr (layer 0).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

CONFIG_MAX_BYTES = 1 << 20
"""The largest ``--config`` file read (1 MiB; rlvr's own recipes are under 4 KiB)."""

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def not_regular_file(path: str | Path) -> str | None:
    """Why ``path`` is not a readable regular file, or None when it is one.

    Returns:
        ``"does not exist"``, ``"is a directory"``, ``"is a named pipe (FIFO)"``, ``"is a character
        device"``, ... (phrases to follow the path in a message); None for a regular file or a symlink
        to one. Never opens the path (opening a FIFO would block).
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    return "is " + next((what for test, what in _KINDS if test(mode)), "not a regular file")


def read_capped(path: str | Path, limit: int = CONFIG_MAX_BYTES) -> bytes | None:
    """The bytes of the regular file ``path``, or None when it holds more than ``limit`` bytes (read
    stops there, so a file that grows while it is read cannot exhaust memory)."""
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
    return None if len(data) > limit else data

"""A code-scoring harness the candidate program cannot reach (issue 37; threat model in ``docs/code_rewards.md``).

Three pieces, each a small stdlib-only file that runs inside the sandbox:

* :mod:`~rlvr.tasks.harness.judge` — the sandbox's main program: holds the tests, evaluates them with
  its own pristine builtins, reports HMAC-signed lines.
* :mod:`~rlvr.tasks.harness.candidate` — a second process the judge starts: loads the program and
  answers calls with plain values.
* :mod:`~rlvr.tasks.harness.wire` — how plain values cross between the two.

This module is the host's side: :func:`judge_program` (the sandbox program, wire inlined),
:func:`judge_stdin` (key and spec, read by the judge before any candidate code exists) and
:func:`read_reports` (the signed lines back, forged ones dropped).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import secrets
from pathlib import Path
from typing import Any

__all__ = ["candidate_program", "judge_program", "judge_stdin", "new_key", "read_reports"]

_HERE = Path(__file__).parent
_INLINE = "from rlvr.tasks.harness.wire import"


def _inlined(name: str) -> str:
    """``wire.py`` followed by ``name``.py with its import of wire removed: one stdlib-only program."""
    body = "\n".join(ln for ln in (_HERE / name).read_text().splitlines() if not ln.startswith(_INLINE))
    return (_HERE / "wire.py").read_text() + "\n\n" + body + "\n"


@functools.lru_cache(maxsize=None)
def judge_program() -> str:
    """The judge's source, run as the sandbox's ``main.py`` (``__name__ == "__main__"``)."""
    return _inlined("judge.py")


@functools.lru_cache(maxsize=None)
def candidate_program() -> str:
    """The candidate server's source, which the judge runs with ``python -I -c``."""
    return _inlined("candidate.py")


def new_key() -> bytes:
    """A fresh 32-byte HMAC key for one run."""
    return secrets.token_bytes(32)


def judge_stdin(key: bytes, tests: list[dict[str, Any]], entry_point: str | None, per_test_s: float,
                max_bytes: int, setup: str = "") -> bytes:
    """What the judge reads from stdin: the key in hex, a newline, then the spec as JSON.

    Args:
        key: from :func:`new_key`.
        tests: the problem's tests (``{"kind": "assert", "expr": ...}`` or ``{"kind": "check", "code": ...}``,
            each with ``hidden``).
        entry_point: the function the program must define (``None``: no check).
        per_test_s: wall-clock seconds per test (and for loading the program).
        max_bytes: the largest answer the judge reads from the candidate.
        setup: the problem's own code (HumanEval's prompt helpers such as ``poly``), run by the judge
            before the candidate starts; the names it binds resolve to the judge's copies in the tests.
    """
    spec = {"tests": [{k: t[k] for k in ("expr", "code", "hidden") if k in t} for t in tests],
            "entry_point": entry_point, "per_test_s": per_test_s, "max_bytes": max_bytes, "setup": setup,
            "candidate": candidate_program()}
    return key.hex().encode() + b"\n" + json.dumps(spec).encode()


def read_reports(stdout: str, key: bytes) -> list[dict[str, Any]]:
    """The judge's reports in ``stdout``, in order: lines whose MAC verifies and whose sequence number
    is the next one expected. Every other line (the candidate's, a forgery, a replay) is skipped.
    Never raises."""
    out: list[dict[str, Any]] = []
    for line in stdout.splitlines():
        mac, _, rest = line.partition(" ")
        seq, _, body = rest.partition(" ")
        if seq != str(len(out)):
            continue
        want = hmac.new(key, f"{seq}:{body}".encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(mac.encode(), want.encode()):
            continue
        try:
            report = json.loads(body)
        except ValueError:
            continue
        if isinstance(report, dict):
            out.append(report)
    return out

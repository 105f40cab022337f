"""A run's precision, recorded beside its weights and followed by ``--resume`` and ``rlvr eval``.

Every checkpoint folder a run writes (``checkpoint-N/``, ``final/``, one process or ``torchrun``) holds
``precision.json``: the mode the run resolved (``fp32``, ``bf16``, ``bf16-pure``, ``fp16-pure``), the
``model.dtype`` it came from, the device type and the reason. Under ``model.dtype=auto`` (the default),
``rlvr train --resume`` and ``rlvr eval --checkpoint`` of such a folder load the model at the recorded
mode (:func:`follow_recorded_precision`), so a run trained in bf16 is continued and evaluated in bf16 on
any machine, with a one-line note where ``auto`` would now pick otherwise; an explicit ``model.dtype``
still wins. Source: issue 30 (one run, one precision); the policy itself is :mod:`rlvr.precision`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rlvr.errors import DataError
from rlvr.precision.policy import PRECISION_MODES, PrecisionPolicy, canonical_precision, resolve_precision

__all__ = ["RECORD_FILE", "write_precision_record", "read_precision_record", "follow_recorded_precision",
           "config_at_recorded_precision"]

RECORD_FILE = "precision.json"
"""The record's file name inside a checkpoint folder."""


def write_precision_record(folder: str | Path, policy: PrecisionPolicy | None) -> None:
    """Write ``folder/precision.json`` for ``policy`` (nothing when ``policy`` is None: a model without one).

    Called by the checkpoint writers inside their staging folder, so it is as atomic as the checkpoint.

    Raises:
        OSError: the file cannot be written (the writer reports it as a checkpoint write error).
    """
    if policy is None:
        return
    rec = {k: v for k, v in policy.as_dict().items() if k != "probe"}
    (Path(folder) / RECORD_FILE).write_text(json.dumps(rec, indent=2) + "\n", encoding="utf-8")


def read_precision_record(folder: str | Path) -> dict[str, Any] | None:
    """``folder/precision.json``, or None where there is none (a checkpoint of an older rlvr, a model folder
    not written by a run, a ``.gguf`` file).

    Raises:
        DataError: the file exists but is not JSON or its ``mode`` is not a resolved precision (names the file).
    """
    path = Path(folder) / RECORD_FILE
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable precision record ({exc})") from None
    if not isinstance(rec, dict) or rec.get("mode") not in PRECISION_MODES or rec.get("mode") == "auto":
        raise DataError(f"{path}: expected a JSON object whose 'mode' is one of "
                        f"{', '.join(m for m in PRECISION_MODES if m != 'auto')}")
    return rec


def follow_recorded_precision(requested: str, folder: str | Path, *, context: str, log: bool = True) -> str:
    """The ``model.dtype`` to load ``folder``'s model with: the run's recorded mode under ``auto``.

    Args:
        requested: the config's ``model.dtype``.
        folder: a checkpoint or ``final/`` folder (or any path: no record means ``requested``).
        context: how the note names the command (``"--resume"``, ``"eval runs/x/final"``).
        log: print the note (False on the other ranks of a ``torchrun`` job).

    Returns:
        the recorded mode when ``requested`` is ``auto`` and ``folder`` has a record, else ``requested``.
        One line goes to stderr when that recorded mode differs from what ``auto`` picks on this machine
        now, or when an explicit ``requested`` differs from the recorded mode.

    Raises:
        DataError: a damaged record (:func:`read_precision_record`).
    """
    rec = read_precision_record(folder)
    if rec is None:
        return requested
    mode, where = rec["mode"], Path(folder) / RECORD_FILE
    if canonical_precision(requested) != "auto":
        if canonical_precision(requested) != mode and log:
            print(f"rlvr: {context}: model.dtype={requested} given, so not at the run's recorded precision "
                  f"{mode} ({where})", file=sys.stderr)
        return requested
    now = resolve_precision("auto", "cpu", log=False).mode
    if now != mode and log:
        print(f"rlvr: {context}: at precision {mode}, the run's recorded one ({where}); model.dtype=auto would "
              f"pick {now} on this machine now (set model.dtype to choose)", file=sys.stderr)
    return mode


def config_at_recorded_precision(cfg: Any, folder: str | Path, *, context: str, log: bool = True) -> Any:
    """``cfg`` (an :class:`rlvr.config.RLConfig`) with ``model.dtype`` from :func:`follow_recorded_precision`:
    what a resumed run (``rlvr train --resume``, a ``rlvr compare`` piece) is built with. The run's own
    config (``config.yaml``, the checkpoints' saved state) keeps the value it was given, so a later
    ``--resume`` compares equal; the returned copy is ``cfg`` itself when nothing changes.

    Raises:
        DataError: a damaged record.
    """
    dtype = follow_recorded_precision(cfg.model.dtype, folder, context=context, log=log)
    if dtype == cfg.model.dtype:
        return cfg
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"dtype": dtype})})

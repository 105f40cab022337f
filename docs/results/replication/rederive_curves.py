"""Re-derive a finished comparison's ``curve.jsonl`` files with the phase-aware ``curve_values``.

The v2 comparison (``runs/compare/v2_main``, ``v2_tokens``) was run before the harness learnt that
FBOS-RL's ECC step is not the run's update on the task prompt (``curve_values(..., primary_phase)``,
docs/results/replication.md §1.4). Each curve row was averaged over the phases it held, so FBOS-RL's
``actor/entropy`` and ``actor/grad_norm`` mixed EPA with ECC steps. The per-step ``metrics.jsonl`` of
every run keeps the phase-prefixed values, so the curve can be rebuilt exactly, without a rerun: this
script recomputes the curve keys of every row from the metrics row of the same step, keeps every other
key (rollouts, tokens, wall time, held-out eval points) and rewrites the file atomically. Arms whose
schedule has no ``primary_phase`` get the same values as before.

Usage: ``PYTHONPATH=src python docs/results/replication/rederive_curves.py runs/compare/v2_main ...``
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml

from rlvr.compare.curves import CURVE_KEYS, curve_values
from rlvr.config import RLConfig
from rlvr.schedules import SCHEDULES


def _primary_phase(run_dir: Path) -> str | None:
    """The run's schedule's ``primary_phase``, read exactly as the harness reads it (``run_one``)."""
    cfg = RLConfig.model_validate(yaml.safe_load((run_dir / "config.yaml").read_text()))
    return getattr(SCHEDULES[cfg.schedule](cfg), "primary_phase", None)


def rederive(run_dir: Path) -> int:
    """Rewrite ``run_dir/curve.jsonl``; returns the number of rows whose curve keys changed."""
    metrics = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            metrics[row.get("step")] = row
    phase = _primary_phase(run_dir)
    out, changed = [], 0
    for line in (run_dir / "curve.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        m = metrics.get(row["step"])
        if m is not None and any(k in row for k in CURVE_KEYS):  # a row without them is an eval-only point
            new = {k: v for k, v in row.items() if k not in CURVE_KEYS}  # the old rows hold only bare curve keys
            new.update(curve_values(m, phase))
            changed += new != row
            row = new
        out.append(json.dumps(row))
    tmp = run_dir / ".curve.jsonl.tmp"
    tmp.write_text("\n".join(out) + "\n")
    os.replace(tmp, run_dir / "curve.jsonl")
    return changed


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    for root in map(Path, argv):
        for curve in sorted(root.glob("*/seed*/curve.jsonl")):
            n = rederive(curve.parent)
            print(f"{curve.parent}: {n} rows changed (primary phase {_primary_phase(curve.parent)})")


if __name__ == "__main__":
    main(sys.argv[1:])

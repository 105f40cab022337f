"""Build (pre-train and cache) a testbed policy, optionally in time-limited chunks.

    python -m rlvr.testbed.build testbed:v2l --max-seconds 480   # exit 0: built; exit 3: paused, run again

A paused build keeps its checkpoint in ``<cache folder>.partial`` and the next call (or the first
``load_policy`` of that name) resumes it; the finished weights are bit-identical to an uninterrupted
build (:func:`rlvr.testbed.model.pretrain`). Source: interpretation — this project's shared machine
allows heavy jobs of ≤ 9 minutes at a time, and a stronger testbed policy takes longer than that.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

PAUSED_EXIT = 3
"""Exit status of a build that stopped at ``--max-seconds`` (progress saved; run the same command again)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, build, print the cache folder and its ``testbed.json``; return the exit status
    (0 built or already cached, :data:`PAUSED_EXIT` paused, 2 bad name)."""
    ap = argparse.ArgumentParser(prog="python -m rlvr.testbed.build", description=__doc__.splitlines()[0])
    ap.add_argument("name", help="testbed model name, e.g. testbed:v2l or testbed:v2l:1")
    ap.add_argument("--max-seconds", type=float, default=None, help="pause (and save) after this many seconds")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1, as in `rlvr compare --jobs N` workers; float sums, and so the "
                         "weights, can differ between thread counts)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(max(1, args.threads))
    from rlvr.testbed.model import PretrainPaused, ensure_testbed_model, parse_spec

    try:
        parse_spec(args.name)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        path = ensure_testbed_model(args.name, args.cache_dir, log_every=args.log_every, max_seconds=args.max_seconds)
    except PretrainPaused as e:
        print(f"paused: {e} (run the same command again to resume)")
        return PAUSED_EXIT
    info = json.loads((path / "testbed.json").read_text())
    print(f"built: {path}\nfinal loss {info['final_loss']:.4f} nats/token, {info['seconds']} s, "
          f"{info['num_parameters']} parameters; loss per tenth of the steps {info.get('loss_curve')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Wall time to score a batch whose reward calls all hang, by worker count (issue 12 item 9).

Each share of the batch has one deadline (``reward_timeout_s``), so the batch should take about one
timeout however many calls hang (before the fix: one timeout per hung call, in sequence). The
workers are started and warmed up first, so start-up is not timed.

    PYTHONPATH=src:tests python benchmarks/bench_reward_timeout.py   # → benchmarks/results/reward_timeout.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from test_rewards import ScriptedTask, make_batch  # tests/test_rewards.py: picklable scripted verifier

    from rlvr.models import build_tiny_tokenizer
    from rlvr.rewards import Scorer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/reward_timeout.json")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    tok = build_tiny_tokenizer()
    rows = []
    for workers, hung, timeout in ((1, 32, 3.0), (1, 12, 1.0), (2, 12, 1.0), (4, 32, 1.0)):
        sc = Scorer(ScriptedTask(hang_s=600), tok, timeout_s=timeout, num_workers=workers)
        try:
            sc.score(make_batch(tok, ["ok-0"] * workers))  # every worker started and ready
            batch = make_batch(tok, [f"hang-{i}" for i in range(hung)])
            t0 = time.perf_counter()
            st = sc.score(batch)
            wall = time.perf_counter() - t0
        finally:
            sc.close()
        rows.append({"workers": workers, "hung_calls": hung, "reward_timeout_s": timeout, "wall_s": round(wall, 3),
                     "timeouts": st.timeouts, "one_at_a_time_s": hung / workers * timeout})
    print(f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores (sleeping verifiers: no compute)")
    print("| workers | hung calls | reward_timeout_s | wall s | timeouts | one deadline per call, in sequence |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workers']} | {r['hung_calls']} | {r['reward_timeout_s']:g} | {r['wall_s']:.2f} | {r['timeouts']} | "
              f"≥ {r['one_at_a_time_s']:g} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu_count": os.cpu_count(), "rows": rows}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Wall time to score a batch whose reward calls hang, by worker count (issue 12 item 9, issue 25 item 3).

Each call has its own deadline (``reward_timeout_s`` from when a worker takes it) and the batch is cut
off at ``BATCH_DEADLINE_FACTOR`` (2) x ``reward_timeout_s``, so a batch takes at most about twice the
timeout however many calls hang (before issue 12: one timeout per hung call, in sequence), and a hung
call costs only itself: the last rows mix hung calls among ones that answer, which must all be scored
(before issue 25, with one worker, every call queued after a hung one timed out too). The workers are started and
warmed up first, so start-up is not timed.

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

    from rlvr.models.tiny import build_tiny_tokenizer
    from rlvr.rewards import Scorer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/reward_timeout.json")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    tok = build_tiny_tokenizer()
    rows = []
    cases = [(1, 32, 0, 3.0), (1, 12, 0, 1.0), (2, 12, 0, 1.0), (4, 32, 0, 1.0), (1, 2, 6, 3.0), (1, 4, 28, 3.0)]
    for workers, hung, ok, timeout in cases:
        sc = Scorer(ScriptedTask(hang_s=600), tok, timeout_s=timeout, num_workers=workers)
        try:
            sc.score(make_batch(tok, ["ok-0"] * workers))  # every worker started and ready
            uids = [f"hang-{i}" for i in range(hung)] + [f"ok-{i}" for i in range(ok)]
            uids = [uids[(i * 7) % len(uids)] for i in range(len(uids))] if ok else uids  # hung calls spread out
            batch = make_batch(tok, uids)
            t0 = time.perf_counter()
            st = sc.score(batch)
            wall = time.perf_counter() - t0
        finally:
            sc.close()
        rows.append({"workers": workers, "hung_calls": hung, "answering_calls": ok, "reward_timeout_s": timeout,
                     "wall_s": round(wall, 3), "timeouts": st.timeouts, "scored": int((batch.rewards > 0).sum()),
                     "one_at_a_time_s": hung / workers * timeout})
    print(f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores (sleeping verifiers: no compute)")
    print("| workers | hung calls | answering calls | reward_timeout_s | wall s | timeouts | scored | in sequence |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workers']} | {r['hung_calls']} | {r['answering_calls']} | {r['reward_timeout_s']:g} | {r['wall_s']:.2f} | "
              f"{r['timeouts']} | {r['scored']} | ≥ {r['one_at_a_time_s']:g} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu_count": os.cpu_count(), "rows": rows}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

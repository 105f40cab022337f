"""Scoring cost of the code task: milliseconds per completion, this checkout's harness against another's.

Usage: ``python benchmarks/bench_code_scoring.py [--other SRC_DIR] [--backend bwrap] [--n 20]``. Each
completion is an honest solution of a built-in function problem (5 tests), scored with ``CodeTask.verify``;
with ``--other`` (a ``src`` folder of another checkout, e.g. ``git worktree add /tmp/base e85a973``) the
same completions are scored by that code in a subprocess, interleaved, so both see the same load. Prints
the machine line, a table and writes ``benchmarks/results/code_scoring.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

TIMER = r'''
import json, sys, time
from rlvr.tasks.code import CodeConfig, CodeTask, problem_from_row
from rlvr.tasks.code_data import builtin_rows, FUNCTIONS
rows = [r for r in builtin_rows() if r.get("entry_point")][:int(sys.argv[1])]
probs = [problem_from_row(r, r["id"], r["id"]) for r in rows]
ref = {name: "def %s(%s):\n    %s" % (name, params, body) for name, params, _, body, _ in FUNCTIONS}
task = CodeTask("bench", probs, probs, CodeConfig(backend=sys.argv[2], allow_local_hidden_tests=True)
                if "allow_local_hidden_tests" in CodeConfig.model_fields else CodeConfig(backend=sys.argv[2]))
out = []
for p in probs:
    t0 = time.perf_counter()
    v = task.verify(p, "```python\n%s\n```" % ref[p.metadata["entry_point"]])
    out.append((time.perf_counter() - t0) * 1e3)
    assert v.score == 1.0, (p.uid, v.feedback)
print(json.dumps(out))
'''


def run(src: str, n: int, backend: str) -> list[float]:
    env = dict(os.environ, PYTHONPATH=src)
    res = subprocess.run([sys.executable, "-c", TIMER, str(n), backend], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--other", help="src folder of the checkout to compare against")
    ap.add_argument("--backend", default="bwrap")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    from machine import print_machine, write_result  # noqa: E402 - the benchmarks' shared helper

    machine = print_machine()
    here = os.path.join(os.path.dirname(HERE), "src")
    arms = {"this": here, **({"other": args.other} if args.other else {})}
    times: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(args.rounds):
        for name, src in arms.items():
            times[name] += run(src, args.n, args.backend)
    table = {k: {"median_ms": statistics.median(v), "mean_ms": statistics.mean(v), "n": len(v)} for k, v in times.items()}
    print(f"| harness ({args.backend}) | median ms per completion (5 tests) | mean | n |\n|---|---|---|---|")
    for k, v in table.items():
        print(f"| {k} | {v['median_ms']:.1f} | {v['mean_ms']:.1f} | {v['n']} |")
    write_result(os.path.join(HERE, "results", "code_scoring.json"), {"machine": machine, "backend": args.backend, "arms": arms, "table": table,
                                       "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})


if __name__ == "__main__":
    main()

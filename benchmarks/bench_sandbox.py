"""Sandbox throughput (issue 27 item 5): per-run overhead of each backend, and the time to score 64
completions × 5 tests of the code task through the reward workers.

Overhead: the median wall time of ``rlvr.sandbox.run("pass")`` per backend (``http`` against a
stand-in service on the loopback that answers at once: the client's and the loopback's share only),
next to a bare ``subprocess.run([python, "-I", "-c", "pass"])``. Scoring: 64 completions of the
built-in set (half correct, half wrong at a hidden test, so all five tests run for every completion),
assert-style (one sandbox run per completion, the harness runs the five tests) and stdin/stdout
(one run per test), through :class:`rlvr.rewards.pool.VerifierPool` with 1 and 2 workers (started and warmed
up first, so their start-up is not timed).

    flock /tmp/rlvr-heavy.lock env PYTHONPATH=src python benchmarks/bench_sandbox.py  # → benchmarks/results/sandbox.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import threading
import time
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from machine import print_machine

IO_SOLUTIONS = {
    "io_sum": "a, b = map(int, input().split())\nprint(a + b)",
    "io_square": "print(int(input()) ** 2)",
    "io_reverse": "print(input()[::-1])",
    "io_upper": "print(input().upper())",
}


class _Answer(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        data = json.dumps({"status": "Success", "run_result": {"status": "Finished", "return_code": 0, "stdout": "",
                                                               "stderr": ""}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def _service() -> tuple[ThreadingHTTPServer, str]:
    import socketserver

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def server_bind(self):
            socketserver.TCPServer.server_bind(self)
            self.server_name, self.server_port = "127.0.0.1", self.server_address[1]

    srv = Server(("127.0.0.1", 0), _Answer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def overheads(n: int) -> list[dict]:
    """Median ms per run of each backend (and of a bare interpreter start)."""
    from rlvr.sandbox import run
    from rlvr.sandbox.base import python_for_sandbox
    from rlvr.sandbox.bwrap import probe

    srv, url = _service()
    rows = []
    exe = python_for_sandbox(None, drop_root=__import__("os").geteuid() == 0)
    cases = [("bare subprocess", lambda: subprocess.run([exe, "-I", "-c", "pass"], check=True)),
             ("local", lambda: run("pass", backend="local")),
             ("http (stand-in)", lambda: run("pass", backend="http", url=url))]
    if not probe():
        cases.insert(1, ("bwrap", lambda: run("pass", backend="bwrap")))
    for name, fn in cases:
        fn()  # warm the page cache
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        rows.append({"backend": name, "runs": n, "median_ms": round(statistics.median(times), 1),
                     "p90_ms": round(sorted(times)[int(0.9 * n) - 1], 1)})
    srv.shutdown()
    return rows


def _batch(kind: str) -> tuple[list, list]:
    """64 (problem, completion) pairs: half correct, half failing the last (hidden) test."""
    from rlvr.tasks.code import problem_from_row
    from rlvr.tasks.code_data import FUNCTIONS, builtin_rows

    rows = {r["id"]: r for r in builtin_rows()}
    items = []
    if kind == "assert":
        for k in range(64):
            name, params, _, body, inputs = FUNCTIONS[k % 16]
            last = inputs[-1]
            wrong = f"    if ({', '.join(map(repr, last))},) == ({params},):\n        return None\n" if k % 2 else ""
            code = f"def {name}({params}):\n{wrong}    {body}\n"
            items.append((problem_from_row(rows[name], name, name), f"```python\n{code}```"))
    else:
        names = list(IO_SOLUTIONS)
        for k in range(64):
            name = names[k % 4]
            last = rows[name]["tests"][-1]["stdin"]
            code = IO_SOLUTIONS[name]
            if k % 2:
                code = f"import sys\ndata = sys.stdin.read()\nif data == {last!r}:\n    print('wrong')\n    sys.exit()\n" + \
                    code.replace("input()", "data.strip()").replace("int(data.strip())", "int(data)")
            items.append((problem_from_row(rows[name], name, name), f"```python\n{code}\n```"))
    return [p for p, _ in items], [c for _, c in items]


def scoring(backend: str, kind: str, workers: int) -> dict:
    """Wall seconds to score the 64 completions of ``kind`` with ``workers`` reward workers."""
    from rlvr.rewards.pool import VerifierPool
    from rlvr.tasks.code import CodeConfig, CodeTask

    problems, completions = _batch(kind)
    task = CodeTask("bench", problems, problems, CodeConfig(backend=backend, timeout_s=2.0))
    pool = VerifierPool(task, num_workers=workers, timeout_s=600)
    try:
        pool.run([(i, problems[i], completions[i]) for i in range(workers)])  # every worker started and ready
        t0 = time.perf_counter()
        out = pool.run([(i, p, c) for i, (p, c) in enumerate(zip(problems, completions))])
        wall = time.perf_counter() - t0
    finally:
        pool.close()
    scores = [out[i][0] for i in range(len(problems))]
    errors = sum(out[i][3] is not None for i in range(len(problems)))
    runs = 64 if kind == "assert" else 64 * 5
    return {"backend": backend, "tests": kind, "workers": workers, "completions": 64, "sandbox_runs": runs,
            "wall_s": round(wall, 2), "ms_per_run": round(wall / runs * 1e3, 1), "solved": int(sum(scores)),
            "errors": errors}


def main(argv: list[str] | None = None) -> int:
    from rlvr.sandbox.bwrap import probe

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20, help="runs per backend for the overhead")
    ap.add_argument("--out", default="benchmarks/results/sandbox.json")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    machine = print_machine()
    over = overheads(args.runs)
    print("\n| backend | runs | median ms per run | p90 ms |\n|---|---|---|---|")
    for r in over:
        print(f"| {r['backend']} | {r['runs']} | {r['median_ms']:.1f} | {r['p90_ms']:.1f} |")
    backends = ["local"] + ([] if probe() else ["bwrap"])
    configs = [(b, "assert", w) for b in backends for w in (1, 2)] + [(b, "io", 2) for b in backends]
    rows = [scoring(*c) for c in configs]
    print("\n| backend | tests | workers | sandbox runs | wall s (64 completions × 5 tests) | ms per run | solved | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['tests']} | {r['workers']} | {r['sandbox_runs']} | {r['wall_s']:.2f} | "
              f"{r['ms_per_run']:.1f} | {r['solved']}/64 | {r['errors']} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine, "overhead": over, "scoring": rows}, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Cost per step of an LLM judge reward (issue 40): judge calls per step and seconds per step spent judging.

A step of the ``judged_mixture`` recipe draws 4 prompts × 4 completions; its ``judged`` source has weight
0.3, so on average 1.2 of the 4 prompts, i.e. 4.8 completions (0 to 16), go to the judge, one call per
distinct completion (repeats and earlier judgements are cache hits). This script times
:meth:`rlvr.rewards.judge.JudgeReward.score` on 4, 8 and 16 distinct judged completions (1, 2, 4 prompts'
groups) with

* the in-process HF judge (``client: hf``): the random ``tiny`` test model and SmolLM2-135M-Instruct
  (the ``default`` policy, as a judge), greedy, ``max_new_tokens`` 128 as in the recipe, ``batch_size`` 8;
* a fake OpenAI-compatible server (``tests/fake_judge_server.py``) that answers each call after a set
  latency (0.1 s, 0.5 s), with ``max_concurrency`` 1 and 8,

each size with an empty cache, then a second pass over the same completions ("again": cache
hits, no calls, except for the judgements that failed or did not parse, which are not cached and are
asked again). Prints the CPU first, then a table; writes JSON. Run it under the heavy lock (it loads a model and keeps the CPU busy):

    flock /tmp/rlvr-heavy.lock env HF_HUB_OFFLINE=1 PYTHONPATH=src:tests python benchmarks/bench_judge.py
    # → benchmarks/results/bench_judge.json

``serve`` starts the fake server alone (for a training run against it, e.g. the recipe's
``http://127.0.0.1:8000/v1``):

    PYTHONPATH=src:tests python benchmarks/bench_judge.py serve --port 8000 --latency-s 0.2
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

from machine import print_machine, write_result


def _problems(n: int) -> tuple[list[Any], list[str]]:
    """``n`` judged rows: groups of 4 completions of one ``basic_arithmetic``-like prompt each, distinct."""
    from rlvr.tasks.base import Problem

    probs, texts = [], []
    for i in range(n):
        g = i // 4
        probs.append(Problem(f"q{g}", f"Calculate {g + 12} + {3 * g + 7}. Put the answer in \\boxed{{}}.",
                             str(4 * g + 19)))
        texts.append(f"We add the two numbers step by step: {g + 12} + {3 * g + 7}. The result is "
                     f"\\boxed{{{4 * g + 19 + (i % 4) - 1}}}. Attempt {i}.")
    return probs, texts


def _time(judge: Any, n: int) -> dict[str, Any]:
    probs, texts = _problems(n)
    judge.cache = type(judge.cache)(judge.cache.size)  # the first pass starts cold: every row is a call
    t0 = time.perf_counter()
    judge.score(probs, texts)
    first = time.perf_counter() - t0
    m1 = judge.pop_metrics()
    t0 = time.perf_counter()
    judge.score(probs, texts)
    cached = time.perf_counter() - t0
    m2 = judge.pop_metrics()
    return {"judged_rows": n, "calls": int(m1["judge/calls"]), "seconds": round(first, 3),
            "seconds_per_call": round(first / max(1, m1["judge/calls"]), 4),
            "failures": int(m1["judge/failures"]), "parse_failures": int(m1["judge/parse_failures"]),
            "cached_calls": int(m2["judge/calls"]), "cached_seconds": round(cached, 4)}


def _hf_judge(path: str) -> Any:
    from rlvr.config import build_config
    from rlvr.rewards.judge import JudgeReward

    cfg = build_config(overrides=[f"rewards=[{{type: judge, client: hf, name_or_path: '{path}', device: cpu, "
                                  "max_new_tokens: 128, batch_size: 8, batch_timeout_s: 600}]"])
    return JudgeReward.from_config(cfg.rewards[0], trainer_device="cpu")


def serve(port: int, latency_s: float) -> int:
    """Run the fake judge server on 127.0.0.1:``port`` until interrupted."""
    from fake_judge_server import FakeJudge

    fake = FakeJudge(delay_s=latency_s, port=port)
    print(f"fake judge at {fake.url} (latency {latency_s} s per call); Ctrl-C stops it", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        fake.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    sv = sub.add_parser("serve", help="run the fake judge server alone")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--latency-s", type=float, default=0.2)
    ap.add_argument("--out", default="benchmarks/results/bench_judge.json")
    ap.add_argument("--sizes", default="4,8,16", help="judged completions per step to time")
    ap.add_argument("--no-smollm", action="store_true", help="skip SmolLM2-135M as the in-process judge")
    args = ap.parse_args(argv)
    if args.cmd == "serve":
        return serve(args.port, args.latency_s)
    warnings.simplefilter("ignore")
    machine = print_machine()
    sizes = [int(x) for x in args.sizes.split(",")]
    from fake_judge_server import FakeJudge

    from rlvr.rewards.judge import JudgeReward
    from rlvr.rewards.judge_clients import OpenAIJudgeClient

    rows: list[dict[str, Any]] = []
    judges: list[tuple[str, Any]] = [("hf tiny (random)", lambda: _hf_judge("tiny"))]
    if not args.no_smollm:
        from rlvr.models.loading import ensure_default_model

        judges.append(("hf SmolLM2-135M-Instruct", lambda: _hf_judge(str(ensure_default_model(None)))))
    for label, make in judges:
        t0 = time.perf_counter()
        judge = make()
        load = time.perf_counter() - t0
        judge.score(*_problems(1))  # warm-up (first generate), not timed
        judge.pop_metrics()
        for n in sizes:
            rows.append({"judge": label, "latency_s": None, "max_concurrency": None, "load_s": round(load, 2),
                         **_time(judge, n)})
            print(rows[-1], flush=True)
    for latency in (0.1, 0.5):
        for conc in (1, 8):
            with FakeJudge(delay_s=latency) as fake:
                judge = JudgeReward(OpenAIJudgeClient(fake.url, "fake", timeout_s=30, max_retries=2,
                                                      max_concurrency=conc), batch_timeout_s=300)
                for n in sizes:
                    rows.append({"judge": "fake server", "latency_s": latency, "max_concurrency": conc,
                                 "load_s": 0.0, **_time(judge, n)})
                    print(rows[-1], flush=True)
                judge.close()
    print()
    print("| judge | latency per call | max_concurrency | judged rows | calls | s judging | s per call | "
          "parse failures | again: calls, s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        lat = "-" if r["latency_s"] is None else f"{r['latency_s']} s"
        conc = "-" if r["max_concurrency"] is None else r["max_concurrency"]
        print(f"| {r['judge']} | {lat} | {conc} | {r['judged_rows']} | {r['calls']} | {r['seconds']:.2f} | "
              f"{r['seconds_per_call']:.3f} | {r['parse_failures']} | {r['cached_calls']}, {r['cached_seconds']:.4f} |")
    write_result(args.out, {"machine": machine, "rows": rows,
                            "command": "flock /tmp/rlvr-heavy.lock env HF_HUB_OFFLINE=1 PYTHONPATH=src:tests "
                                       "python benchmarks/bench_judge.py"})
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

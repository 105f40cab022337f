"""Generation tok/s of the HF engine with and without continuous batching (``HFEngine(continuous=True)``).

Greedy decoding of ``--prompts`` requests × ``--n`` samples with ragged lengths: each request gets its own
cap drawn from a long-tailed distribution (three quarters 8–64 new tokens, a quarter ``--max-new / 2`` to
``--max-new``), the shape of an evaluation round's long tail; the tiny random model rarely samples EOS, so
the caps set the lengths. With ``--data PATH`` (a jsonl file with a ``--question-field`` per row, e.g. a
GSM8K test split) the first ``--prompts`` questions are the user turns instead, every request capped at
``--max-new``, and the model's own EOS ends them: an evaluation round. Both arms produce the same tokens
(checked and reported). The arms alternate, ``--repeats`` times each, after one warm-up; the best of each is
reported with the load average.

    PYTHONPATH=$PWD/src .venv/bin/python benchmarks/bench_continuous.py                 # tiny model, seconds
    flock /tmp/rlvr-heavy.lock env PYTHONPATH=$PWD/src .venv/bin/python benchmarks/bench_continuous.py --model default
    flock /tmp/rlvr-heavy.lock env PYTHONPATH=$PWD/src .venv/bin/python benchmarks/bench_continuous.py --model default \
        --data PATH/gsm8k_test.jsonl --n 1 --max-batch-size 16 --repeats 1      # 64 questions, greedy, <= 512

Writes ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def _questions(path: str, field: str, limit: int) -> list[str]:
    """The ``field`` of the first ``limit`` rows of the jsonl file ``path``.

    Raises:
        ValueError: a row without ``field``, or no rows.
    """
    out: list[str] = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if field not in row:
                raise ValueError(f"{path}:{n}: no {field!r} field (have {sorted(row)})")
            out.append(str(row[field]))
            if len(out) == limit:
                break
    if not out:
        raise ValueError(f"{path}: no rows")
    return out


def _agreement(a: list[list[list[int]]], b: list[list[list[int]]]) -> dict:
    """Rows (samples) whose token ids are identical in ``a`` and ``b``, and for the others the index of the
    first token that differs (median, min; None when all agree)."""
    firsts = []
    rows = 0
    for ga, gb in zip(a, b):
        for ta, tb in zip(ga, gb):
            rows += 1
            if ta != tb:
                firsts.append(next((k for k, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb))))
    firsts.sort()
    return {"rows": rows, "rows_identical": rows - len(firsts),
            "first_diff_median": firsts[len(firsts) // 2] if firsts else None,
            "first_diff_min": firsts[0] if firsts else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-new", type=int, default=512)
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dtype", default="auto", help="model.dtype of the loaded model (auto, fp32, bf16, ...)")
    p.add_argument("--data", default=None, help="jsonl of questions (e.g. a GSM8K test split); default: synthetic")
    p.add_argument("--question-field", default="question")
    p.add_argument("--out", default="benchmarks/results/bench_continuous.json")
    args = p.parse_args(argv)
    from machine import print_machine  # benchmarks/machine.py

    machine = print_machine()
    from rlvr.config import ModelConfig
    from rlvr.engines.hf import HFEngine
    from rlvr.models import load_policy
    from rlvr.models.tiny import build_tiny_model
    from rlvr.types import GenerationRequest, SamplingParams

    if args.model == "tiny":
        model, tok = build_tiny_model(0)
    else:
        model, tok = load_policy(ModelConfig(name_or_path=args.model, dtype=args.dtype))
    rng = random.Random(0)
    questions = _questions(args.data, args.question_field, args.prompts) if args.data else None
    reqs = []
    for i in range(args.prompts if questions is None else len(questions)):
        text = f"What is {rng.randint(1, 999)} + {i}?" if questions is None else questions[i]
        ctx = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        ctx = list(ctx["input_ids"]) if isinstance(ctx, dict) or hasattr(ctx, "keys") else list(ctx)
        if questions is None:  # synthetic: a long-tailed cap per request
            cap = rng.randint(8, 64) if rng.random() < 0.75 else rng.randint(args.max_new // 2, args.max_new)
        else:  # an eval round: the model's EOS ends a request, the common cap bounds it
            cap = args.max_new
        reqs.append(GenerationRequest(ctx, n=args.n, max_new_tokens=cap))
    params = SamplingParams(temperature=0.0, max_new_tokens=args.max_new)
    engines = {name: HFEngine(model, tok, max_batch_size=args.max_batch_size, continuous=name == "continuous")
               for name in ("chunked", "continuous")}
    for eng in engines.values():
        eng.generate([GenerationRequest(r.context_ids, n=1) for r in reqs[:4]], SamplingParams(temperature=0.0, max_new_tokens=8))
    best: dict[str, dict] = {}
    outs = {}
    for r in range(args.repeats):
        for name, eng in engines.items():
            t = time.perf_counter()
            out = eng.generate(reqs, params)
            wall = time.perf_counter() - t
            tokens = sum(len(g.token_ids) for gs in out for g in gs)
            row = {"wall_s": wall, "tokens": tokens, "tok_per_s": tokens / wall, "load1": os.getloadavg()[0]}
            print(f"{name} repeat {r}: {tokens} tokens in {wall:.2f} s = {row['tok_per_s']:.1f} tok/s "
                  f"(load {row['load1']:.2f})", flush=True)
            outs[name] = [[g.token_ids for g in gs] for gs in out]
            if name not in best or row["tok_per_s"] > best[name]["tok_per_s"]:
                best[name] = row
    same = outs["chunked"] == outs["continuous"]
    agree = _agreement(outs["chunked"], outs["continuous"])
    print(f"rows identical: {agree['rows_identical']} of {agree['rows']}; where they differ, first difference at "
          f"token {agree['first_diff_median']} (median; min {agree['first_diff_min']})", flush=True)
    lengths = [len(t) for ts in outs["chunked"] for t in ts]
    shape = {"rows": len(lengths), "mean_len": sum(lengths) / len(lengths), "max_len": max(lengths),
             "at_cap": sum(n >= r.max_new_tokens for n, r in zip(lengths, (r for r in reqs for _ in range(r.n))))}
    print(f"lengths: mean {shape['mean_len']:.1f}, max {shape['max_len']}, {shape['at_cap']} of {shape['rows']} rows "
          "at their cap", flush=True)
    ratio = best["continuous"]["tok_per_s"] / best["chunked"]["tok_per_s"]
    data = f"questions of {Path(args.data).name}" if args.data else "synthetic prompts"
    print(f"{time.strftime('%H:%M:%S', time.gmtime())} UTC; {args.model}, {len(reqs)} {data} x {args.n}, greedy, "
          f"model.dtype={args.dtype}, caps <= {args.max_new}, {args.max_batch_size} slots, {torch.get_num_threads()} threads: chunked "
          f"{best['chunked']['tok_per_s']:.1f} tok/s, continuous {best['continuous']['tok_per_s']:.1f} tok/s "
          f"({ratio:.2f}x); same tokens: {same}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"settings": {**vars(args), "data": Path(args.data).name if args.data else None}, "machine": machine, "shape": shape, "agreement": agree,
                                         "threads": torch.get_num_threads(), "best": best, "ratio": ratio, "same_tokens": same},
                                         indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Generation tok/s of rlvr's transformers engine under each precision, same prompts and settings.

For every ``--dtypes`` entry (``fp32``, ``bf16``: the policies' generation dtypes — fp32 weights, or the
bf16 copy that ``model.dtype=bf16``/``auto``-on-bf16-hardware decodes with) the engine samples
``--prompts`` prompts × ``--gens`` completions of at most ``--max-new`` tokens (temperature 1, fixed seed),
``--repeats`` times; the fastest run is reported with the sampled lengths (mean, min, max, number
that hit the cap). The machine comes first (``benchmarks/machine.py``).

``--profile`` adds a ``torch.profiler`` table of one fp32 run (self CPU time by op), which is where the
engine's time goes; ``--decode-step`` times single 64-row decode steps at one cache length per dtype.

Run (heavy)::

    HF_HUB_OFFLINE=1 flock /tmp/rlvr-heavy.lock python benchmarks/bench_precision_generate.py \\
        --prompts 8 --gens 8 --max-new 128 --dtypes fp32 --profile
    HF_HUB_OFFLINE=1 flock /tmp/rlvr-heavy.lock python benchmarks/bench_precision_generate.py \\
        --prompts 1 --gens 8 --max-new 16 --dtypes fp32,bf16

Writes ``benchmarks/results/bench_precision_generate.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from rlvr.config import ModelConfig  # noqa: E402
from rlvr.engines.hf import HFEngine  # noqa: E402
from rlvr.models import load_policy  # noqa: E402
from rlvr.precision import resolve_precision  # noqa: E402
from rlvr.types import GenerationRequest, SamplingParams  # noqa: E402

from machine import print_machine  # noqa: E402  (benchmarks/machine.py)

RESULTS = Path(__file__).parent / "results" / "bench_precision_generate.json"
QUESTIONS = [  # the prompts of bench_generate.py
    "What is 17 + 25?",
    "Compute 8 * 7 and explain briefly.",
    "A shop sells pens at 3 dollars each. How much do 12 pens cost?",
    "What is 144 divided by 12?",
    "Tom has 5 apples and buys 9 more. How many apples does he have?",
    "What is 1000 - 387?",
    "Give the sum of 12, 19 and 33.",
    "If a train travels 60 km per hour for 3 hours, how far does it go?",
]


def prompts(tok, k: int) -> list[list[int]]:
    """The first ``k`` questions through the chat template (token ids)."""
    out = []
    for q in QUESTIONS[:k]:
        text = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        out.append(tok(text, add_special_tokens=False)["input_ids"])
    return out


def run(engine: HFEngine, ids: list[list[int]], gens: int, max_new: int, seed: int) -> dict:
    """One generation call; tokens, seconds, tok/s and sampled lengths."""
    reqs = [GenerationRequest(p, n=gens) for p in ids]
    t = time.perf_counter()
    out = engine.generate(reqs, SamplingParams(temperature=1.0, max_new_tokens=max_new, seed=seed))
    s = time.perf_counter() - t
    lens = [len(g.token_ids) for row in out for g in row]
    return {"seconds": s, "tokens": sum(lens), "tok_per_s": sum(lens) / s, "mean_len": sum(lens) / len(lens),
            "min_len": min(lens), "max_len": max(lens), "hit_cap": sum(g.finish_reason == "length" for r in out for g in r)}


def decode_step_ms(engine: HFEngine, rows: int = 64, ctx: int = 150, steps: int = 3) -> float:
    """Median ms of one ``rows``-row decode step on a ``ctx``-token cache (the engine's decode model)."""
    from rlvr.engines.hf import _new_cache

    model = engine._decode_model
    ids = torch.randint(10, 1000, (rows, ctx))
    mask = torch.ones(rows, ctx, dtype=torch.long)
    pos = torch.arange(ctx)[None].expand(rows, ctx)
    times = []
    with torch.inference_mode():
        cache, _ = _new_cache(model.config, ctx + steps + 1, "append")
        engine._forward(ids, mask, pos, cache)
        for k in range(steps):
            mask = torch.cat([mask, torch.ones(rows, 1, dtype=torch.long)], 1)
            t = time.perf_counter()
            engine._forward(torch.randint(10, 1000, (rows, 1)), mask, torch.full((rows, 1), ctx + k), cache)
            times.append((time.perf_counter() - t) * 1000)
    return sorted(times)[len(times) // 2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--gens", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="torch.profiler table of one fp32 run")
    ap.add_argument("--decode-step", action="store_true", help="time single 64-row decode steps per dtype")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)

    machine = print_machine()
    model, tok = load_policy(ModelConfig(name_or_path=args.model, dtype="fp32"))
    ids = prompts(tok, args.prompts)
    result: dict = {"settings": vars(args), **machine, "runs": {}}
    for name in args.dtypes.split(","):
        engine = HFEngine(model, tok, precision=resolve_precision(name, log=False))
        best = None
        for _ in range(args.repeats):
            r = run(engine, ids, args.gens, args.max_new, args.seed)
            best = r if best is None or r["tok_per_s"] > best["tok_per_s"] else best
        if args.decode_step:
            best["decode_step_64rows_ctx150_ms"] = decode_step_ms(engine)
        result["runs"][name] = best
        print(f"{name}: {best['tokens']} tokens in {best['seconds']:.1f} s = {best['tok_per_s']:.1f} tok/s; lengths mean "
              f"{best['mean_len']:.1f} [{best['min_len']}, {best['max_len']}], {best['hit_cap']} hit the cap"
              + (f"; 64-row decode step {best['decode_step_64rows_ctx150_ms']:.0f} ms" if args.decode_step else ""),
              flush=True)
    if len(result["runs"]) > 1 and "fp32" in result["runs"]:
        for name, r in result["runs"].items():
            r["tok_per_s_over_fp32"] = r["tok_per_s"] / result["runs"]["fp32"]["tok_per_s"]
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        engine = HFEngine(model, tok)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            r = run(engine, ids, args.gens, args.max_new, args.seed)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
        print(table)
        total = sum(e.self_cpu_time_total for e in prof.key_averages())
        result["profile"] = {"run": r, "table": table, "self_cpu_share": {
            e.key: e.self_cpu_time_total / total for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:20]}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

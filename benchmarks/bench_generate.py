"""Generation throughput on the real default model (SmolLM2-135M-Instruct, fp32, CPU).

Compares ways to sample that all meet the engine contract (new token ids + behaviour log-prob per
sampled token + finish reason):

* ``hf_engine``            — :class:`rlvr.engines.hf.HFEngine` as shipped (shared prefill, finished rows
                             pruned, append-in-place KV cache);
* ``hf_engine_dynamic``    — the same loop on transformers' ``DynamicCache`` (``torch.cat`` per step);
* ``hf_engine_noprune``    — the same loop keeping finished rows until the batch ends (as ``generate``);
* ``model_generate``       — ``model.generate(do_sample=True, num_return_sequences=n,
                             output_scores=True)``, log-probs taken from the processed scores;
* ``generate_batch``       — transformers' continuous batching (``model.generate_batch`` with
                             ``return_logprobs=True``), if it runs here.

Scenarios: ``group`` = 8 prompts × 8 samples × 128 new tokens (one GRPO generation batch),
``single`` = batch 1: the same 8 prompts one at a time, 1 sample each, 128 new tokens at most, and
``small`` = the first prompt × 8 samples (for precisions that are slow on this CPU; pair it with a small
``--max-new-tokens``). Temperature 1, no top-p/top-k.

Precision (issue 15): ``--dtypes fp32,bf16`` adds ``hf_engine_bf16`` — the shipped engine under the
``bf16`` policy (it decodes with a bf16 weight copy, :attr:`rlvr.precision.PrecisionPolicy.generation_dtype`),
timed interleaved with the fp32 methods; ``decode_step`` then also times its 64-row decode step (append
cache, length 150). The machine comes first (``benchmarks/machine.py``: CPU, bf16 flags, fp32/bf16 matmul
rates, load average). ``--profile`` prints a ``torch.profiler`` table (self CPU time by op) of one
``hf_engine`` group run: where the engine's time goes.

``decode_step`` (in the JSON) times one decode step of 64 rows at cache lengths 150/600/1000 with
the engine's append-in-place KV cache and with transformers' ``DynamicCache``: the reason the
engine ships its own cache layer (long completions make ``torch.cat`` per step dominate).
tokens/s counts generated tokens actually returned (up to and including EOS) per wall second; each
method runs ``--repeats`` times, interleaved with the others, and the fastest run is reported.
tok/cpu-s divides by the process's CPU time instead: with ``--threads 1`` it is the number least
disturbed by other users of a shared machine (a descheduled process accrues no CPU time), which is
why the committed results use it.

Run: ``HF_HUB_OFFLINE=1 python benchmarks/bench_generate.py [--threads 1]``; rlvr engine fp32 vs bf16 on a CPU
without native bf16: ``--methods hf_engine --dtypes fp32,bf16 --scenarios small --max-new-tokens 16`` (10–20 minutes on the
shared machines; the first run converts the GGUF into the model cache). Writes ``benchmarks/results/bench_generate.json``. Timings on the
shared 2-core machines are noisy (±20 %); they are never test assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402

from rlvr.config import ModelConfig  # noqa: E402
from rlvr.engines.hf import HFEngine  # noqa: E402
from rlvr.models import load_policy  # noqa: E402
from rlvr.precision import resolve_precision  # noqa: E402
from rlvr.types import GenerationRequest, SamplingParams  # noqa: E402

from machine import print_machine  # noqa: E402  (benchmarks/machine.py)

QUESTIONS = [
    "What is 17 + 25?",
    "Compute 8 * 7 and explain briefly.",
    "A shop sells pens at 3 dollars each. How much do 12 pens cost?",
    "What is 144 divided by 12?",
    "Tom has 5 apples and buys 9 more. How many apples does he have?",
    "What is 1000 - 387?",
    "Give the sum of 12, 19 and 33.",
    "If a train travels 60 km per hour for 3 hours, how far does it go?",
]

RESULTS = Path(__file__).parent / "results" / "bench_generate.json"


def _prompts(tok, k: int) -> list[list[int]]:
    out = []
    for q in QUESTIONS[:k]:
        enc = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        out.append(list(enc["input_ids"] if hasattr(enc, "keys") else enc))
    return out


def run_engine(model, tok, prompts, n, max_new, seed, **engine_kw):
    eng = HFEngine(model, tok, **engine_kw)
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new, seed=seed)
    t0 = time.perf_counter()
    out = eng.generate([GenerationRequest(p, n) for p in prompts], params)
    wall = time.perf_counter() - t0
    lens = [len(g.token_ids) for gs in out for g in gs]
    return wall, lens


def run_model_generate(model, tok, prompts, n, max_new, seed):
    torch.manual_seed(seed)
    width = max(len(p) for p in prompts)
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    eos = {tok.eos_token_id}
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
            max_new_tokens=max_new, num_return_sequences=n, return_dict_in_generate=True,
            output_scores=True, pad_token_id=pad,
        )
        new = out.sequences[:, width:]  # [B*n, T]
        scores = torch.stack(out.scores, dim=1)  # [B*n, T, V] processed logits
        lp = scores.log_softmax(-1).gather(-1, new[..., None]).squeeze(-1)
        lens = []
        for row in new.tolist():
            k = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
            lens.append(k)
        _ = [lp[i, :k].tolist() for i, k in enumerate(lens)]
    wall = time.perf_counter() - t0
    return wall, lens


def run_generate_batch(model, tok, prompts, n, max_new, seed):
    from transformers import GenerationConfig
    from transformers.generation import ContinuousBatchingConfig

    torch.manual_seed(seed)
    gen_cfg = GenerationConfig(
        do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new,
        num_return_sequences=n, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    # max_memory_percent: the default sizes the paged cache from free memory (GBs on CPU); warmup
    # pre-captures CUDA graphs and only costs time here.
    cb_cfg = ContinuousBatchingConfig(return_logprobs=True, seed=seed, max_memory_percent=0.1)
    t0 = time.perf_counter()
    out = model.generate_batch(
        inputs=prompts, generation_config=gen_cfg, continuous_batching_config=cb_cfg, progress_bar=False,
        warmup=False,
    )
    wall = time.perf_counter() - t0
    lens = [len(o.generated_tokens) for o in out.values()]
    errors = [o.error for o in out.values() if o.error]
    if errors:
        raise RuntimeError(errors[0])
    if len(lens) != len(prompts) * n:
        raise RuntimeError(f"generate_batch returned {len(lens)} outputs for {len(prompts) * n} requests")
    return wall, lens


def decode_step_ms(model, lengths=(150, 600, 1000), rows=64, steps=5, kinds=("append", "dynamic")) -> list[dict]:
    """CPU ms of one decode step (median of ``steps``) for each KV-cache kind and cache length.

    ``model`` is called directly (pass an engine's ``_decode_model`` to time its bf16 copy).
    """
    from rlvr.engines.kv_cache import new_cache as _new_cache

    out = []
    hi = min(1000, model.config.vocab_size)  # random token ids below the vocabulary size
    for length in lengths:
        for kind in kinds:
            with torch.inference_mode():
                cache, _ = _new_cache(model.config, length + steps + 1, kind)
                ids = torch.randint(100, hi, (8, length))
                model(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, use_cache=True, logits_to_keep=1)
                cache.batch_select_indices(torch.arange(8).repeat_interleave(rows // 8))
                mask = torch.ones(rows, length, dtype=torch.long)
                pos = torch.full((rows, 1), length)
                times = []
                for _ in range(steps):
                    mask = torch.cat([mask, torch.ones(rows, 1, dtype=torch.long)], 1)
                    c0 = time.process_time()
                    model(input_ids=torch.randint(100, hi, (rows, 1)), attention_mask=mask, position_ids=pos,
                          cache=cache, use_cache=True, logits_to_keep=1)
                    times.append(time.process_time() - c0)
                    pos = pos + 1
            ms = sorted(times)[len(times) // 2] * 1e3
            out.append({"cache": kind, "cache_len": length, "rows": rows, "cpu_ms_per_step": round(ms, 1),
                        "dtype": str(next(model.parameters()).dtype).removeprefix("torch.")})
            print(f"[decode_step] {kind:8} len {length:5d}: {ms:7.1f} cpu-ms/step", flush=True)
    return out


METHODS = {
    "hf_engine": lambda m, t, p, n, k, s: run_engine(m, t, p, n, k, s),
    "hf_engine_dynamic": lambda m, t, p, n, k, s: run_engine(m, t, p, n, k, s, cache="dynamic"),
    "hf_engine_noprune": lambda m, t, p, n, k, s: run_engine(m, t, p, n, k, s, prune=False),
    "model_generate": run_model_generate,
    "generate_batch": run_generate_batch,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ", ".join(METHODS))
    ap.add_argument("--scenarios", default="group,single")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2, help="runs per method; the fastest is reported")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--skip-decode-step", action="store_true", help="skip the KV-cache decode-step timing")
    ap.add_argument("--dtypes", default="fp32", help="engine precisions (model.dtype values); each one but fp32 adds "
                    "hf_engine_<dtype> to the methods")
    ap.add_argument("--profile", action="store_true", help="torch.profiler table of one hf_engine group run")
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    machine = print_machine()
    t0 = time.perf_counter()
    model, tok = load_policy(ModelConfig(dtype="fp32"))
    model.eval()
    load_s = time.perf_counter() - t0
    scenarios = {"group": (8, 8), "single": (8, 1), "small": (1, 8)}
    methods = args.methods.split(",")
    for dt in args.dtypes.split(","):
        if dt != "fp32":
            METHODS[f"hf_engine_{dt}"] = _precision_method(dt)
            methods.append(f"hf_engine_{dt}")
    # warm-up: first calls pay for lazy imports and allocator growth
    warm = _prompts(tok, 1)
    for name in methods:
        try:
            METHODS[name](model, tok, warm, 1, 4, args.seed)
        except Exception:  # noqa: BLE001 - reported in the measured run
            pass
    rows = []
    for sc in args.scenarios.split(","):
        k, n = scenarios[sc]
        prompts = _prompts(tok, k)
        runs: dict[str, list[dict]] = {name: [] for name in methods}
        for rep in range(args.repeats):  # methods interleaved, so load spikes hit all of them alike
            for name in methods:
                load_before = os.getloadavg()[0]
                c0 = time.process_time()
                try:
                    if sc == "single":  # batch 1: one prompt at a time
                        wall, lens = 0.0, []
                        for p in prompts:
                            w, ls = METHODS[name](model, tok, [p], n, args.max_new_tokens, args.seed)
                            wall, lens = wall + w, lens + ls
                    else:
                        wall, lens = METHODS[name](model, tok, prompts, n, args.max_new_tokens, args.seed)
                    run = {"wall_s": wall, "cpu_s": time.process_time() - c0, "lens": lens, "load": load_before}
                except Exception as exc:  # noqa: BLE001 - a method that cannot run here is reported
                    run = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                runs[name].append(run)
                _print_run(sc, name, rep, run)
        for name in methods:
            rows.append(_summarise(sc, name, k, n, args.max_new_tokens, prompts, runs[name]))

    steps = decode_step_ms(model) if not args.skip_decode_step else []
    if not args.skip_decode_step:
        for dt in args.dtypes.split(","):
            if dt != "fp32":
                eng = HFEngine(model, tok, precision=resolve_precision(dt, log=False))
                steps += decode_step_ms(eng._decode_model, lengths=(150,), steps=3, kinds=("append",))
    profile = _profile(model, tok, args) if args.profile else None
    print()
    print(f"{'scenario':8} {'method':20} {'tok/s':>8} {'tok/cpu-s':>9} {'wall s':>8} {'tokens':>7} {'mean len':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['scenario']:8} {r['method']:20} {'error':>8}  {r['error'][:70]}")
        else:
            print(f"{r['scenario']:8} {r['method']:20} {r['tokens_per_s']:8.1f} {r['tokens_per_cpu_s']:9.1f} {r['wall_s']:8.2f} "
                  f"{r['gen_tokens']:7d} {r['mean_len']:8.1f}")
    if not args.no_write:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "model": "SmolLM2-135M-Instruct (default; fp32 master weights)",
            "machine": machine,
            "dtypes": args.dtypes.split(","),
            "model_load_s": round(load_s, 2),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "temperature": 1.0,
            "seed": args.seed,
            "repeats": args.repeats,
            "note": "tokens_per_s = generated tokens returned (incl. EOS) / wall seconds, best of `repeats` "
            "interleaved runs (all in tokens_per_s_all); shared noisy 2-core machine: see loadavg_1min",
        }
        try:
            import transformers

            meta["transformers"] = transformers.__version__
        except ImportError:
            pass
        doc = {"meta": meta, "results": rows, "decode_step": steps}
        if profile is not None:
            doc["profile"] = profile
        out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"\nwrote {out}")
    return 0


def _precision_method(dtype: str):
    """A METHODS entry: the shipped engine under the ``dtype`` precision policy (e.g. bf16's weight copy)."""
    policy = resolve_precision(dtype, log=False)
    return lambda m, t, p, n, k, s: run_engine(m, t, p, n, k, s, precision=policy)


def _profile(model, tok, args) -> dict:
    """``torch.profiler`` of one ``hf_engine`` group run (8 × 8): top ops by self CPU time and their shares."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        wall, lens = run_engine(model, tok, _prompts(tok, 8), 8, args.max_new_tokens, args.seed)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
    print(table)
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    return {"wall_s": wall, "gen_tokens": sum(lens), "table": table,
            "self_cpu_share": {e.key: e.self_cpu_time_total / total for e in events[:20]}}


def _print_run(sc: str, name: str, rep: int, run: dict) -> None:
    if "error" in run:
        print(f"[{sc}] {name} #{rep}: ERROR {run['error']}", flush=True)
    else:
        tps = sum(run["lens"]) / run["wall_s"]
        print(f"[{sc}] {name} #{rep}: {tps:.1f} tok/s, {sum(run['lens']) / run['cpu_s']:.1f} tok/cpu-s "
              f"({sum(run['lens'])} tokens in {run['wall_s']:.2f} s, cpu {run['cpu_s']:.1f} s, "
              f"load {run['load']:.1f})", flush=True)


def _summarise(sc, name, k, n, max_new, prompts, runs) -> dict:
    row = {"scenario": sc, "method": name, "prompts": k, "n": n, "max_new_tokens": max_new,
           "prompt_tokens": [len(p) for p in prompts]}
    ok = [r for r in runs if "error" not in r]
    if not ok:
        row["error"] = runs[0]["error"]
        return row
    tps = [sum(r["lens"]) / r["wall_s"] for r in ok]
    tpc = [sum(r["lens"]) / r["cpu_s"] for r in ok]
    best = ok[max(range(len(ok)), key=lambda i: tps[i])]
    row.update(
        tokens_per_s=round(max(tps), 1),
        tokens_per_s_all=[round(x, 1) for x in tps],
        tokens_per_cpu_s=round(max(tpc), 1),
        tokens_per_cpu_s_all=[round(x, 1) for x in tpc],
        wall_s=round(best["wall_s"], 2),
        cpu_s=round(best["cpu_s"], 2),
        gen_tokens=sum(best["lens"]),
        mean_len=round(sum(best["lens"]) / len(best["lens"]), 1),
        max_len=max(best["lens"]),
        loadavg_1min=[round(r["load"], 2) for r in ok],
    )
    if len(ok) < len(runs):
        row["errors"] = [r["error"] for r in runs if "error" in r]
    return row


if __name__ == "__main__":
    raise SystemExit(main())

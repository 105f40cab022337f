"""Generation tok/s: rlvr's HFEngine against the vLLM server engine, at equal precision, in one run.

Setting: the default model (SmolLM2-135M-Instruct), the 8 chat prompts of ``bench_generate.py``,
8 samples each, up to 128 new tokens, temperature 1 (one GRPO generation batch: 8 × 8 × 128).
For each precision (``fp32``, ``bf16``):

* ``hf``: :class:`rlvr.engines.hf.HFEngine` on the model cast to that dtype, in this process;
* ``vllm``: :class:`rlvr.engines.vllm_engine.VLLMEngine` on a server rlvr starts
  (``--dtype`` = that dtype) for each server variant: ``eager`` (``--enforce-eager``) and
  ``compiled`` (vLLM's default CPU path, torch.compile; its warm-up is in the start-up time).

The server and this process share the same cores; while the server generates, this process only
waits on HTTP. Each engine is timed **with the others stopped**: every other vLLM server's process group
gets ``SIGSTOP`` for the duration of the call and ``SIGCONT`` after it (an idle server still takes CPU: beside
an idle fp32 server on two cores, rlvr's engine fell from 147–190 to 34–43 tok/s; ``--keep-others-running``
restores the old behaviour). Each method runs ``--repeats`` times, interleaved, after one warm-up call, and the
fastest is reported; sampled lengths (mean, min, max, EOS fraction) are reported with every rate,
because tok/s only compares like with like when the lengths match.

First lines: CPU model, torch CPU capability, bf16 support flags, measured fp32 and bf16 matmul
GFLOP/s (512×576×1536), because machines differ.

Run (needs ``make vllm-env``): ``flock /tmp/rlvr-heavy.lock env HF_HUB_OFFLINE=1 PYTHONPATH=src
.venv/bin/python benchmarks/bench_vllm.py`` → ``benchmarks/results/bench_vllm.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402

from bench_generate import _prompts  # noqa: E402
from rlvr.config import ModelConfig, build_config  # noqa: E402
from rlvr.engines.factory import build_engine  # noqa: E402
from rlvr.engines.hf import HFEngine  # noqa: E402
from rlvr.models import load_policy  # noqa: E402
from rlvr.types import GenerationRequest, SamplingParams  # noqa: E402

from machine import print_machine  # noqa: E402  (benchmarks/machine.py: CPU, flags, matmul rates)

RESULTS = Path(__file__).parent / "results" / "bench_vllm.json"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def lengths_summary(out) -> dict:
    lens = [len(g.token_ids) for gs in out for g in gs]
    eos = [g.finish_reason == "eos" for gs in out for g in gs]
    return {"tokens": sum(lens), "mean_len": sum(lens) / len(lens), "min_len": min(lens), "max_len": max(lens),
            "eos_frac": sum(eos) / len(eos)}


def timed(engine, reqs, params) -> tuple[float, dict]:
    t0 = time.perf_counter()
    out = engine.generate(reqs, params)
    wall = time.perf_counter() - t0
    s = lengths_summary(out)
    s["wall_s"] = wall
    s["tok_per_s"] = s["tokens"] / wall
    return wall, s


@contextlib.contextmanager
def others_stopped(engines: dict, name: str, enabled: bool = True):
    """Stop (``SIGSTOP``) the process group of every vLLM server in ``engines`` but ``name``'s for the block,
    continue them (``SIGCONT``) after it, so the engine being timed has the cores to itself. Yields the
    number of servers stopped."""
    pgids = []
    for other, eng in engines.items():
        proc = getattr(getattr(eng, "server", None), "proc", None)
        if enabled and other != name and proc is not None and proc.poll() is None:
            pgids.append(os.getpgid(proc.pid))
    for g in pgids:
        os.killpg(g, signal.SIGSTOP)
    try:
        yield len(pgids)
    finally:
        for g in pgids:
            os.killpg(g, signal.SIGCONT)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--variants", default="eager,compiled")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--slow-bf16-n", type=int, default=1,
                    help="samples per prompt for bf16 on a CPU without native bf16 (its matmuls run ~100x slower)")
    ap.add_argument("--slow-bf16-max-new", type=int, default=16)
    ap.add_argument("--vllm-python", default=os.environ.get("RLVR_VLLM_PYTHON", ".venv-vllm/bin/python"),
                    help="the vLLM env's python (default: $RLVR_VLLM_PYTHON, else .venv-vllm/bin/python)")
    ap.add_argument("--keep-others-running", action="store_true",
                    help="time each engine beside the other (idle) servers instead of stopping them")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()

    info = print_machine()
    base, tok = load_policy(ModelConfig(name_or_path="default"))
    prompts = _prompts(tok, 8)
    result = {"machine": info, "setting": {"prompts": len(prompts), "n": args.n, "max_new_tokens": args.max_new,
                                           "temperature": 1.0, "repeats": args.repeats}, "runs": []}
    native_bf16 = info["cpu"]["native_bf16"]
    for dname in args.dtypes.split(","):
        dt = DTYPES[dname]
        model = base.to(dt)
        n, max_new = args.n, args.max_new
        if dname == "bf16" and not native_bf16:  # a smaller batch, reported as such
            n, max_new = args.slow_bf16_n, args.slow_bf16_max_new
        reqs = [GenerationRequest(p, n) for p in prompts]
        engines = {"hf": HFEngine(model, tok)}
        starts = {}
        for variant in args.variants.split(","):
            cfg = build_config(overrides=[
                "engine=vllm", f"vllm.python={args.vllm_python}", f"vllm.dtype={'float32' if dname == 'fp32' else 'bfloat16'}",
                f"vllm.enforce_eager={'true' if variant == 'eager' else 'false'}", "vllm.max_model_len=1024",
                "vllm.startup_timeout_s=1200", "vllm.cpu_kv_cache_gib=2", f"vllm.log_file=runs/bench_vllm/{dname}_{variant}.log",
            ])
            t0 = time.perf_counter()
            engines[f"vllm_{variant}"] = build_engine(cfg, model, tok, "runs/bench_vllm")
            starts[f"vllm_{variant}"] = time.perf_counter() - t0
            print(f"{dname} vllm_{variant}: server up in {starts[f'vllm_{variant}']:.1f} s", flush=True)
            result.setdefault("server_start_s", {})[f"{dname}_vllm_{variant}"] = round(starts[f"vllm_{variant}"], 1)
        try:
            for name, eng in engines.items():  # warm-up (vLLM: first-request paths; hf: allocator)
                eng.generate(reqs[:2], SamplingParams(temperature=1.0, max_new_tokens=16, seed=99))
            best: dict[str, dict] = {}
            for r in range(args.repeats):
                for name, eng in engines.items():
                    with others_stopped(engines, name, not args.keep_others_running) as stopped:
                        _, s = timed(eng, reqs, SamplingParams(temperature=1.0, max_new_tokens=max_new, seed=r))
                    s["servers_stopped"] = stopped
                    print(f"{dname} {name} repeat {r}: {s['tok_per_s']:.1f} tok/s, mean len {s['mean_len']:.1f}", flush=True)
                    result.setdefault("raw", []).append({"dtype": dname, "engine": name, "repeat": r, "n": n,
                                                         "max_new_tokens": max_new, "load1": os.getloadavg()[0], **s})
                    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                    Path(args.out).write_text(json.dumps(result, indent=2))  # a cut run keeps what it measured
                    if name not in best or s["tok_per_s"] > best[name]["tok_per_s"]:
                        best[name] = s
            for name, s in best.items():
                row = {"dtype": dname, "engine": name, "n": n, "max_new_tokens": max_new,
                       **{k: round(v, 3) for k, v in s.items()}}
                if name in starts:
                    row["server_start_s"] = round(starts[name], 1)
                row["ratio_vs_hf"] = round(s["tok_per_s"] / best["hf"]["tok_per_s"], 3)
                result["runs"].append(row)
        finally:
            for name, eng in engines.items():
                if hasattr(eng, "close"):
                    eng.close()
    print(f"\n{'dtype':5} {'batch':9} {'engine':15} {'tok/s':>8} {'x hf':>6} {'mean len':>9} {'eos':>5} {'start s':>8}")
    for row in result["runs"]:
        batch = f"8x{row['n']}x{row['max_new_tokens']}"
        print(f"{row['dtype']:5} {batch:9} {row['engine']:15} {row['tok_per_s']:8.1f} {row['ratio_vs_hf']:6.2f} "
              f"{row['mean_len']:9.1f} {row['eos_frac']:5.2f} {row.get('server_start_s', ''):>8}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Full fine-tuning vs LoRA on the default model (CPU): generation through peft vs a merged copy, step
time by phase, peak memory, trainable parameters, and a short demo-task reward curve for each.

Parts, each run alone so that no piece holds the shared heavy lock for more than ~10 minutes
(``--parts gen``, ``--parts run --arm full``, ``--parts run --arm lora``, ``--parts report``):

* ``gen`` — the same requests (``--gen-prompts`` × ``--gen-samples`` completions, ``--gen-tokens`` new
  tokens, fixed seed) sampled by :class:`rlvr.engines.hf.HFEngine` on (a) the plain base model, (b) the
  peft model with LoRA r = ``--rank`` adapters live (``merged_generation=false``) and (c) the merged
  generation copy (``merged_generation=true``), interleaved, ``--gen-repeats`` times each, best time kept;
  plus the cost of one weight sync (``merged_state_dict`` + ``load_weights``). The adapters get random
  ``B`` so the merged weights are not the base ones (the cost does not depend on the values).
* ``run`` — ``rlvr train --config demo`` for one arm (``--arm``) in a fresh process, stopped after
  ``--arm-timeout`` seconds if it has not finished (the steps logged so far are kept and counted);
  the two arms are with the same seed and the same
  small batch (``generation_batch_size=--gbs``): full fine-tuning (``learning_rate=--lr-full``) and LoRA
  r = ``--rank``, alpha = 2r (``learning_rate=--lr-lora``: LoRA is usually run at ~10× the full-FT rate).
  Step 1 of both runs samples the very same batch (a fresh LoRA adapter has ``B = 0``, so the merged
  weights equal the base bit for bit); the table gives step 1's phases and the median of steps 2..N.
  Peak memory is each process's peak RSS (``perf/peak_memory_mb``). Trainable parameters are counted
  on the loaded model.
* ``report`` — reads both arms' ``metrics.jsonl``, counts trainable parameters, prints the table and
  writes the plot of ``reward/mean`` per step of both runs in one PNG (``--plot``).

Run (heavy: one lock hold per piece)::

    export HF_HUB_OFFLINE=1
    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/bench_lora.py --parts gen
    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/bench_lora.py --parts run --arm full
    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/bench_lora.py --parts run --arm lora
    .venv/bin/python benchmarks/bench_lora.py --parts report

Writes ``benchmarks/results/bench_lora.json`` and ``docs/results/lora_vs_full.png``. Prints the CPU
capability and the fp32 matmul rate measured in the same run. Timings are noisy (±20 % on a shared
machine) and never test assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bench_lora.json"
PLOT = ROOT / "docs" / "results" / "lora_vs_full.png"
PHASES = ("timing/generate_s", "timing/reward_s", "timing/update_s", "timing/step_s")


def machine() -> dict[str, Any]:
    """CPU capability, threads, and the best fp32 ``torch.mm`` rate on SmolLM2-135M's shapes (GFLOP/s)."""
    rates = {}
    for m, k, n in ((2048, 576, 1536), (2048, 1536, 576), (2048, 576, 576)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        torch.mm(a, b)
        best = min(_timed(lambda: torch.mm(a, b)) for _ in range(5))
        rates[f"{m}x{k}x{n}"] = round(2 * m * k * n / best / 1e9, 1)
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            "processor": platform.processor() or platform.machine(), "torch": torch.__version__,
            "fp32_matmul_gflops": rates}


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# ------------------------------------------------------------------------------------------ generation
def bench_generation(args: argparse.Namespace) -> dict[str, Any]:
    """Time the same sampling on the base model, the live peft layers and the merged copy."""
    from rlvr.config import build_config
    from rlvr.engines.hf import HFEngine
    from rlvr.lora import apply_lora, lora_engine, merged_state_dict
    from rlvr.models import load_policy
    from rlvr.samplers.group import PromptEncoder
    from rlvr.tasks import build_task
    from rlvr.types import GenerationRequest, SamplingParams

    cfg = build_config(["demo"], [f"model.lora.r={args.rank}", f"model.lora.alpha={2 * args.rank}"])
    model, tok = load_policy(cfg.model)
    task = build_task(cfg.task)
    enc = PromptEncoder(tok, task.system_prompt, cfg.max_prompt_length)
    reqs = [GenerationRequest(context_ids=enc(p), n=args.gen_samples)
            for p in task.problems("train")[: args.gen_prompts]]
    params = SamplingParams(temperature=1.0, max_new_tokens=args.gen_tokens, seed=1)
    base_engine = HFEngine(model, tok)
    base_engine.generate(reqs, SamplingParams(temperature=1.0, max_new_tokens=4, seed=0))  # warm-up, untimed
    base_times = []
    for _ in range(args.gen_repeats):  # the base model alone, before any wrapping
        base_times.append(_timed(lambda: base_engine.generate(reqs, params)))
    torch.manual_seed(0)
    pm = apply_lora(model, cfg.model.lora)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 1e-3)
    live, _ = lora_engine(pm, tok, merged=False)
    merged, sync = lora_engine(pm, tok, merged=True)
    times: dict[str, list[float]] = {"peft_live": [], "merged_copy": []}
    tokens = {}
    for _ in range(args.gen_repeats):
        for name, eng in (("peft_live", live), ("merged_copy", merged)):
            t = time.perf_counter()
            out = eng.generate(reqs, params)
            times[name].append(time.perf_counter() - t)
            tokens[name] = sum(len(g.token_ids) for gs in out for g in gs)
    sync_s = min(_timed(lambda: sync(None)) for _ in range(3))
    merge_only_s = min(_timed(lambda: merged_state_dict(pm)) for _ in range(3))
    res = {
        "requests": f"{args.gen_prompts} prompts x {args.gen_samples} samples, <= {args.gen_tokens} new tokens",
        "rank": args.rank, "base_s": min(base_times),
        **{f"{k}_s": min(v) for k, v in times.items()}, "tokens": tokens,
        "sync_s": sync_s, "merged_state_dict_s": merge_only_s, "all_times": {**times, "base": base_times},
    }
    res["merged_speedup"] = res["peft_live_s"] / res["merged_copy_s"]
    return res


# ------------------------------------------------------------------------------------------ runs
def run_arm(args: argparse.Namespace, arm: str, out: Path) -> dict[str, Any]:
    """``rlvr train --config demo`` in a fresh process; returns its per-step metrics and sizes."""
    over = [f"logging.output_dir={out}", f"max_steps={args.steps}", f"generation_batch_size={args.gbs}",
            "logging.progress=false", "logging.tensorboard=false", f"seed={args.seed}", "save_steps=0"]
    if arm == "lora":
        over += [f"model.lora.r={args.rank}", f"model.lora.alpha={2 * args.rank}", f"learning_rate={args.lr_lora}"]
    else:
        over += [f"learning_rate={args.lr_full}"]
    if out.exists():
        import shutil

        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "rlvr.cli", "train", "--config", "demo", *over]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t = time.perf_counter()
    try:
        subprocess.run(cmd, check=True, env=env, timeout=args.arm_timeout)
        stopped = False
    except subprocess.TimeoutExpired:
        stopped = True  # the steps logged so far are kept
    wall = time.perf_counter() - t
    info = {"arm": arm, "cmd": " ".join(["rlvr train --config demo", *over]), "wall_s": wall,
            "stopped_by_time_limit": stopped}
    (out / "bench_arm.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def read_arm(out: Path) -> dict[str, Any]:
    """An arm's recorded run: ``bench_arm.json`` plus its ``metrics.jsonl`` rows."""
    info = json.loads((out / "bench_arm.json").read_text())
    info["rows"] = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return info


def model_sizes(rank: int) -> dict[str, dict[str, int]]:
    """Trainable / total parameters of the default model, full fine-tuning and LoRA r = ``rank``."""
    from rlvr.config import build_config
    from rlvr.lora import apply_lora, trainable_parameters
    from rlvr.models import load_policy

    cfg = build_config(["demo"], [f"model.lora.r={rank}", f"model.lora.alpha={2 * rank}"])
    model, _ = load_policy(cfg.model)
    full = trainable_parameters(model)
    lora = trainable_parameters(apply_lora(model, cfg.model.lora))
    return {"full": {"trainable": full[0], "total": full[1]}, "lora": {"trainable": lora[0], "total": lora[1]}}


def summarise(run: dict[str, Any]) -> dict[str, Any]:
    """Step 1's phases, the median phases of steps 2..N, peak memory and the reward curve."""
    rows = run["rows"]
    first = {k: rows[0].get(k) for k in PHASES}
    later = {k: statistics.median(r[k] for r in rows[1:] if k in r) for k in PHASES if any(k in r for r in rows[1:])}
    return {"step1": first, "median_later": later, "peak_memory_mb": max(r["perf/peak_memory_mb"] for r in rows),
            "reward_mean": [r.get("reward/mean") for r in rows], "steps": len(rows), "wall_s": run["wall_s"],
            "cmd": run["cmd"], "stopped_by_time_limit": run.get("stopped_by_time_limit", False)}


def plot(summary: dict[str, Any], path: Path, title: str) -> None:
    """Both runs' ``reward/mean`` per step in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for arm, s in summary.items():
        ys = s["reward_mean"]
        ax.plot(range(1, len(ys) + 1), ys, marker="o", ms=3, label=arm)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("reward/mean")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the parts, print tables, write JSON (and the plot)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="gen", help="comma-separated: gen, run, report")
    p.add_argument("--arm", choices=("full", "lora"), help="the arm of --parts run")
    p.add_argument("--arm-timeout", type=float, default=540.0, help="seconds before an arm's run is stopped")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--gen-prompts", type=int, default=4)
    p.add_argument("--gen-samples", type=int, default=8)
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--gen-repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--gbs", type=int, default=16, help="generation_batch_size of the demo runs (2 prompts x 8)")
    p.add_argument("--lr-full", type=float, default=2e-5)
    p.add_argument("--lr-lora", type=float, default=2e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs-dir", default=str(ROOT / "runs" / "bench_lora"))
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--plot", default=str(PLOT))
    args = p.parse_args(argv)
    parts = set(args.parts.split(","))
    out = Path(args.out)
    res: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    res["machine"] = machine()
    res["args"] = vars(args)
    print(json.dumps(res["machine"]))
    if "gen" in parts:
        g = bench_generation(args)
        res["generation"] = g
        print(f"generation ({g['requests']}): base {g['base_s']:.2f} s, peft live {g['peft_live_s']:.2f} s, "
              f"merged copy {g['merged_copy_s']:.2f} s (+ sync {g['sync_s']:.3f} s per update); "
              f"merged is {g['merged_speedup']:.2f}x the live speed")
    if "run" in parts:
        if not args.arm:
            p.error("--parts run needs --arm full|lora")
        run_arm(args, args.arm, Path(args.runs_dir) / args.arm)
    if "report" in parts:
        res["sizes"] = model_sizes(args.rank)
        summary = {arm: summarise(read_arm(Path(args.runs_dir) / arm)) for arm in ("full", "lora")}
        res["runs"] = summary
        steps = min(s["steps"] for s in summary.values())
        print("| | full FT | LoRA r=%d |" % args.rank)
        print("|---|---|---|")
        sz = res["sizes"]
        print(f"| trainable params | {sz['full']['trainable']:,} | {sz['lora']['trainable']:,} |")
        for k in PHASES:
            a, b = summary["full"], summary["lora"]
            print(f"| {k} step 1 / median 2..{steps} | {a['step1'][k]:.2f} / {a['median_later'].get(k, float('nan')):.2f} "
                  f"| {b['step1'][k]:.2f} / {b['median_later'].get(k, float('nan')):.2f} |")
        print(f"| peak RSS MiB | {summary['full']['peak_memory_mb']:.0f} | {summary['lora']['peak_memory_mb']:.0f} |")
        print(f"| steps logged | {summary['full']['steps']} | {summary['lora']['steps']} |")
        plot(summary, Path(args.plot), f"demo recipe, gbs={args.gbs}, seed {args.seed}: full FT (lr {args.lr_full:g}) "
             f"vs LoRA r={args.rank} (lr {args.lr_lora:g})")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

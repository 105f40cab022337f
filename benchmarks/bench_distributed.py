"""One process × 2 threads vs ``torchrun`` 2 processes × 1 thread, same global batch: step time by phase
and memory per rank (FSDP2 and replicated), on the default model (SmolLM2-135M) or ``--model tiny``.

Arms (each a fresh process or process group, run one after another):

* ``single``      — ``rlvr.cli``'s path without torchrun, ``distributed.num_threads=2``;
* ``fsdp2``       — ``torchrun --standalone --nproc_per_node 2``, 1 thread each, FSDP2 policy + generation copy;
* ``fsdp2_gathered`` — FSDP2 generating on the gathered module (``distributed.generation_weights=gathered``);
* ``replicated``  — the same with ``distributed.fsdp=false`` (full model per rank, all-reduced gradients).
* ``gen_ab``      — one 2-rank FSDP2 job generating alternately on the copy and on the gathered module, the
  same prompts and seeds each time (``--reps`` alternations): the side-by-side generation comparison.

Settings: GRPO, reasoning-gym ``chain_sum``, ``--prompts`` prompts × ``--gens`` completions per round
(global; each rank of 2 draws half), ``--max-new`` new tokens, fp32, μ = 1, micro-batches of 8 rows.
Every run prints the CPU capability and fp32/bf16 matmul rates first (``benchmarks/machine.py``) and
records the load average (``os.getloadavg``) before and after each arm: the machine is shared.
Phases are the trainer's own ``timing/*`` metrics (max over ranks under torchrun): ``generate``,
``reward``, ``weight_sync`` (gathering the shards into the generation copy), ``update`` (forward,
backward, gradient reduction, clipping, optimizer), and ``step``; the median over steps 2..N (step 1
includes warm-up). Memory, measured in every rank (``memory_per_rank``): RSS after loading the model, after the trainer's
setup (sharding, generation copy), after the last step, and the peak RSS (``ru_maxrss``); and, from the
tensors, bytes held in trained parameters, optimizer state and the generation copy after the last step.

Run (heavy: take the shared lock)::

    for arm in single fsdp2 fsdp2_gathered replicated; do  # one arm per lock hold (arms accumulate in the JSON)
      flock /tmp/rlvr-heavy.lock env HF_HUB_OFFLINE=1 PYTHONPATH=$PWD/src .venv/bin/python \
        benchmarks/bench_distributed.py --steps 3 --arms $arm
    done

Writes ``benchmarks/results/bench_distributed.json`` (or ``--out``). Timings are noisy (±20 %).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "bench_distributed.json"
PHASES = ("generate_s", "reward_s", "weight_sync_s", "update_s", "step_s")


def _bytes(tensors) -> int:
    n = 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        n += t.numel() * t.element_size()
    return n


def _rss_mb() -> dict[str, float]:
    """This process's memory now: current RSS (``/proc/self/statm``) and peak RSS (``ru_maxrss``), MiB."""
    import resource

    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        out["rss_mb"] = pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        out["rss_mb"] = float("nan")
    return out


def worker(args: argparse.Namespace) -> None:
    """One arm, in this process (rank of a torchrun job or a single process)."""
    import torch

    from rlvr.config import build_config
    from rlvr.distributed import DataParallel, init_distributed, shutdown
    from rlvr.distributed.setup import local_config, use_fsdp
    from rlvr.models import load_policy
    from rlvr.models.tiny import build_tiny_model
    from rlvr.tasks import build_task
    from rlvr.trainer.trainer import Trainer

    cfg = build_config(overrides=[
        "task.type=reasoning_gym", "task.name=chain_sum", f"num_generations={args.gens}",
        f"generation_batch_size={args.prompts * args.gens}", "beta=0", "per_device_train_batch_size=8",
        f"max_completion_length={args.max_new}", "max_prompt_length=256", "learning_rate=1e-6",
        f"max_steps={args.steps}", f"logging.output_dir={args.run_dir}", "logging.progress=false",
        "logging.tensorboard=false", "logging.log_completions_steps=0", "reward_timeout_s=0",
        f"distributed.num_threads={args.threads}", f"distributed.fsdp={'false' if args.replicated else 'auto'}",
        f"distributed.generation_weights={'gathered' if args.gathered else 'copy'}",
    ])
    env = init_distributed("cpu", num_threads=args.threads)
    local = local_config(cfg, env.world_size)
    model, tok = build_tiny_model(0) if args.model == "tiny" else load_policy(cfg.model)
    dp = DataParallel(env, fsdp=use_fsdp(cfg, env.world_size), pad_token_id=tok.pad_token_id) if env.distributed else None
    mem_loaded = _rss_mb()  # the full model loaded on this rank (every rank loads it before sharding)
    tr = Trainer(local, model, tok, build_task(cfg.task), dp=dp, run_config=cfg)
    mem_ready = _rss_mb()  # sharded (FSDP2), generation copy made, optimizer built (its state is lazy)
    rows: list[dict] = []
    tr.callbacks.append(lambda t, m: rows.append(dict(m)))
    tr.train()
    opt_state = [v for s in tr.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
    gen = getattr(tr.generation_sync, "target", None)
    mem_end = _rss_mb()
    mem = {
        "rank": env.rank,
        "rss_after_load_mb": mem_loaded["rss_mb"], "rss_after_setup_mb": mem_ready["rss_mb"],
        "rss_after_train_mb": mem_end["rss_mb"],
        "peak_rss_after_setup_mb": mem_ready["peak_rss_mb"], "peak_rss_mb": mem_end["peak_rss_mb"],
        "param_bytes": _bytes(p for p in tr.model.parameters()),
        "optimizer_state_bytes": _bytes(opt_state),
        "generation_copy_bytes": _bytes(gen.parameters()) if gen is not None else 0,
    }
    mems = dp.gather(mem) if dp is not None else [mem]
    if env.rank == 0:
        Path(args.result).write_text(json.dumps({
            "world_size": env.world_size, "threads_per_process": env.threads, "fsdp": bool(dp and dp.fsdp),
            "rows": rows, "memory_per_rank": mems,
        }))
    shutdown()


def gen_ab_worker(args: argparse.Namespace) -> None:
    """Arm ``gen_ab``: generation on the ``copy`` vs on the ``gathered`` FSDP2 module, side by side in one
    2-rank job — the same prompts and seeds (loader and round restored before each), alternated
    ``--reps`` times, so both see the same machine load. No training: the two hold identical weights."""
    from rlvr.config import build_config
    from rlvr.distributed import DataParallel, init_distributed, shutdown
    from rlvr.distributed.setup import local_config, use_fsdp
    from rlvr.models import load_policy
    from rlvr.models.tiny import build_tiny_model
    from rlvr.tasks import build_task
    from rlvr.trainer.trainer import Trainer

    cfg = build_config(overrides=[
        "task.type=reasoning_gym", "task.name=chain_sum", f"num_generations={args.gens}",
        f"generation_batch_size={args.prompts * args.gens}", "beta=0", f"max_completion_length={args.max_new}",
        "max_prompt_length=256", f"logging.output_dir={args.run_dir}", "logging.progress=false",
        "logging.tensorboard=false", "reward_timeout_s=0", f"distributed.num_threads={args.threads}",
    ])
    env = init_distributed("cpu", num_threads=args.threads)
    model, tok = build_tiny_model(0) if args.model == "tiny" else load_policy(cfg.model)
    dp = DataParallel(env, fsdp=use_fsdp(cfg, env.world_size), pad_token_id=tok.pad_token_id)
    tr = Trainer(local_config(cfg, env.world_size), model, tok, build_task(cfg.task), dp=dp, run_config=cfg)
    copy_model, sync = tr.engine.model, tr.generation_sync
    loader, rnd = tr.loader.state_dict(), tr.rollout_round
    out: dict[str, list] = {"copy": [], "gathered": []}
    for _ in range(args.reps):
        for mode in ("copy", "gathered"):
            tr.loader.load_state_dict(loader)
            tr.rollout_round, tr.generation_round = rnd, rnd
            gathered = mode == "gathered"
            tr.engine.model = tr.engine._decode_model = tr.model if gathered else copy_model
            tr._gather_for_generation, tr.generation_sync = gathered, None if gathered else sync
            batch, m = tr.generate_batch()
            tokens = dp.sum([float(batch.completion_mask.sum())])[0]
            secs = dp.max([m["timing/generate_s"]])[0]
            out[mode].append({"generate_s": secs, "tokens": tokens, "tokens_per_s": tokens / secs})
    if env.rank == 0:
        Path(args.result).write_text(json.dumps({"world_size": env.world_size, "threads_per_process": env.threads,
                                                 "reps": out, "rows": []}))
    shutdown()


def run_arm(name: str, args: argparse.Namespace, tmp: Path) -> dict:
    res = tmp / f"{name}.json"
    common = [str(Path(__file__).resolve()), "--worker", "--model", args.model, "--steps", str(args.steps),
              "--prompts", str(args.prompts), "--gens", str(args.gens), "--max-new", str(args.max_new),
              "--run-dir", str(tmp / name), "--result", str(res)]
    if name == "single":
        cmd = [sys.executable, *common, "--threads", "2"]
    elif name == "gen_ab":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *common,
               "--threads", "1", "--gen-ab", "--reps", str(args.reps)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *common,
               "--threads", "1", *(["--replicated"] if name == "replicated" else []),
               *(["--gathered"] if name == "fsdp2_gathered" else [])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")]))
    print(f"[{name}] {' '.join(cmd[:8])} ...", flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"arm {name} failed:\n{proc.stderr[-4000:]}")
    return json.loads(res.read_text())


def summarise(arm: dict) -> dict:
    if "reps" in arm:  # gen_ab: median generation rate per mode (first rep of each included: same warm-up state)
        return {f"{mode}_{k}": statistics.median(r[k] for r in reps) for mode, reps in arm["reps"].items()
                for k in ("generate_s", "tokens_per_s")}
    rows = arm["rows"][1:] or arm["rows"]
    med = {k: statistics.median(r.get(f"timing/{k}", 0.0) for r in rows) for k in PHASES}
    med["tokens_per_s"] = statistics.median(r["perf/tokens_per_s"] for r in rows)
    gen_rows = [r for r in rows if "perf/generated_tokens_per_s" in r]
    med["generated_tokens_per_s"] = statistics.median(r["perf/generated_tokens_per_s"] for r in gen_rows) if gen_rows else float("nan")
    med["peak_rss_mb"] = max(r["perf/peak_memory_mb"] for r in arm["rows"])
    return med


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default", choices=["default", "tiny"])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--gens", type=int, default=8)
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--arms", default="single,fsdp2,fsdp2_gathered,replicated")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--replicated", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--gathered", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--gen-ab", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--reps", type=int, default=3, help="gen_ab: alternations of copy and gathered generation")
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        gen_ab_worker(args) if args.gen_ab else worker(args)
        return
    import torch

    sys.path.insert(0, str(HERE))
    from machine import print_machine

    torch.set_num_threads(2)
    probe = print_machine()  # CPU capability and fp32/bf16 matmul rates (2 threads), as every benchmark prints
    result = {"settings": {k: v for k, v in vars(args).items() if k in ("model", "steps", "prompts", "gens", "max_new")},
              "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
                          **probe},
              "arms": {}}
    prev = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else None
    if prev and prev.get("settings") == result["settings"]:  # one arm per run (one lock hold each): keep the others
        result["arms"] = prev.get("arms", {})
    with tempfile.TemporaryDirectory() as d:
        for name in args.arms.split(","):
            load_before = os.getloadavg()
            arm = run_arm(name, args, Path(d))
            arm["median"] = summarise(arm)
            arm.pop("rows")
            # the machine is shared: the load average around the arm and the matmul rate just before it
            arm["load_avg_1_5_15_before"] = [round(x, 2) for x in load_before]
            arm["load_avg_1_5_15_after"] = [round(x, 2) for x in os.getloadavg()]
            arm["matmul_gflop_per_s"] = probe["matmul_gflop_per_s"]
            result["arms"][name] = arm
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"\n{'arm':<15}" + "".join(f"{k[:-2]:>12}" for k in PHASES) + f"{'tok/s':>8}{'gen tok/s':>10}"
          + f"{'load1':>7}")
    for name, arm in result["arms"].items():
        m = arm["median"]
        if name == "gen_ab":
            continue
        print(f"{name:<15}" + "".join(f"{m[k]:>12.2f}" for k in PHASES) + f"{m['tokens_per_s']:>8.1f}"
              + f"{m.get('generated_tokens_per_s', float('nan')):>10.1f}{arm.get('load_avg_1_5_15_before', [float('nan')])[0]:>7.2f}")
    print(f"\nper rank (MiB): {'arm':<15}{'rank':>5}{'RSS load':>10}{'RSS setup':>10}{'RSS end':>9}{'peak RSS':>9}"
          f"{'params':>8}{'optim':>7}{'gen copy':>9}")
    if "gen_ab" in result["arms"]:
        m = result["arms"]["gen_ab"]["median"]
        print(f"\ngen_ab (same prompts and seeds, alternated): copy {m['copy_tokens_per_s']:.1f} tok/s "
              f"({m['copy_generate_s']:.1f} s), gathered {m['gathered_tokens_per_s']:.1f} tok/s ({m['gathered_generate_s']:.1f} s)")
    for name, arm in result["arms"].items():
        for i, mem in enumerate(arm.get("memory_per_rank", [])):
            print(f"{'':16}{name:<15}{mem.get('rank', i):>5}{mem.get('rss_after_load_mb', float('nan')):>10.0f}"
                  f"{mem.get('rss_after_setup_mb', float('nan')):>10.0f}{mem.get('rss_after_train_mb', float('nan')):>9.0f}"
                  f"{mem.get('peak_rss_mb', float('nan')):>9.0f}{mem['param_bytes'] / 2**20:>8.0f}"
                  f"{mem['optimizer_state_bytes'] / 2**20:>7.0f}{mem['generation_copy_bytes'] / 2**20:>9.0f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

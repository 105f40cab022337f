"""vLLM under ``torchrun``: one shared server for all ranks against one server per rank (issue 15).

rlvr implements the shared server (docs/vllm.md, "Under torchrun"): every rank sends its own prompts to
one server, rank 0 alone pushes the weights (:class:`rlvr.engines.weight_sync.ServerWeightSync`), all
ranks meet at a barrier. This script measures it against the alternative, one server per rank (each rank
pushes to its own server: what a per-rank design would do), on the same total work, and checks that after
every push each rank's greedy generation equals transformers' greedy decode of the *updated* weights.

Setting (cheap on purpose, so it fits a shared 2-core CPU): the tiny llama of ``tests/vllm`` (random,
0.1 M parameters), ``--prompts`` random 32-token prompts × ``--samples`` samples × ``--max-new`` tokens in total
per round, split evenly across ranks, temperature 1, ``--rounds`` rounds; between rounds every rank
applies the same deterministic weight change (a stand-in for the optimizer step) and syncs. Arms:

* ``shared_w1``: 1 rank, 1 server (the reference);
* ``shared_w2``: ``torchrun --nproc_per_node 2``, both ranks on one server;
* ``per_rank_w2``: 2 ranks, each on its own server.

Per round: ``generate_s`` = the slowest rank's generation wall time (ranks start together after a
barrier), ``sync_s`` = the weight push including the barrier. Server start-up (one after the other) and the servers' resident memory (``/proc/PID/status`` VmRSS) are reported too.
The machine comes first (``benchmarks/machine.py``).

Run (needs ``make vllm-env``; ~3 minutes)::

    flock /tmp/rlvr-heavy.lock env HF_HUB_OFFLINE=1 PYTHONPATH=$PWD/src RLVR_VLLM_PYTHON=.venv-vllm/bin/python \\
        .venv/bin/python benchmarks/bench_vllm_torchrun.py --out benchmarks/results/bench_vllm_torchrun.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "bench_vllm_torchrun.json"
LOGS = Path("runs/bench_vllm_torchrun")
"""Server logs (kept after the run; the scratch folder with the weights is removed)."""
TINY = dict(hidden_size=128, num_heads=2, num_kv_heads=2, intermediate_size=256, initializer_range=0.5)
"""The model of tests/vllm/test_vllm_real.py."""


def _prompts(k: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1234)
    return [[1] + torch.randint(10, vocab, (31,), generator=g).tolist() for _ in range(k)]


def _perturb(model: torch.nn.Module, r: int) -> None:
    """The same weight change on every rank (round ``r``): a stand-in for an optimizer step."""
    g = torch.Generator().manual_seed(10_000 + r)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05 * p.detach().std())


def _greedy_reference(model: torch.nn.Module, ctx: list[int], steps: int) -> list[int]:
    ids = list(ctx)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(ctx):]


# ------------------------------------------------------------------------------------------ worker
def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    from rlvr.config import build_config
    from rlvr.engines.factory import build_engine
    from rlvr.engines.weight_sync import named_full_tensors
    from rlvr.models.tiny import build_tiny_model
    from rlvr.types import GenerationRequest, SamplingParams

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    urls = args.urls.split(",")
    url = urls[rank % len(urls)] if args.mode == "per_rank" else urls[0]
    model, tok = build_tiny_model(0, **TINY)
    cfg = build_config(overrides=["engine=vllm", f"vllm.url={url}", "vllm.dtype=float32",
                                  f"vllm.sync_dir={args.scratch}/sync_{args.mode}_w{world}_r{rank}"])
    engine = build_engine(cfg, model, tok, args.scratch)
    prompts = _prompts(args.prompts, model.config.vocab_size)
    mine = prompts[rank::world]
    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new)

    def push(version: int) -> None:
        if args.mode == "per_rank":  # every rank pushes to its own server
            engine.generation_sync.transport.push(dict(named_full_tensors(model)), engine.client)
            engine.generation_sync.version = version
            dist.barrier()
        else:
            engine.generation_sync.push(named_full_tensors(model), version)  # rank 0 pushes, then a barrier

    push(0)  # the servers may hold an earlier arm's weights: start every arm from the initial ones
    engine.generate([GenerationRequest(mine[0], 2)], SamplingParams(temperature=1.0, max_new_tokens=4))  # warm-up
    rounds = []
    for r in range(args.rounds):
        dist.barrier()
        t0 = time.perf_counter()
        out = engine.generate([GenerationRequest(p, args.samples) for p in mine], params)
        gen_s = time.perf_counter() - t0
        tokens = sum(len(g.token_ids) for gs in out for g in gs)
        _perturb(model, r)
        dist.barrier()
        t0 = time.perf_counter()
        push(r + 1)
        sync_s = time.perf_counter() - t0
        ctx = prompts[0][:8]
        got = engine.generate([GenerationRequest(ctx, 1)], SamplingParams(temperature=0.0, max_new_tokens=8))[0][0]
        ok = got.token_ids == _greedy_reference(model, ctx, len(got.token_ids))
        stats = torch.tensor([gen_s, sync_s, float(tokens), float(ok)])
        mx, sm, mn = stats.clone(), stats.clone(), stats.clone()
        dist.all_reduce(mx, op=dist.ReduceOp.MAX)
        dist.all_reduce(sm, op=dist.ReduceOp.SUM)
        dist.all_reduce(mn, op=dist.ReduceOp.MIN)
        rounds.append({"round": r, "generate_s": mx[0].item(), "sync_s": mx[1].item(), "tokens": int(sm[2].item()),
                       "tok_per_s": sm[2].item() / mx[0].item(), "all_ranks_greedy_match_new_weights": bool(mn[3].item())})
    engine.close()
    if rank == 0:
        Path(args.result).write_text(json.dumps({"mode": args.mode, "world": world, "rounds": rounds}))
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------------ parent
def _rss_mib(pid: int) -> float | None:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="shared", help=argparse.SUPPRESS)
    p.add_argument("--urls", help=argparse.SUPPRESS)
    p.add_argument("--scratch", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--prompts", type=int, default=16, help="prompts per round, all ranks together")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--arms", default="shared_w1,shared_w2,per_rank_w2")
    p.add_argument("--vllm-python", default=os.environ.get("RLVR_VLLM_PYTHON", ".venv-vllm/bin/python"))
    p.add_argument("--server-urls", help="use these running servers (comma-separated; the second for per_rank) "
                   "instead of starting them; they must serve the tiny model written by this script's seed")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0

    from machine import print_machine
    from rlvr.engines.factory import write_served_policy
    from rlvr.engines.vllm_server import VLLMServer
    from rlvr.models.tiny import build_tiny_model

    machine = print_machine()
    arms = args.arms.split(",")
    scratch = Path(tempfile.mkdtemp(prefix="rlvr-bench-torchrun-"))
    model, tok = build_tiny_model(0, **TINY)
    folder = write_served_policy(model, tok, scratch / "policy", torch.float32)
    n_servers = 2 if any(a.startswith("per_rank") for a in arms) else 1
    servers = [] if args.server_urls else [VLLMServer(args.vllm_python, folder, args=["--dtype", "float32", "--enforce-eager", "--max-model-len", "512",
                                                          "--seed", "0"],
                          env={"VLLM_CPU_KVCACHE_SPACE": "1"}, log_path=LOGS / f"server{i}.log",
                          startup_timeout_s=600) for i in range(n_servers)]
    result = {"machine": machine, "settings": {k: v for k, v in vars(args).items() if k not in ("worker", "mode", "urls",
                                                                                          "scratch", "result")},
              "model": {"parameters": sum(p.numel() for p in model.parameters()), **TINY}, "arms": {}}
    try:
        if servers:
            starts = []
            for s in servers:  # one after the other: two vLLM start-ups at once on 2 cores failed once
                t0 = time.perf_counter()
                s.start()  # raises VLLMServerError with the log's tail if it does not come up
                starts.append(round(time.perf_counter() - t0, 1))
            result["server_start_s"] = starts
            print(f"{n_servers} server(s) up in {starts} s (logs: {LOGS})", flush=True)
            result["server_rss_mib"] = [_rss_mib(s.proc.pid) for s in servers]
        urls = args.server_urls.split(",") if args.server_urls else [s.url for s in servers]
        for arm in arms:
            mode, w = arm.rsplit("_w", 1)
            res = scratch / f"{arm}.json"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={w}", __file__,
                   "--worker", f"--mode={mode}", f"--urls={','.join(urls)}", f"--scratch={scratch}",
                   f"--result={res}", f"--prompts={args.prompts}", f"--samples={args.samples}", f"--max-new={args.max_new}",
                   f"--rounds={args.rounds}"]
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            r = json.loads(res.read_text())
            r["wall_s_incl_launch"] = round(time.perf_counter() - t0, 1)
            r["load1_before"] = round(load, 2)
            r["median_generate_s"] = statistics.median(x["generate_s"] for x in r["rounds"])
            r["median_sync_s"] = statistics.median(x["sync_s"] for x in r["rounds"])
            r["median_tok_per_s"] = statistics.median(x["tok_per_s"] for x in r["rounds"])
            r["greedy_match_every_round"] = all(x["all_ranks_greedy_match_new_weights"] for x in r["rounds"])
            result["arms"][arm] = r
            print(f"{arm}: generate {r['median_generate_s']:.2f} s ({r['median_tok_per_s']:.0f} tok/s), sync "
                  f"{r['median_sync_s']:.3f} s, greedy = new weights on every rank: {r['greedy_match_every_round']}",
                  flush=True)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(result, indent=2))
    finally:
        for s in servers:
            s.close()
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\n{'arm':14} {'generate s':>10} {'tok/s':>7} {'sync s':>7} {'greedy ok':>9}")
    for arm, r in result["arms"].items():
        print(f"{arm:14} {r['median_generate_s']:10.2f} {r['median_tok_per_s']:7.0f} {r['median_sync_s']:7.3f} "
              f"{str(r['greedy_match_every_round']):>9}")
    print(f"server RSS MiB: {result.get('server_rss_mib')}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

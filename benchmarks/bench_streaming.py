"""Wall clock per update: synchronous rounds vs round overlap (``max_async_level=1``) vs streaming rollouts
(``streaming.enable``), at equal updates, with the staleness each arm trained on (``docs/streaming.md``).

Every arm trains the tiny in-process model (``rlvr.models.tiny``, fp32) on the toy task for ``--updates``
optimizer updates from the same seed. Round overlap needs a server engine, so the ``vllm-*`` arms run on the
tests' fake vLLM server (``tests/fake_vllm_server.py``: an HTTP server in this process that decodes with an
``HFEngine`` on its own copy of the weights and reloads them from the safetensors file rlvr writes): it is
the same protocol and weight sync as a real server, not vLLM's speed. The ``hf-*`` arms use the default
in-process engine. Per arm: seconds per update (the wall clock from the end of update 1 to the end of the
last, over ``updates − 1``: the first update carries the start-up), the staleness histogram (rows by
``global_step − policy_version`` at their update), and for streaming the mean engine / trainer idle fractions.

Run (heavy: take the shared lock; ≈ 3 minutes on a 2-core CPU)::

    flock /tmp/rlvr-heavy.lock env HF_HUB_OFFLINE=1 PYTHONPATH=$PWD/src python benchmarks/bench_streaming.py

Writes ``--out`` (default ``benchmarks/results/bench_streaming.json``) and prints a Markdown table. Timings
are noisy on a shared machine; they are never test assertions.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the fake vLLM server

ARMS = {
    "hf-sync": [],
    "hf-streaming-k1-c1": ["streaming.enable=true", "streaming.max_staleness=1", "streaming.chunk_prompts=1"],
    "hf-streaming-k2-c1": ["streaming.enable=true", "streaming.max_staleness=2", "streaming.chunk_prompts=1"],
    "hf-streaming-k1": ["streaming.enable=true", "streaming.max_staleness=1"],  # chunk = a whole batch
    "hf-streaming-k1-partial": ["streaming.enable=true", "streaming.max_staleness=1", "streaming.partial_rollouts=true"],
    "vllm-sync": ["@vllm"],
    "vllm-overlap-1": ["@vllm", "max_async_level=1"],
    "vllm-streaming-k1": ["@vllm", "streaming.enable=true", "streaming.max_staleness=1"],
}


def run_arm(name: str, extra: list[str], args: argparse.Namespace, root: Path) -> dict:
    """Train one arm; returns its record (seconds per update, staleness histogram, idle fractions)."""
    from fake_vllm_server import FakeVLLM

    from rlvr.testing import ToyTask, small_config
    from rlvr.models.tiny import build_tiny_model
    from rlvr.trainer.trainer import Trainer

    policy, tok = build_tiny_model(0)
    geo = [f"max_steps={args.updates}", "model.dtype=fp32", f"num_generations={args.group}",
           f"generation_batch_size={args.group * args.prompts}", f"max_completion_length={args.tokens}",
           "per_device_train_batch_size=8", "logging.log_completions_steps=0"]
    use_vllm = "@vllm" in extra
    extra = [e for e in extra if e != "@vllm"]
    out = root / name
    with FakeVLLM(copy.deepcopy(policy), tok) if use_vllm else _null() as fake:
        server = [f"engine=vllm", f"vllm.url={fake.url}", f"vllm.sync_dir={out / 'sync'}"] if use_vllm else []
        cfg = small_config(out, *geo, *server, *extra)
        tr = Trainer(cfg, policy, tok, ToyTask())
        ends: list[float] = []
        stale: Counter = Counter()
        idle = {"engine": [], "trainer": []}
        extra_m: dict[str, list[float]] = {}
        keep = ("streaming/update_wait_s", "streaming/partial/spanned_frac", "streaming/staleness/token_mean")
        orig_update = tr._update

        def update(ob):
            for s in (tr.global_step - ob.batch.policy_version).tolist():
                stale[int(s)] += 1
            return orig_update(ob)

        def after(t, m):
            ends.append(time.perf_counter())
            if "streaming/engine_idle_frac" in m and t.global_step > 1:
                idle["engine"].append(m["streaming/engine_idle_frac"])
                idle["trainer"].append(m["streaming/trainer_idle_frac"])
                for k in keep:
                    if k in m:
                        extra_m.setdefault(k, []).append(m[k])

        tr._update = update
        tr.callbacks.append(after)
        t0 = time.perf_counter()
        tr.train()
        tr.close()
    n = sum(stale.values())
    rec = {
        "arm": name, "overrides": extra + server[:1], "updates": args.updates,
        "s_per_update": (ends[-1] - ends[0]) / max(len(ends) - 1, 1), "total_s": ends[-1] - t0,
        "staleness_hist": {str(k): v / n for k, v in sorted(stale.items())},
        "staleness_mean": sum(k * v for k, v in stale.items()) / n,
    }
    if idle["engine"]:
        rec["engine_idle_frac"] = statistics.mean(idle["engine"])
        rec["trainer_idle_frac"] = statistics.mean(idle["trainer"])
    for k, v in extra_m.items():  # update waits; partial rollouts: rows spanning a change, token staleness
        rec[k] = statistics.mean(v)
    return rec


class _null:
    url = ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(argv: list[str] | None = None) -> int:
    """Run the arms (``--arms``), print the table, write the JSON; returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per generation batch")
    ap.add_argument("--group", type=int, default=4, help="num_generations")
    ap.add_argument("--tokens", type=int, default=48, help="max_completion_length")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_streaming.json"))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).parent))
    from machine import print_machine  # noqa: E402

    header = print_machine()
    recs = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.arms.split(","):
            recs.append(run_arm(name, ARMS[name], args, Path(tmp)))
            r = recs[-1]
            print(f"{name}: {r['s_per_update']:.3f} s/update, staleness {r['staleness_hist']}", flush=True)
    base = {r["arm"].split("-")[0]: r["s_per_update"] for r in recs if r["arm"].endswith("-sync")}
    print("\n| arm | s / update | vs sync (same engine) | staleness histogram (rows) | mean | engine idle | trainer idle |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for r in recs:
        b = base.get(r["arm"].split("-")[0])
        rel = f"{r['s_per_update'] / b:.2f}×" if b else ""
        hist = ", ".join(f"{k}: {v:.2f}" for k, v in r["staleness_hist"].items())
        ei = f"{r['engine_idle_frac']:.2f}" if "engine_idle_frac" in r else ""
        ti = f"{r['trainer_idle_frac']:.2f}" if "trainer_idle_frac" in r else ""
        print(f"| {r['arm']} | {r['s_per_update']:.3f} | {rel} | {hist} | {r['staleness_mean']:.2f} | {ei} | {ti} |")
    print("\n| arm | update wait (s / batch) | rows spanning a weight change | token staleness mean |")
    print("|---|---:|---:|---:|")
    for r in recs:
        if "streaming/update_wait_s" in r:
            sf, tm = r.get("streaming/partial/spanned_frac"), r.get("streaming/staleness/token_mean")
            print(f"| {r['arm']} | {r['streaming/update_wait_s']:.3f} | {'' if sf is None else f'{sf:.2f}'} | "
                  f"{'' if tm is None else f'{tm:.2f}'} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": header, "args": vars(args), "arms": recs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

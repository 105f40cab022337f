"""One AdamW step over the default model's parameters: torch's default loop, foreach, and fused kernels.

    HF_HUB_OFFLINE=1 python benchmarks/bench_optimizer.py --out benchmarks/results/bench_optimizer.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct) or 'tiny'")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="benchmarks/results/bench_optimizer.json")
    a = p.parse_args(argv)
    from rlvr.config import ModelConfig
    from rlvr.models import load_policy
    from rlvr.models.tiny import build_tiny_model

    model = build_tiny_model(0)[0] if a.model == "tiny" else load_policy(ModelConfig(name_or_path=a.model))[0]
    params = [q for q in model.float().parameters() if q.requires_grad]
    for q in params:
        q.grad = torch.randn_like(q) * 1e-3
    res = {"model": a.model, "params": sum(q.numel() for q in params), "threads": torch.get_num_threads(), "step_s": {}}
    print("| AdamW | median step s |\n|---|---|")
    for name, kw in (("default", {}), ("foreach", {"foreach": True}), ("fused", {"fused": True})):
        opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.01, **kw)
        opt.step()  # state allocation
        times = []
        for _ in range(a.repeats):
            t = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t)
        res["step_s"][name] = round(statistics.median(times), 4)
        print(f"| {name} | {res['step_s'][name]} |", flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

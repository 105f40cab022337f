"""What ``model.dtype=bf16-master`` adds to ``bf16-pure``'s update, timed on any CPU (no bf16 matmul involved).

``bf16-master`` (:mod:`rlvr.trainer.master_weights`) runs ``bf16-pure``'s forward and backward exactly (the same
bf16 weights, no autocast: ``tests/precision/test_master_weights.py`` counts no weight cast per micro-batch) and
adds two memory-bound pieces, neither of which uses a bf16 matmul, so their cost on this CPU is their cost on a
CPU with native bf16 up to memory bandwidth:

* **per micro-batch**, the gradient hook: every bf16 weight gradient added into its fp32 master's ``.grad``
  (the first micro-batch of a step converts instead of adding);
* **per optimizer step**, the fused AdamW step on the fp32 masters plus the rounding of the masters into the
  bf16 weights (``torch._foreach_copy_``), against the fp32 arm's fused AdamW step on fp32 weights and
  ``bf16-pure``'s on bf16 weights.

All arms are timed interleaved (rotating order, ``--reps`` rounds, medians) on the model's real parameter
shapes. With ``--update-json`` (a ``bench_update_dtype.py`` result from a native-bf16 CPU) the script adds the
estimate this machine can give of ``bf16-master``'s update there: ``bf16-pure``'s measured update plus these
pieces, each micro-batch's hook once (labelled an estimate: two machines' numbers combined; an upper bound,
since ``bf16-pure``'s own backward already spends part of that time adding its bf16 gradients).

    flock /tmp/rlvr-heavy.lock env HF_HUB_OFFLINE=1 PYTHONPATH=$PWD/src .venv/bin/python \\
        benchmarks/bench_master_weights.py --model default \\
        --update-json benchmarks/results/bench_update_dtype.json --out benchmarks/results/bench_master_weights.json

Prints the machine (CPU flags, measured fp32/bf16 matmul rates) first; writes ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--update-json", default=None, help="a bench_update_dtype.py result to estimate from")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    from machine import print_machine, write_result

    from rlvr.config import ModelConfig
    from rlvr.models import load_policy
    from rlvr.trainer.master_weights import MasterWeightAdamW, accumulate_gradient

    machine = print_machine()
    model, _ = load_policy(ModelConfig(name_or_path=a.model, dtype="fp32"))
    fp32 = [q for q in model.parameters() if q.requires_grad]
    pure = [torch.nn.Parameter(q.detach().bfloat16()) for q in fp32]
    master = [torch.nn.Parameter(q.detach().bfloat16()) for q in fp32]
    n_params = sum(q.numel() for q in fp32)
    opt = {"fp32": torch.optim.AdamW(fp32, lr=1e-6, fused=True),
           "bf16-pure": torch.optim.AdamW(pure, lr=1e-6, fused=True),
           "bf16-master": MasterWeightAdamW(master, lr=1e-6, fused=True)}
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(q.shape, generator=g).mul_(1e-3).bfloat16() for q in fp32]
    for q in fp32:
        q.grad = torch.full_like(q, 1e-3)
    for q in pure:
        q.grad = torch.full_like(q, 1e-3)
    masters = opt["bf16-master"].master_params

    def accumulate(first: bool) -> None:  # what the post-accumulate-grad hooks do after one backward
        if first:
            for m in masters:
                m.grad = None
        for q, m, gr in zip(master, masters, grads):
            q.grad = gr  # the bf16 gradient autograd leaves on the weight
            accumulate_gradient(q, m)

    steps = {arm: [] for arm in opt}
    hook_first, hook_add = [], []
    accumulate(True)
    for r in range(a.reps + 1):  # first round: warm-up, untimed
        order = list(opt)[r % 3:] + list(opt)[: r % 3]
        times = {arm: _timed(opt[arm].step) for arm in order}
        t_first = _timed(lambda: accumulate(True))
        t_add = _timed(lambda: accumulate(False))
        if r:
            for arm, t in times.items():
                steps[arm].append(t)
            hook_first.append(t_first)
            hook_add.append(t_add)
    med = {arm: statistics.median(v) for arm, v in steps.items()}
    res = {"machine": machine, "args": vars(a), "params": n_params,
           "optimizer_step_s": med, "hook_first_micro_batch_s": statistics.median(hook_first),
           "hook_later_micro_batch_s": statistics.median(hook_add)}
    print(f"\n{n_params / 1e6:.1f} M parameters, medians of {a.reps} interleaved rounds")
    print("| piece | s |")
    print("|---|---:|")
    for arm, t in med.items():
        print(f"| optimizer step, {arm} | {t:.3f} |")
    print(f"| bf16-master hook, first micro-batch of a step (convert) | {res['hook_first_micro_batch_s']:.3f} |")
    print(f"| bf16-master hook, later micro-batches (add) | {res['hook_later_micro_batch_s']:.3f} |")
    if a.update_json:
        upd = json.loads(Path(a.update_json).read_text())
        arms, n_micro = upd["arms"], int(upd["micro_batches"])
        extra = res["hook_first_micro_batch_s"] + (n_micro - 1) * res["hook_later_micro_batch_s"]
        est = arms["bf16-pure"]["update_s"] + extra
        fp32_s = arms["fp32"]["update_s"]
        res["estimate"] = {
            "source": a.update_json, "source_cpu": upd["machine"]["cpu"]["model"],
            "source_bf16_flags": upd["machine"]["cpu"].get("bf16_flags"), "micro_batches": n_micro,
            "bf16_pure_update_s": arms["bf16-pure"]["update_s"], "hooks_s": extra,
            "bf16_master_update_s": est, "fp32_update_s": fp32_s, "bf16_master_speedup_vs_fp32": fp32_s / est,
            "bf16_speedup_vs_fp32": arms["bf16"]["speedup_vs_fp32"],
            "note": "estimate (upper bound): bf16-pure's update measured on the source CPU + this machine's hook time",
        }
        print(f"\nestimate on {res['estimate']['source_cpu']} ({a.update_json}): bf16-pure update "
              f"{arms['bf16-pure']['update_s']:.1f} s + hooks {extra:.2f} s ({n_micro} micro-batches) = "
              f"{est:.1f} s -> bf16-master {fp32_s / est:.2f}x fp32 (bf16 autocast measured "
              f"{arms['bf16']['speedup_vs_fp32']:.2f}x)")
    write_result(a.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

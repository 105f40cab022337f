"""Where the training update's time goes, per op kind, in fp32 and in bf16 (issue 39 item 1).

One process, one model, one synthetic GRPO batch (:func:`bench_update_dtype.synthetic_batch`, the shape of
``bench_step.py``'s round). Each precision arm runs the trainer's own update work per micro-batch
(:func:`bench_update_dtype.update_once`: completion log-probs with entropy, then the backward of a
policy-gradient loss) under ``torch.profiler``; every ATen op's **self** CPU time is summed into a kind
(:func:`op_kind`): matmul, attention forward, attention backward, log-softmax / log-sum-exp (the LM head's
chunked log-probs and entropy), norms, casts and copies, elementwise, reductions and indexing, other. The arms
alternate micro-batch by micro-batch (one profile per arm and micro-batch, summed) so both see the same
machine load; on a loaded 2-core machine even one elementwise op on 2 threads can wait a scheduler quantum,
so run it on an otherwise idle machine (the load average is printed). The profiler's own overhead is in
every row alike; the table's "wall s" is the unprofiled update of the same micro-batches, timed separately.

    flock /tmp/rlvr-heavy.lock env HF_HUB_OFFLINE=1 PYTHONPATH=$PWD/src .venv/bin/python \\
        benchmarks/update_op_account.py --model default --out benchmarks/results/update_op_account.json

Prints the machine (CPU flags, measured matmul rates) first; writes ``--out`` (JSON). ``--model tiny`` is a
seconds-long smoke run. Timings are for finding costs, never test assertions.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

KINDS = ("matmul", "attention fwd", "attention bwd", "log-softmax / lse", "norm", "cast / copy", "elementwise",
         "reduce / index", "other")

_MATMUL = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "mv", "dot", "addmv")
_CAST = ("to", "_to_copy", "copy_", "clone", "contiguous", "empty_like", "zeros_like", "ones_like", "fill_", "zero_")
_SOFTMAX = ("log_softmax", "_log_softmax", "logsumexp", "softmax", "_softmax", "_log_softmax_backward_data",
            "_softmax_backward_data")
_REDUCE = ("sum", "mean", "max", "amax", "min", "gather", "scatter", "index", "index_select", "select_backward",
           "gather_backward", "scatter_add_", "masked_fill", "where", "cat", "stack", "embedding",
           "embedding_dense_backward", "embedding_backward", "nonzero", "cumsum", "sort", "topk")
_NORM = ("rms_norm", "_fused_rms_norm", "_fused_rms_norm_backward", "layer_norm", "native_layer_norm",
         "native_layer_norm_backward", "rsqrt")
_ELEMENT = ("mul", "add", "sub", "div", "neg", "exp", "log", "pow", "silu", "silu_backward", "sigmoid", "tanh",
            "mul_", "add_", "sub_", "div_", "addcmul_", "addcdiv_", "sqrt", "clamp", "clamp_min", "reciprocal",
            "cos", "sin", "rsub", "exp_", "lerp_", "threshold_backward", "gelu", "gelu_backward", "abs", "sign",
            "maximum", "minimum", "ne", "eq", "lt", "gt", "le", "ge", "logical_and", "logical_not", "bitwise_and")


def op_kind(name: str) -> str:
    """The kind (one of :data:`KINDS`) of an ATen op named ``name`` (``aten::mm``), or ``other``.

    Attention is every op whose name contains ``scaled_dot_product`` or ``flash_attention`` (its backward by
    ``backward`` in the name); the rest by the base name. Interpretation: an op's self time only, so a
    composite op (``aten::linear``) costs its own dispatch and its children count where they run.
    """
    base = name.split("::", 1)[-1]
    if "scaled_dot_product" in base or "flash_attention" in base or "_efficient_attention" in base:
        return "attention bwd" if "backward" in base else "attention fwd"
    if base in _MATMUL:
        return "matmul"
    if base in _SOFTMAX:
        return "log-softmax / lse"
    if base in _NORM:
        return "norm"
    if base in _CAST:
        return "cast / copy"
    if base in _ELEMENT or base.rstrip("_") in _ELEMENT:
        return "elementwise"
    if base in _REDUCE or base.rstrip("_") in _REDUCE:
        return "reduce / index"
    return "other"


LABELS = ("rlvr::lm_head_fwd", "rlvr::lm_head_bwd")
"""The profiler ranges of :mod:`rlvr.core.logprobs`' chunked LM head, reported inclusive beside the kinds."""


def account(prof, top: int | None = 15) -> tuple[dict[str, float], list[tuple[str, float, int]]]:
    """``({kind or label: CPU seconds}, [(op, self seconds, calls)] of the ``top`` costliest ops, all when None)``
    of a profile:
    each kind sums its ops' self time; each of :data:`LABELS` is the inclusive time of its range (its ops are
    also in their kinds)."""
    kinds: dict[str, float] = defaultdict(float)
    ops = []
    for ev in prof.key_averages():
        if ev.key in LABELS:
            kinds[ev.key] += ev.cpu_time_total / 1e6
        if not ev.key.startswith("aten::"):
            continue
        s = ev.self_cpu_time_total / 1e6
        kinds[op_kind(ev.key)] += s
        ops.append((ev.key, s, ev.count))
    ops.sort(key=lambda o: -o[1])
    return {k: kinds.get(k, 0.0) for k in KINDS + LABELS}, ops[:top] if top else ops


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--arms", default="fp32,bf16-master",
                   help="comma-separated model.dtype arms; a '+attn32' suffix adds model.attention_fp32 "
                        "(e.g. bf16-master+attn32)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--gens", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-new", type=int, default=128)
    p.add_argument("--rows-per-micro", type=int, default=8)
    p.add_argument("--micro", type=int, default=4, help="micro-batches profiled per arm (after one warm-up)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    from bench_update_dtype import split_arm, synthetic_batch, trained_tokens, update_once
    from machine import print_machine, write_result

    from rlvr.config import ModelConfig
    from rlvr.models import load_policy
    from rlvr.models.attention import use_fp32_attention
    from rlvr.precision import resolve_precision, set_model_precision
    from rlvr.trainer.forward import micro_batches

    machine = print_machine()
    arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    base, tok = load_policy(ModelConfig(name_or_path=a.model, dtype="fp32"))
    base.train()
    try:
        split = {arm: split_arm(arm) for arm in arms}
    except ValueError as exc:
        p.error(f"--arms: {exc}")
    policies = {arm: resolve_precision(dtype, "cpu") for arm, (dtype, _) in split.items()}
    models = {}
    for arm, (_, attn32) in split.items():
        fp32_weights = policies[arm].param_dtype == torch.float32
        m = base if fp32_weights and not attn32 else copy.deepcopy(base).to(policies[arm].param_dtype)
        if attn32:
            use_fp32_attention(m)
        set_model_precision(m, policies[arm])
        models[arm] = m
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    batch = synthetic_batch(len(tok), a.prompts, a.gens, a.prompt_len, a.max_new, a.seed)
    groups = micro_batches(batch, a.rows_per_micro)[: a.micro + 1]
    n_params = sum(q.numel() for q in base.parameters())

    def run(arm, micro):
        set_model_precision(models[arm], policies[arm])
        return update_once(models[arm], micro, pad)

    for arm in arms:  # warm-up
        run(arm, batch.select(groups[0]))
    wall = {arm: 0.0 for arm in arms}
    tokens = 0
    for j, rows in enumerate(groups[1:]):  # unprofiled wall clock, arms alternating
        micro = batch.select(rows)
        tokens += trained_tokens(micro)
        for arm in arms[j % len(arms):] + arms[: j % len(arms)]:
            f, b, _ = run(arm, micro)
            wall[arm] += f + b
    sums: dict[str, dict[str, float]] = {arm: defaultdict(float) for arm in arms}
    tops: dict[str, dict[str, list[float]]] = {arm: defaultdict(lambda: [0.0, 0]) for arm in arms}
    for j, rows in enumerate(groups[1:]):  # profiled, one micro-batch at a time, arms alternating like the wall
        micro = batch.select(rows)
        for arm in arms[j % len(arms):] + arms[: j % len(arms)]:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                run(arm, micro)
            kinds, ops = account(prof, top=None)
            for k, v in kinds.items():
                sums[arm][k] += v
            for name, sec, calls in ops:
                tops[arm][name][0] += sec
                tops[arm][name][1] += calls
    profs = {arm: ({k: sums[arm].get(k, 0.0) for k in KINDS + LABELS},
                   sorted(((n, v[0], v[1]) for n, v in tops[arm].items()), key=lambda o: -o[1])[:15])
             for arm in arms}
    flops = 6 * n_params * tokens
    res = {"machine": machine, "args": vars(a), "params": n_params, "trained_tokens": tokens,
           "threads": torch.get_num_threads(), "arms": {}}
    print(f"\nupdate of {len(groups) - 1} micro-batches ({tokens} tokens, {n_params / 1e6:.1f} M parameters), "
          f"self CPU seconds per op kind under torch.profiler (share of the arm's profiled total)")
    head = "| kind | " + " | ".join(arms) + " |"
    print(head)
    print("|---|" + "---:|" * len(arms))
    tot = {arm: sum(profs[arm][0][k] for k in KINDS) for arm in arms}
    for k in KINDS:
        cells = [f"{profs[arm][0][k]:.2f} ({100 * profs[arm][0][k] / tot[arm]:.0f} %)" for arm in arms]
        print(f"| {k} | " + " | ".join(cells) + " |")
    for k in LABELS:
        cells = [f"{profs[arm][0][k]:.2f} ({100 * profs[arm][0][k] / tot[arm]:.0f} %)" for arm in arms]
        print(f"| of which `{k}` (inclusive) | " + " | ".join(cells) + " |")
    print("| **profiled total** | " + " | ".join(f"{tot[arm]:.2f}" for arm in arms) + " |")
    print("| unprofiled wall s | " + " | ".join(f"{wall[arm]:.2f}" for arm in arms) + " |")
    print("| training GFLOP/s (6·P·tokens / wall) | " + " | ".join(f"{flops / wall[arm] / 1e9:.1f}" for arm in arms)
          + " |")
    for arm in arms:
        print(f"\n{arm}: costliest ops (self s, calls)")
        for name, s, n in profs[arm][1]:
            print(f"  {name:48s} {s:7.3f}  {n:6d}  [{op_kind(name)}]")
        res["arms"][arm] = {"kinds_s": profs[arm][0], "profiled_total_s": tot[arm], "wall_s": wall[arm],
                            "training_gflops": flops / wall[arm] / 1e9,
                            "top_ops": [{"op": n, "self_s": s, "calls": c} for n, s, c in profs[arm][1]]}
    res["end_utc"] = time.strftime("%H:%M:%S", time.gmtime())
    write_result(a.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

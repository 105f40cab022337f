"""Paired fp32 / bf16 / bf16-pure / bf16-master timing of the training update (issue 28's "bf16 update ≥ 2× fp32").

One process, one model, one batch: each micro-batch runs the trainer's own update work
(:func:`rlvr.trainer.forward.completion_logprobs` with entropy, then the backward of a policy-gradient loss)
under every precision arm in turn, the arm order rotating from one micro-batch to the next, so all arms see the
same machine load (on a shared machine a paired comparison is the only fair one). Each arm's largest
log-prob difference from the fp32 arm is reported beside its time (bf16 rounding, ~1e-2 nats). Arms:

* ``fp32``: fp32 weights, no autocast;
* ``bf16``: fp32 master weights, the forward and backward under bf16 autocast (``model.dtype=bf16``);
* ``bf16-pure``: a bf16 copy of the weights, no autocast (``model.dtype=bf16-pure``);
* ``bf16-master``: another bf16 copy with fp32 masters in a
  :class:`rlvr.trainer.master_weights.MasterWeightAdamW` (``model.dtype=bf16-master``): ``bf16-pure``'s forward
  and backward, plus each backward's gradients added into the masters' fp32 ``.grad`` (the hook, timed inside
  the backward).
* ``bf16-master+attn32``: ``bf16-master`` with ``model.attention_fp32`` (attention and its backward in float32,
  :mod:`rlvr.models.attention`; issue 39's first lever against the CPU flash-attention backward's bf16 cost).

After the micro-batches, one optimizer step per arm is timed (the fused AdamW of the trainer; ``bf16`` steps the
same fp32 weights as ``fp32``; ``bf16-master`` steps the fp32 masters and rounds them into the bf16 weights),
the median of ``--steps`` steps, and reported beside the update.

The batch is synthetic and shaped like ``bench_step.py``'s GRPO round (``--prompts`` groups of ``--gens`` rows
sharing a ``--prompt-len``-token prompt, completion lengths uniform in ``[--max-new/4, --max-new]``, random
tokens and advantages; the seed fixes it), so no generation is needed. Training GFLOP/s counts
``6 · P · tokens`` (P = every parameter, the tied LM head once; tokens = each group's prompt once plus the
completions: the tokens the shared-prompt forward runs), the convention of ``bench_step.py``.

    flock /tmp/rlvr-heavy.lock env HF_HUB_OFFLINE=1 PYTHONPATH=$PWD/src .venv/bin/python \\
        benchmarks/bench_update_dtype.py --model default --out benchmarks/results/bench_update_dtype.json

Prints the machine (CPU flags, measured fp32/bf16 matmul rates) first; writes ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

ARMS = ("fp32", "bf16", "bf16-pure", "bf16-master", "bf16-master+attn32")
SUFFIXES = ("attn32",)  # ``<model.dtype>+attn32``: the arm also sets ``model.attention_fp32``


def split_arm(arm: str) -> tuple[str, bool]:
    """``"bf16-master+attn32"`` → ``("bf16-master", True)``: the arm's ``model.dtype`` and whether it runs
    attention in float32. Raises ValueError for a suffix other than :data:`SUFFIXES`."""
    dtype, _, extra = arm.partition("+")
    if extra and extra not in SUFFIXES:
        raise ValueError(f"arm {arm!r}: unknown suffix +{extra} (known: {', '.join('+' + x for x in SUFFIXES)})")
    return dtype, bool(extra)


def synthetic_batch(vocab: int, prompts: int, gens: int, prompt_len: int, max_new: int, seed: int):
    """A GRPO-shaped :class:`rlvr.types.RolloutBatch` of random tokens: ``prompts × gens`` rows, each group
    sharing one ``prompt_len``-token context, completion lengths uniform in ``[max_new // 4, max_new]``
    (right-padded to ``max_new``), advantages ``N(0, 1)``."""
    from rlvr.types import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    n = prompts * gens
    ctx = [torch.randint(3, vocab, (prompt_len,), generator=g).tolist() for _ in range(prompts)]
    lens = torch.randint(max(1, max_new // 4), max_new + 1, (n,), generator=g)
    comp = torch.randint(3, vocab, (n, max_new), generator=g)
    mask = (torch.arange(max_new)[None, :] < lens[:, None]).float()
    group = torch.arange(prompts).repeat_interleave(gens)
    return RolloutBatch(
        context_ids=[ctx[int(i)] for i in group], completion_ids=comp * mask.long(), completion_mask=mask,
        group_id=group, prompt_index=group.clone(), is_truncated=torch.zeros(n, dtype=torch.bool),
        sampling_temperature=torch.ones(n), logprob_temperature=torch.ones(n),
        policy_version=torch.zeros(n, dtype=torch.long), advantages=torch.randn(n, generator=g),
    )


def update_once(model, micro, pad: int) -> tuple[float, float, torch.Tensor]:
    """Seconds of the forward (log-probs + entropy) and of the backward of ``-Σ A·log p`` for one micro-batch,
    and its completion log-probs ``[n, T]`` (float32, detached)."""
    from rlvr.trainer.forward import completion_logprobs

    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    lp, _ = completion_logprobs(model, micro, pad_token_id=pad, with_entropy=True)
    t1 = time.perf_counter()
    (-(lp * micro.advantages[:, None] * micro.completion_mask).sum()).backward()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, lp.detach().float()


def optimizer_step_seconds(model, optimizer, steps: int) -> float:
    """Median seconds of ``steps`` optimizer steps on ``model``'s current gradients (a unit gradient where a
    parameter has none, e.g. ``bf16-master``'s bf16 weights, whose gradients live in the masters)."""
    holders = getattr(optimizer, "master_params", None) or [q for q in model.parameters() if q.requires_grad]
    for q in holders:
        if q.grad is None:
            q.grad = torch.ones_like(q)
    times = []
    for _ in range(max(1, steps)):
        t0 = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def trained_tokens(micro) -> int:
    """Tokens the shared-prompt forward runs for ``micro``: each distinct context once plus the completions."""
    ctx = {tuple(c) for c in micro.context_ids}
    return sum(len(c) for c in ctx) + int(micro.completion_mask.sum())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--gens", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-new", type=int, default=128)
    p.add_argument("--rows-per-micro", type=int, default=8)
    p.add_argument("--warmup", type=int, default=1, help="micro-batches per arm run untimed first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=3, help="optimizer steps timed per arm (median)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    from machine import print_machine, write_result

    from rlvr.config import ModelConfig
    from rlvr.models import load_policy
    from rlvr.models.attention import use_fp32_attention
    from rlvr.precision import resolve_precision, set_model_precision
    from rlvr.trainer.forward import micro_batches
    from rlvr.trainer.master_weights import MasterWeightAdamW

    machine = print_machine()
    model, tok = load_policy(ModelConfig(name_or_path=a.model, dtype="fp32"))
    model.train()
    pure = copy.deepcopy(model).to(torch.bfloat16)
    master = copy.deepcopy(pure)
    attn32 = copy.deepcopy(pure)
    use_fp32_attention(attn32)
    models = {"fp32": model, "bf16": model, "bf16-pure": pure, "bf16-master": master, "bf16-master+attn32": attn32}
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    optimizers = {"fp32": adamw, "bf16": adamw, "bf16-pure": torch.optim.AdamW(pure.parameters(), lr=1e-6, fused=True),
                  "bf16-master": MasterWeightAdamW(master.parameters(), lr=1e-6, fused=True),
                  "bf16-master+attn32": MasterWeightAdamW(attn32.parameters(), lr=1e-6, fused=True)}
    policies = {arm: resolve_precision(split_arm(arm)[0], "cpu") for arm in ARMS}
    n_params = sum(q.numel() for q in model.parameters())
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    batch = synthetic_batch(len(tok), a.prompts, a.gens, a.prompt_len, a.max_new, a.seed)
    groups = micro_batches(batch, a.rows_per_micro)

    def run(arm, micro):
        set_model_precision(models[arm], policies[arm])
        return update_once(models[arm], micro, pad)

    for arm in ARMS:  # warm-up: first-call allocations and kernel selection, untimed (each arm's own pass)
        for rows in groups[: a.warmup]:
            run(arm, batch.select(rows))
    secs = {arm: [0.0, 0.0] for arm in ARMS}
    gap = {arm: 0.0 for arm in ARMS}  # largest |log p(arm) − log p(fp32)| over completion tokens
    tokens = 0
    start = {"utc": time.strftime("%H:%M:%S", time.gmtime()), "loadavg": os.getloadavg()}
    for j, rows in enumerate(groups):
        micro = batch.select(rows)
        tokens += trained_tokens(micro)
        order = ARMS[j % len(ARMS):] + ARMS[: j % len(ARMS)]
        lps = {}
        for arm in order:
            f, b, lps[arm] = run(arm, micro)
            secs[arm][0] += f
            secs[arm][1] += b
        real = micro.completion_mask.bool()
        for arm in ARMS:
            gap[arm] = max(gap[arm], float((lps[arm] - lps["fp32"])[real].abs().max()))
    step_s = {arm: optimizer_step_seconds(models[arm], optimizers[arm], a.steps) for arm in ARMS}
    flops = 6 * n_params * tokens
    res = {"machine": machine, "args": vars(a), "params": n_params, "trained_tokens": tokens,
           "micro_batches": len(groups), "start": start,
           "end": {"utc": time.strftime("%H:%M:%S", time.gmtime()), "loadavg": os.getloadavg()}, "arms": {}}
    print(f"\nupdate of {len(groups)} micro-batches, {tokens} tokens, {n_params / 1e6:.1f} M parameters "
          f"(load average {start['loadavg'][0]:.2f} → {os.getloadavg()[0]:.2f})")
    print("| arm | forward s | backward s | update s | training GFLOP/s | × fp32 | optimizer step s "
          "| max |Δ log p| vs fp32 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    base = sum(secs["fp32"])
    for arm in ARMS:
        f, b = secs[arm]
        rate = flops / (f + b) / 1e9
        res["arms"][arm] = {"forward_s": f, "backward_s": b, "update_s": f + b, "training_gflops": rate,
                            "speedup_vs_fp32": base / (f + b), "optimizer_step_s": step_s[arm],
                            "max_abs_logp_diff_vs_fp32": gap[arm]}
        print(f"| {arm} | {f:.2f} | {b:.2f} | {f + b:.2f} | {rate:.1f} | {base / (f + b):.2f} | {step_s[arm]:.3f} "
              f"| {gap[arm]:.2e} |")
    write_result(a.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

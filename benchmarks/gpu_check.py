"""A GPU check ready before any GPU is lent: GRPO steps with FSDP2 (world size 1) in bf16 on a randomly
initialised model of Qwen2.5-0.5B's shape, plus a correctness leg (a tiny model's loss and gradients on the
device against the CPU).

    python benchmarks/gpu_check.py --peak-tflops 989             # one GPU, < 8 minutes: 20 steps
    python benchmarks/gpu_check.py --device cpu --tiny           # the CPU smoke run `make test` does (seconds)

**Correctness leg** (first, so a broken device fails in seconds): the tests' tiny llama, one fixed rollout
batch (3 groups × 4 completions, ragged lengths, random advantages), one ``policy_update`` without the
optimizer step (``old_logp`` = the model's own no-grad log-probs, so the loss depends on them), once on the
CPU in fp32 and once on ``--device`` in fp32 and in ``bf16`` (autocast). Each compares the log-probs, the
loss and the gradient of every parameter with the CPU's; passes when ``max|Δ log p| ≤ 1e-4`` (bf16: 0.2
nats), ``|Δloss| ≤ tol·|loss| + 1e-6`` and ``‖Δg‖ / ‖g‖ ≤ tol`` (fp32: ``tol = 1e-4``; bf16: ``tol = 5e-2``,
bf16's 8-bit mantissa over a few reductions).

**Training leg**: a ``Qwen2ForCausalLM`` built in-process from Qwen2.5-0.5B's config values (hidden 896,
24 layers, 14 heads, 2 key/value heads, intermediate 4864, vocabulary 151 936, tied embeddings; no
download) with random weights, the tiny in-process tokenizer (prompts of ``rlvr.testing.ToyTask``; sampled
ids beyond its vocabulary decode to nothing, so rewards are those of a random policy), wrapped by rlvr's own
FSDP2 path (``Trainer(dp=DataParallel(fsdp=True))`` → ``rlvr.distributed.fsdp.shard_policy``) in a
one-process group (nccl on CUDA, gloo on the CPU), ``model.dtype=bf16``: fp32 master weights, bf16
compute (on CUDA FSDP's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``). ``--tiny`` uses
a two-layer Qwen2 of the tiny tokenizer's vocabulary instead.

Reported per step and as medians over the steps after the first (warm-up): step time, generation and
update time, generated tokens/s, trained tokens/s, **training MFU** = training FLOPs ÷ update seconds ÷
``--peak-tflops`` (the device's dense bf16 peak; H100/H200 SXM: 989), with the training FLOPs counted as
in ``bench_step.py`` (``6·P_body·tokens_body + 6·V·H·completion tokens``, a group's prompt once), the
step MFU (training + generation FLOPs over the whole step), and peak memory (CUDA: ``max_memory_allocated``;
CPU: the process's peak RSS). Writes ``--out`` (JSON); exit status 1 when the correctness leg fails.

Works with torch ≥ 2.6 (``torch.distributed.fsdp.fully_shard``) and transformers ≥ 4.45 (``Qwen2Config``);
written against the lent machine's torch 2.11 / transformers 5.17 and tested here on 2.13 / 5.24.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

QWEN25_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True)
"""Qwen2.5-0.5B's published config values (its ``config.json``)."""
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, max_position_embeddings=1024, tie_word_embeddings=True)
TOL = {"fp32": 1e-4, "bf16": 5e-2}
LOGP_TOL = {"fp32": 1e-4, "bf16": 0.2}  # nats; bf16: docs/precision.md measured up to 0.13 on this model


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="a two-layer Qwen2 instead of Qwen2.5-0.5B's shape (CPU smoke)")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps (default 20; --tiny 2)")
    p.add_argument("--prompts", type=int, default=None, help="prompts per step (default 8; --tiny 2)")
    p.add_argument("--gens", type=int, default=8, help="completions per prompt (default 8; --tiny 4)")
    p.add_argument("--max-new", type=int, default=None, help="max new tokens (default 128; --tiny 8)")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="the device's dense bf16 peak (TFLOP/s)")
    p.add_argument("--no-fsdp", action="store_true", help="train the plain module (no process group)")
    p.add_argument("--run-dir", default="/tmp/rlvr_gpu_check")
    p.add_argument("--out", default="benchmarks/results/gpu_check.json")
    a = p.parse_args(argv)
    small = a.tiny
    a.steps = a.steps if a.steps is not None else (2 if small else 20)
    a.prompts = a.prompts if a.prompts is not None else (2 if small else 8)
    a.gens = 4 if small and a.gens == 8 else a.gens
    a.max_new = a.max_new if a.max_new is not None else (8 if small else 128)
    return a


# ------------------------------------------------------------------------------------------ correctness
def _fixed_batch(seed: int = 0):
    """3 groups × 4 completions of the tiny vocabulary, ragged lengths (one empty), random advantages."""
    from rlvr.types import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    G, groups = 4, 3
    contexts, lengths = [], []
    for _ in range(groups):
        ctx = torch.randint(3, 400, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
        contexts += [ctx] * G
        lengths += torch.randint(1, 10, (G,), generator=g).tolist()
    lengths[1] = 0
    n, T = groups * G, max(lengths)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).float()
    ids = torch.randint(3, 400, (n, T), generator=g) * mask.long()
    b = RolloutBatch(context_ids=contexts, completion_ids=ids, completion_mask=mask,
                     group_id=torch.arange(groups).repeat_interleave(G), prompt_index=torch.arange(groups).repeat_interleave(G),
                     is_truncated=torch.zeros(n, dtype=torch.bool), sampling_temperature=torch.ones(n),
                     logprob_temperature=torch.ones(n), policy_version=torch.zeros(n, dtype=torch.long))
    b.advantages = torch.randn(n, generator=g)
    return b


def _loss_and_grads(device: str, dtype: str) -> tuple[float, torch.Tensor, dict[str, torch.Tensor]]:
    """The loss, the completion log-probs ``[n, T]`` and every parameter's gradient of one update."""
    from rlvr.core.objective import LossSettings
    from rlvr.models.tiny import build_tiny_model
    from rlvr.precision import resolve_precision, set_model_precision
    from rlvr.trainer.forward import batch_logprobs
    from rlvr.trainer.update import policy_update

    model, _ = build_tiny_model(0)
    model.to(device).train()
    set_model_precision(model, resolve_precision(dtype, device, log=False))
    batch = _fixed_batch()
    batch.old_logp = batch_logprobs(model, batch, pad_token_id=2, rows_per_micro=4)[0]  # the loss depends on logp
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    res = policy_update(model, opt, batch, LossSettings(), pad_token_id=2, rows_per_micro=4,
                        step_optimizer=False, max_grad_norm=None)
    grads = {n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None}
    return float(res.metrics["loss/total"]), batch.old_logp, grads


def correctness(device: str) -> dict[str, Any]:
    """The tiny model's loss and gradients on ``device`` (fp32 and bf16) against the CPU in fp32."""
    ref_loss, ref_logp, ref = _loss_and_grads("cpu", "fp32")
    ref_norm = math.sqrt(sum(float(g.pow(2).sum()) for g in ref.values()))
    out: dict[str, Any] = {"cpu_fp32_loss": ref_loss, "cpu_fp32_grad_norm": ref_norm}
    for dtype, tol in TOL.items():
        loss, logp, grads = _loss_and_grads(device, dtype)
        diff = math.sqrt(sum(float((grads[n] - g).pow(2).sum()) for n, g in ref.items()))
        rel = diff / max(ref_norm, 1e-12)
        dlogp = float((logp - ref_logp).abs().max())
        ok = (set(grads) == set(ref) and abs(loss - ref_loss) <= tol * abs(ref_loss) + 1e-6 and rel <= tol
              and dlogp <= LOGP_TOL[dtype])
        out[dtype] = {"loss": loss, "loss_abs_diff": abs(loss - ref_loss), "grad_rel_diff": rel,
                      "logp_max_abs_diff": dlogp, "tolerance": tol, "logp_tolerance": LOGP_TOL[dtype],
                      "passed": bool(ok)}
    out["passed"] = all(out[d]["passed"] for d in TOL)
    return out


# ------------------------------------------------------------------------------------------ training
def _process_group(device: str) -> Any:
    """A one-process group (``WORLD_SIZE=1``) through rlvr's own :func:`rlvr.distributed.init_distributed`."""
    from rlvr.distributed import init_distributed

    if "WORLD_SIZE" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return init_distributed(device, timeout_s=300.0)


def _model(args, tok) -> Any:
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    shape = dict(TINY, vocab_size=len(tok)) if args.tiny else QWEN25_05B
    config = Qwen2Config(**shape, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device(args.device):  # initialise where it trains (0.5 B parameters: seconds on a GPU)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                               pad_token_id=tok.pad_token_id)
    return model


def _sizes(model) -> dict[str, int]:
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight.numel()
    return {"total": total, "embedding": emb, "body": total - emb}


def _peak_memory_gib(device: str) -> float:
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def train(args) -> dict[str, Any]:
    """``args.steps`` GRPO steps through ``Trainer.train`` with FSDP2 at world size 1; per-step numbers."""
    from rlvr.config import build_config
    from rlvr.distributed import DataParallel
    from rlvr.models.tiny import build_tiny_tokenizer
    from rlvr.testing import ToyTask
    from rlvr.trainer.trainer import Trainer

    tok = build_tiny_tokenizer()
    env = None if args.no_fsdp else _process_group(args.device)
    model = _model(args, tok)
    sizes = _sizes(model)
    H, V = model.config.hidden_size, model.config.vocab_size
    cfg = build_config(overrides=[
        f"device={args.device}", "model.dtype=bf16", "model.name_or_path=tiny", f"num_generations={args.gens}",
        f"generation_batch_size={args.prompts * args.gens}", f"per_device_train_batch_size={args.gens}",
        f"max_completion_length={args.max_new}", "max_prompt_length=64", "beta=0", "learning_rate=1e-6",
        f"max_steps={args.steps}", "temperature=1.0", f"logging.output_dir={args.run_dir}", "logging.progress=false",
        "logging.tensorboard=false", "logging.log_completions_steps=0", "save_steps=0",
        f"distributed.fsdp={'false' if args.no_fsdp else 'true'}",
    ])
    dp = DataParallel(env, fsdp=True, pad_token_id=int(tok.pad_token_id)) if env is not None else None
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    tr = Trainer(cfg, model, tok, ToyTask(n=max(64, args.prompts * args.steps)), dp=dp)
    acc = {"completion": 0, "body": 0}
    orig = tr._update

    def counted(step):
        b = step.batch
        n_c = int(b.completion_mask.sum())
        acc["completion"] += n_c
        acc["body"] += n_c + sum(len(c) for c in {tuple(c) for c in b.context_ids})  # a group's prompt once
        return orig(step)

    tr._update = counted
    steps: list[dict[str, float]] = []
    t_prev = [time.perf_counter()]
    peak = args.peak_tflops * 1e12

    def on_step(trainer, m):
        if args.device == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        step_s, update_s = now - t_prev[0], m["timing/update_s"]
        flops = 6 * sizes["body"] * acc["body"] + 6 * V * H * acc["completion"]
        gen_flops = 2 * sizes["body"] * acc["body"] + 2 * V * H * acc["completion"]
        steps.append({
            "step_s": step_s, "generate_s": m.get("timing/generate_s", 0.0), "update_s": update_s,
            "generated_tokens": acc["completion"], "trained_tokens": acc["body"],
            "generated_tokens_per_s": m.get("perf/generated_tokens_per_s", 0.0),
            "trained_tokens_per_s": acc["body"] / max(update_s, 1e-9),
            "train_tflops": flops / 1e12, "train_mfu": flops / max(update_s, 1e-9) / peak,
            "step_mfu": (flops + gen_flops) / max(step_s, 1e-9) / peak, "loss": m.get("loss/total"),
            "reward_mean": m.get("reward/mean"), "grad_norm": m.get("actor/grad_norm"),
        })
        print(f"step {trainer.global_step}: " + json.dumps({k: round(v, 4) if isinstance(v, float) else v
                                                           for k, v in steps[-1].items()}), flush=True)
        acc.update(completion=0, body=0)
        t_prev[0] = time.perf_counter()

    tr.callbacks.append(on_step)
    try:
        t_prev[0] = time.perf_counter()
        tr.train()
    finally:
        tr.close()
    timed = steps[1:] if len(steps) > 2 else steps
    med = {k: statistics.median(s[k] for s in timed) for k in steps[0] if isinstance(steps[0][k], (int, float))}
    return {"model_params": sizes, "fsdp": env is not None, "backend": env.backend if env else None,
            "precision": tr.precision.as_dict(), "steps": steps, "median_after_first": med,
            "peak_memory_gib": _peak_memory_gib(args.device)}


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    import transformers

    t0 = time.perf_counter()
    result: dict[str, Any] = {"settings": vars(args), "torch": torch.__version__, "transformers": transformers.__version__,
                              "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    print(f"gpu_check: torch {torch.__version__}, transformers {transformers.__version__}, {result['device_name']}",
          flush=True)
    result["correctness"] = correctness(args.device)
    print("correctness: " + json.dumps(result["correctness"]), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))  # a failing training leg keeps this
    try:
        result["train"] = train(args)
    finally:
        from rlvr.distributed import shutdown

        shutdown()
    result["wall_s"] = time.perf_counter() - t0
    med = result["train"]["median_after_first"]
    print(f"median: step {med['step_s']:.2f} s (generate {med['generate_s']:.2f}, update {med['update_s']:.2f}); "
          f"generated {med['generated_tokens_per_s']:.0f} tok/s; trained {med['trained_tokens_per_s']:.0f} tok/s; "
          f"training MFU {med['train_mfu']:.1%}, step MFU {med['step_mfu']:.1%} of {args.peak_tflops:g} TFLOP/s; "
          f"peak memory {result['train']['peak_memory_gib']:.2f} GiB; FSDP2 {result['train']['fsdp']}; "
          f"correctness {'passed' if result['correctness']['passed'] else 'FAILED'}; {result['wall_s']:.0f} s in all",
          flush=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {out}")
    return 0 if result["correctness"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Time one GRPO step per phase, measure the machine's fp32 matmul rate, and (optionally) compare with TRL.

Settings (fixed, as in issue 3): ``--prompts 8`` prompts × ``--gens 8`` completions, ``--max-new 128``
new tokens, ``beta=0``, one iteration (μ = 1), no gradient checkpointing, reasoning-gym
``chain_sum``, temperature 1, learning rate 1e-6, micro-batches of 8 rows. Precision: ``--dtype``
(``model.dtype``, default ``auto``: what the precision policy picks on this machine; issue 15).

It prints the machine first (``benchmarks/machine.py``: CPU model, torch capability, bf16 flags, fp32 and
bf16 matmul GFLOP/s). **Compute floor** of a step: the FLOPs of the training phase (below) plus those of
generation (``2 × P_body × (prompt + generated tokens) + 2 × V·H × generated tokens``: prefill once per
prompt, the LM head once per decoded token) divided by the matmul rate of the precision the step runs
its matmuls in (fp32 or bf16, best over the model's shapes, measured in the same run); ``step / floor`` is
reported per step.

Phases of an rlvr step (measured on the real training code path, ``Trainer.train``):

* ``generate``  — sampling through the engine (``timing/generate_s``);
* ``score``     — decoding + verifiers (``timing/reward_s``);
* ``logprobs``  — the training forward that yields per-token log-probs (body + LM head on completion
                  tokens only), summed over micro-batches (``completion_logprobs`` wrapped with a timer);
* ``optimizer`` — gradient clipping + ``optimizer.step`` + ``zero_grad``;
* ``backward``  — the rest of the update (loss math + ``loss.backward``);
* ``step``      — the whole step, wall time.

FLOPs of the training phase are counted as ``6 × P_body × tokens_body + 6 × V·H × tokens_completion``:
``P_body`` = parameters outside the (tied) embedding, ``tokens_body`` = real ``context + completion``
tokens of every row (padding not counted), the LM head ``V × H`` running only on completion tokens (what
rlvr computes). Attention's ``L²`` term is left out (rows are ~200 tokens: < 3 % here). The achieved rate
is those FLOPs over ``logprobs + backward`` seconds, reported as a fraction of the machine's fp32 matmul
rate, measured in the same run as the best of ``torch.mm`` on the model's own shapes
(``[4096, H] @ [H, I]``, ``[4096, I] @ [I, H]``, ``[4096, H] @ [H, H]``).

``--trl`` adds TRL's ``GRPOTrainer`` (at its best precision here: ``bf16=True`` where the policy picks
bf16, else fp32) (``pip install trl==1.16.0``, the ``[bench]`` extra) on the very same
model object (loaded with :func:`rlvr.models.load_policy`), task, prompts, reward and settings
(``per_device_train_batch_size=8``, ``gradient_accumulation_steps=8`` → 64 completions, one optimizer
step per generation, ``gradient_checkpointing=False``, ``beta=0``, ``num_iterations=1``), timing each
optimizer step with a callback, and prints the ratio of median step times rlvr / TRL.

Run (heavy: take the shared lock)::

    HF_HUB_OFFLINE=1 flock /tmp/rlvr_heavy.lock .venv/bin/python benchmarks/bench_step.py --steps 2 --trl --trl-steps 2

``--model tiny`` runs everything on the tiny in-process model (a smoke test, seconds). Writes
``benchmarks/results/bench_step.json`` (or ``--out``). Timings are noisy (±20 %) and never test assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from timers import timed  # noqa: E402  (benchmarks/timers.py; the script's folder is on sys.path)

RESULTS = Path(__file__).parent / "results" / "bench_step.json"


# ------------------------------------------------------------------------------------------ machine
from rlvr.precision import model_matmul_rates as matmul_gflops  # noqa: E402  (one timing loop: rlvr.precision)


def model_sizes(model: Any) -> dict[str, int]:
    """Total parameters, embedding (V·H) parameters and the rest (``body``)."""
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight.numel()
    return {"total": total, "embedding": emb, "body": total - emb}


# ------------------------------------------------------------------------------------------ setup
def build(args: argparse.Namespace, out_dir: Path):
    from rlvr.config import build_config
    from rlvr.models import load_policy
    from rlvr.models.tiny import build_tiny_model
    from rlvr.tasks import build_task

    overrides = [
        "task.type=reasoning_gym", "task.name=chain_sum",
        f"num_generations={args.gens}", f"generation_batch_size={args.prompts * args.gens}",
        "steps_per_generation=1", "num_iterations=1", "beta=0", "per_device_train_batch_size=8",
        f"max_completion_length={args.max_new}", "max_prompt_length=256", "learning_rate=1e-6",
        "temperature=1.0", f"max_steps={args.steps}", f"logging.output_dir={out_dir}",
        "logging.progress=false", "logging.tensorboard=false", "logging.log_completions_steps=0",
        f"model.name_or_path={args.model if args.model != 'tiny' else 'default'}", f"model.dtype={args.dtype}",
    ] + list(args.override)
    cfg = build_config(overrides=overrides)
    task = build_task(cfg.task)
    if args.model == "tiny":
        model, tok = build_tiny_model(0)
    else:
        model, tok = load_policy(cfg.model)
    return cfg, task, model, tok


# ------------------------------------------------------------------------------------------ rlvr
def bench_rlvr(args: argparse.Namespace, gflops: float, floor_gflops: float | None = None,
               partial: Any = None) -> dict[str, Any]:
    import rlvr.trainer.update as upd
    from rlvr.trainer.forward import shares_context
    from rlvr.trainer.trainer import Trainer

    out_dir = Path(args.run_dir) / "rlvr"
    cfg, task, model, tok = build(args, out_dir)
    sizes = model_sizes(model)
    tr = Trainer(cfg, model, tok, task)
    print(f"rlvr precision: {tr.precision.mode} ({tr.precision.reason}); engine decodes in "
          f"{str(tr.engine.decode_dtype).removeprefix('torch.')}", flush=True)
    acc = {"logprobs": 0.0, "optimizer": 0.0, "body_tokens": 0, "completion_tokens": 0}
    orig_clp = upd.completion_logprobs

    def timed_clp(model, micro, **kw):
        t = time.perf_counter()
        r = orig_clp(model, micro, **kw)
        acc["logprobs"] += time.perf_counter() - t
        n_c = int(micro.completion_mask.sum())
        acc["completion_tokens"] += n_c
        shared = kw.get("share_prompt", True) and shares_context(micro)
        ctx = len(micro.context_ids[0]) if shared else sum(len(c) for c in micro.context_ids)
        acc["body_tokens"] += n_c + ctx  # tokens the body actually runs (a shared prompt once)
        return r

    upd.completion_logprobs = timed_clp
    orig_clip = torch.nn.utils.clip_grad_norm_
    torch.nn.utils.clip_grad_norm_ = timed(orig_clip, acc, "optimizer")
    tr.optimizer.step = timed(tr.optimizer.step, acc, "optimizer")
    steps: list[dict[str, float]] = []
    t_prev = [time.perf_counter()]

    def on_step(trainer, m):
        now = time.perf_counter()
        update_s = m["timing/update_s"]
        fwd, opt = acc["logprobs"], acc["optimizer"]
        train_s = update_s - opt  # forward + loss + backward
        flops = 6 * sizes["body"] * acc["body_tokens"] + 6 * sizes["embedding"] * acc["completion_tokens"]
        prompt_tokens = acc["body_tokens"] - acc["completion_tokens"]  # each group's prompt, counted once
        gen_flops = 2 * sizes["body"] * acc["body_tokens"] + 2 * sizes["embedding"] * acc["completion_tokens"]
        floor_s = (flops + gen_flops) / 1e9 / (floor_gflops or gflops)
        row = {
            "step_s": now - t_prev[0],
            "generate_s": m.get("timing/generate_s", 0.0),
            "score_s": m.get("timing/reward_s", 0.0),
            "logprobs_s": fwd,
            "backward_s": update_s - fwd - opt,
            "optimizer_s": opt,
            "update_s": update_s,
            "generated_tokens": acc["completion_tokens"],
            "trained_tokens": acc["body_tokens"],
            "generated_tokens_per_s": m.get("perf/generated_tokens_per_s", 0.0),
            "train_tokens_per_s": acc["body_tokens"] / max(train_s, 1e-9),
            "train_gflops": flops / 1e9,
            "train_gflop_per_s": flops / max(train_s, 1e-9) / 1e9,
            "matmul_fraction": flops / max(train_s, 1e-9) / 1e9 / gflops,
            "gen_gflops": gen_flops / 1e9,
            "prompt_tokens": prompt_tokens,
            "floor_s": floor_s,
            "step_over_floor": (now - t_prev[0]) / floor_s,
            "reward_mean": m.get("reward/mean"),
            "completion_mean_length": m.get("completions/mean_length"),
        }
        steps.append(row)
        for k in ("logprobs", "optimizer", "body_tokens", "completion_tokens"):
            acc[k] = 0 if isinstance(acc[k], int) else 0.0
        print("rlvr step %d: %s" % (trainer.global_step, json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})), flush=True)
        if partial is not None:  # a run cut by its timeout keeps the steps it finished
            partial({"model_params": sizes, "steps": list(steps), "partial": True})
        t_prev[0] = time.perf_counter()

    tr.callbacks.append(on_step)
    prof = None
    try:
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            prof = profile(activities=[ProfilerActivity.CPU], record_shapes=False)
            prof.__enter__()
        t_prev[0] = time.perf_counter()
        tr.train()
    finally:
        if prof is not None:
            prof.__exit__(None, None, None)
        upd.completion_logprobs = orig_clp
        torch.nn.utils.clip_grad_norm_ = orig_clip
        tr.scorer.close() if hasattr(tr.scorer, "close") else None
    res: dict[str, Any] = {"model_params": sizes, "steps": steps, "precision": tr.precision.as_dict()}
    if prof is not None:
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        res["profile_top"] = table
        print(table)
    return res


# ------------------------------------------------------------------------------------------ TRL
def bench_trl(args: argparse.Namespace, partial: Any = None) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    out_dir = Path(args.run_dir) / "trl"
    cfg, task, model, tok = build(args, out_dir)
    system = cfg.task.system_prompt or task.system_prompt
    problems = task.problems("train")
    rows = [
        {"prompt": [{"role": "system", "content": system}, {"role": "user", "content": p.question}], "pid": i}
        for i, p in enumerate(problems[: max(64, args.prompts * (args.trl_steps + 1))])
    ]
    ds = Dataset.from_list(rows)

    def reward(completions, pid, **_):
        out = []
        for c, i in zip(completions, pid):
            text = c[0]["content"] if isinstance(c, list) else c
            out.append(float(task.verify(problems[i], text).score))
        return out

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            times.append(time.perf_counter() - self.t)
            print(f"TRL step {state.global_step}: {times[-1]:.1f} s", flush=True)
            if partial is not None:
                partial({"step_s": list(times), "partial": True})

    targs = GRPOConfig(
        output_dir=str(out_dir), max_steps=args.trl_steps, per_device_train_batch_size=8,
        gradient_accumulation_steps=args.prompts * args.gens // 8, num_generations=args.gens,
        max_completion_length=args.max_new, beta=0.0, num_iterations=1, learning_rate=1e-6,
        temperature=1.0, gradient_checkpointing=False, bf16=args.trl_bf16, fp16=False, use_cpu=True,
        logging_steps=1, report_to="none", save_strategy="no", seed=0, log_completions=False,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=[reward], args=targs, train_dataset=ds, processing_class=tok,
        callbacks=[Timer()],
    )
    t = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t
    logs = [h for h in trainer.state.log_history if "loss" in h or "reward" in h]
    return {"step_s": times, "train_total_s": total, "log_history": logs}


# ------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default", help="'default' (SmolLM2-135M), 'tiny', or a path")
    p.add_argument("--steps", type=int, default=2, help="rlvr optimizer steps (median reported)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--gens", type=int, default=8)
    p.add_argument("--max-new", type=int, default=128)
    p.add_argument("--trl", action="store_true", help="also run TRL's GRPOTrainer and print the ratio")
    p.add_argument("--trl-steps", type=int, default=2)
    p.add_argument("--trl-first", action="store_true", help="run TRL before rlvr")
    p.add_argument("--dtype", default="auto", help="model.dtype for rlvr (auto, fp32, bf16, bf16-pure, bf16-master); TRL gets "
                   "bf16=True exactly when this resolves to bf16")
    p.add_argument("--rlvr-json", help="take the rlvr results from this earlier output instead of running rlvr "
                   "(lets rlvr and TRL run as two separate ≤ 12-minute heavy runs)")
    p.add_argument("--profile", action="store_true", help="torch.profiler over the rlvr steps (top ops)")
    p.add_argument("--run-dir", default="runs/bench_step")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("override", nargs="*", help="extra rlvr config overrides key=value")
    args = p.parse_args(argv)

    from rlvr.models.tiny import build_tiny_model
    from rlvr.precision import resolve_precision

    from machine import print_machine  # benchmarks/machine.py

    machine = print_machine()
    policy = resolve_precision(args.dtype, log=False)
    args.trl_bf16 = policy.mode == "bf16"
    if args.model == "tiny":
        m, _ = build_tiny_model(0)
    else:
        from rlvr.config import ModelConfig
        from rlvr.models import load_policy

        m, _ = load_policy(ModelConfig(name_or_path=args.model))
    hidden, inter = m.config.hidden_size, m.config.intermediate_size
    del m
    mm = matmul_gflops(hidden, inter)
    print(f"fp32 matmul GFLOP/s (torch {torch.__version__}, {torch.get_num_threads()} threads): "
          + ", ".join(f"{k} {v:.1f}" for k, v in mm.items()), flush=True)
    mm_bf16 = matmul_gflops(hidden, inter, rows=512, repeats=2, dtype=torch.bfloat16)
    print("bf16 matmul GFLOP/s (512 rows): " + ", ".join(f"{k} {v:.1f}" for k, v in mm_bf16.items()), flush=True)
    floor_rate = mm_bf16["best"] if policy.compute_dtype == torch.bfloat16 else mm["best"]
    result: dict[str, Any] = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "cpu_count": os.cpu_count()},
        "matmul_gflop_per_s": mm,
        "matmul_gflop_per_s_bf16": mm_bf16,
        "precision": policy.as_dict(),
        "machine_probe": machine,
        "floor_gflop_per_s": floor_rate,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    order = ["trl", "rlvr"] if args.trl_first else ["rlvr", "trl"]
    for which in order:
        if which == "rlvr":
            if args.rlvr_json:
                prev = json.loads(Path(args.rlvr_json).read_text())
                result["rlvr"] = prev["rlvr"]
                result["rlvr_from"] = {"file": args.rlvr_json, "matmul_gflop_per_s": prev.get("matmul_gflop_per_s")}
            else:
                result["rlvr"] = bench_rlvr(args, floor_rate, floor_rate, partial=lambda r: out.write_text(
                    json.dumps({**result, "rlvr": r}, indent=2, default=str)))
        elif args.trl:
            result["trl"] = bench_trl(args, partial=lambda r: out.write_text(json.dumps({**result, "trl": r}, indent=2, default=str)))
        out.write_text(json.dumps(result, indent=2, default=str))  # partial results survive a timeout
    mm_after = matmul_gflops(hidden, inter)
    result["matmul_gflop_per_s_after"] = mm_after
    steps = result["rlvr"]["steps"]
    med = {k: statistics.median(s[k] for s in steps) for k in steps[0] if isinstance(steps[0][k], (int, float))}
    result["rlvr"]["median"] = med
    print("\nrlvr, median over %d steps (%d prompts × %d, %d new tokens, %s):" % (
        len(steps), args.prompts, args.gens, args.max_new, policy.mode))
    print(f"{'phase':<14}{'seconds':>10}{'share':>8}")
    for k in ("generate_s", "score_s", "logprobs_s", "backward_s", "optimizer_s"):
        print(f"{k[:-2]:<14}{med[k]:>10.2f}{med[k] / med['step_s']:>8.0%}")
    print(f"{'step':<14}{med['step_s']:>10.2f}")
    print(f"generated tok/s {med['generated_tokens_per_s']:.1f}; trained tok/s {med['train_tokens_per_s']:.1f}; "
          f"training {med['train_gflop_per_s']:.1f} GFLOP/s = {med['matmul_fraction']:.0%} of measured matmul "
          f"{mm['best']:.1f} GFLOP/s (after: {mm_after['best']:.1f})")
    print(f"compute floor {med['floor_s']:.1f} s ({med['train_gflops'] + med['gen_gflops']:.0f} GFLOP at "
          f"{floor_rate:.1f} GFLOP/s, {policy.mode}); step / floor = {med['step_over_floor']:.2f}x (target <= 2x)")
    if "trl" in result and result["trl"]["step_s"]:
        trl_med = statistics.median(result["trl"]["step_s"])
        result["ratio_rlvr_over_trl"] = med["step_s"] / trl_med
        print(f"TRL GRPOTrainer median step {trl_med:.1f} s over {len(result['trl']['step_s'])} steps; "
              f"rlvr/TRL = {result['ratio_rlvr_over_trl']:.2f}x (target <= 0.3x, issue 15)")
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

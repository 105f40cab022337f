"""FBOS-RL vs GRPO at equal rollout budget, small scale, on CPU (docs/fbos_rl.md "Measured results").

Both arms start from the same weights, see the same prompts (same seed) and generate the same number of
sequences per training step (prompts × G). GRPO takes 1 optimizer step per training step, FBOS-RL
(alternate) 2. After training, pass@1 is estimated on a held-out split. A last diagnostic takes one
FBOS generation batch at the initial weights and measures the EPA update (loss, pre-clip gradient norm,
mean off-policy weight) under each importance-correction switch (shaping / trunc_is / plain), without
stepping.

Usage (heavy with the default model: wrap in ``flock /tmp/rlvr_heavy.lock``):

    HF_HUB_OFFLINE=1 python benchmarks/fbos_vs_grpo.py --model default --steps 4 --out runs/fbos_cmp
    python benchmarks/fbos_vs_grpo.py --model tiny --steps 2 --out runs/fbos_cmp_tiny   # dry run

Writes ``<out>/summary.json`` (per-step metrics of each arm, evals, diagnostic) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from rlvr.config import build_config
from rlvr.eval.evaluate import evaluate
from rlvr.tasks import build_task
from rlvr.trainer.trainer import Trainer
from rlvr.trainer.update import policy_update

KEEP = (
    "reward/mean", "reward/pass_rate", "reward/frac_zero_std_groups", "actor/entropy", "actor/grad_norm",
    "completions/mean_length", "completions/clipped_ratio", "timing/step_s", "timing/generate_s",
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default", help="'default' (SmolLM2-135M) or 'tiny' (dry run)")
    ap.add_argument("--steps", type=int, default=4, help="training steps (generation batches) per arm")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--eval-n", type=int, default=24)
    ap.add_argument("--eval-samples", type=int, default=2)
    ap.add_argument("--arms", default="grpo,fbos_shaping")
    ap.add_argument("--deadline", type=float, default=560.0, help="seconds; later phases are skipped past it")
    ap.add_argument("--out", default="runs/fbos_cmp")
    a = ap.parse_args()
    t_start = time.perf_counter()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    task_over = [
        "task.name=chain_sum", "task.config={min_terms: 2, max_terms: 2, min_digits: 2, max_digits: 2}",
        "task.train_size=500", f"task.eval_size={a.eval_n}",
    ]
    common = task_over + [
        f"num_generations={a.G}", f"generation_batch_size={a.G * a.prompts}", "per_device_train_batch_size=8",
        f"max_completion_length={a.max_new}", "max_prompt_length=256", f"learning_rate={a.lr}",
        "reward_timeout_s=0", "logging.progress=false", "logging.tensorboard=false", "logging.log_completions_steps=1",
        "seed=0",
    ]
    if a.model == "tiny":
        from rlvr.models.tiny import build_tiny_model

        model, tok = build_tiny_model(0)
    else:
        from rlvr.models import load_policy

        model, tok = load_policy(build_config(overrides=["model.name_or_path=default"]).model)
    model.float()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    task = build_task(build_config(overrides=task_over).task)
    summary: dict = {"args": vars(a), "arms": {}, "evals": {}}

    def run_eval(tag: str) -> None:
        if time.perf_counter() - t_start > a.deadline:
            summary["evals"][tag] = "skipped (deadline)"
            return
        r = evaluate(model, tok, task, num_samples=a.eval_samples, ks=[1], max_new_tokens=a.max_new,
                     prompts_per_batch=12, seed=123, limit=a.eval_n)
        summary["evals"][tag] = {k: v for k, v in r.items() if k != "per_problem"}
        print(f"eval {tag}: pass@1={r['pass@1']:.3f} ({r['num_problems']} problems × {a.eval_samples}) "
              f"t={r['time_s']}s", flush=True)

    run_eval("initial")
    arms = {
        "grpo": ["grpo"],
        "fbos_shaping": ["fbos_rl", "fbos.epa_offpolicy_weight=shaping"],
        "fbos_trunc_is": ["fbos_rl", "fbos.epa_offpolicy_weight=trunc_is"],
        "fbos_plain": ["fbos_rl", "fbos.epa_offpolicy_weight=plain"],
    }
    for name in a.arms.split(","):
        if time.perf_counter() - t_start > a.deadline:
            summary["arms"][name] = "skipped (deadline)"
            continue
        model.load_state_dict(init)
        recipe, *extra = arms[name]
        fb = recipe == "fbos_rl"
        cfg = build_config([recipe], common + extra + [
            f"max_steps={2 * a.steps if fb else a.steps}", f"logging.output_dir={out / name}",
        ])
        tr = Trainer(cfg, model, tok, task)
        tr.save = lambda *args, **kw: None  # no 0.5 GB final export per arm
        rows: list[dict] = []
        tr.callbacks.append(lambda t, m: rows.append({"step": t.global_step, "round": t.generation_round, **{
            k: v for k, v in m.items() if isinstance(v, (int, float)) and math.isfinite(v)}}))
        t0 = time.perf_counter()
        tr.train()
        summary["arms"][name] = {"updates": rows, "train_s": round(time.perf_counter() - t0, 1)}
        print(f"arm {name}: {len(rows)} optimizer updates in {time.perf_counter() - t0:.0f}s", flush=True)
        run_eval(name)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))  # a timeout keeps the finished arms

    # diagnostic: the EPA update of one FBOS batch at the initial weights under each switch (no step)
    if time.perf_counter() - t_start < a.deadline:
        model.load_state_dict(init)
        cfg = build_config(["fbos_rl"], common + [f"logging.output_dir={out / 'diag'}", "max_steps=2"])
        tr = Trainer(cfg, model, tok, task)
        batch, gm = tr.generate_batch()
        diag = {"rescued_frac": gm.get("fbos/rescued_frac"), "triggered_frac": gm.get("fbos/triggered_frac")}
        for kind in ("shaping", "trunc_is", "plain"):
            tr.cfg.fbos.epa_offpolicy_weight = kind
            epa = tr.schedule.plan(batch, tr.plan_ctx)[0]
            res = policy_update(tr.model, tr.optimizer, epa.batch, epa.loss_settings, pad_token_id=tr.pad_token_id,
                                rows_per_micro=8, max_grad_norm=None, step_optimizer=False,
                                loss_inputs=epa.loss_inputs)
            tr.optimizer.zero_grad(set_to_none=True)
            diag[kind] = {"grad_norm": res.metrics["actor/grad_norm"], "loss": res.metrics["loss/policy"],
                          "offpolicy_weight_mean": epa.metrics["fbos/offpolicy_weight_mean"]}
            print(f"diag {kind}: {diag[kind]}", flush=True)
        summary["diagnostic"] = diag
    summary["total_s"] = round(time.perf_counter() - t_start, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"total {summary['total_s']}s -> {out / 'summary.json'}")


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()

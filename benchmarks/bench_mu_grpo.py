"""μ-GRPO on CPU: wall clock at equal work, and a small stability ablation (``docs/mu_grpo.md`` §5, §6).

``wallclock``: the same model, task, number of optimizer updates ``U`` and rollouts, two schedules:

* **staged** (μ-GRPO): 4 stages, μ = U/4 updates per stage, relaxed window [0, 5], suffix veto;
* **on-policy** GRPO μ = 4: U/4 generation rounds of 4 updates, ε = 0.2.

Both compute behaviour log-probs once per rollout set with the trainer's forward and use every group
in exactly one update, so the training work is identical; what differs is how many completions one
generation phase decodes (U/4·b·G against 4·b·G). Per-phase times are the trainer's own
``timing/*`` metrics summed over the run; ``other`` is the wall clock minus their sum.

``stability``: the four ablations of §5 at small scale, one stage of μ updates each:
GRPO μ=4 (on-policy rounds, ε=0.2), naive large μ (ε=0.2, no veto), relaxed clip without veto
([0, 5]), and μ-GRPO ([0, 5] + suffix veto). The three large-μ arms start from the same weights and
the same seed, so they share one generation phase and one behaviour-log-prob pass (cached here, not
recomputed). Every arm logs ``mu_grpo/ratio_neg_mean`` and the veto rates (the veto hook runs with
``veto_scope=none`` where the veto is off, so the diagnostics are measured but nothing is masked);
held-out reward is sampled every ``--eval-every`` updates.

Run (heavy: take the shared lock; each mode is sized for < 10 minutes on a 2-core CPU)::

    HF_HUB_OFFLINE=1 flock /tmp/rlvr_heavy.lock timeout 600 .venv/bin/python benchmarks/bench_mu_grpo.py wallclock
    HF_HUB_OFFLINE=1 flock /tmp/rlvr_heavy.lock timeout 600 .venv/bin/python benchmarks/bench_mu_grpo.py stability

``--model tiny`` runs on the tiny in-process model (a smoke test, seconds). Writes JSON (and a PNG for
``stability``) under ``--out`` (default ``runs/bench_mu_grpo``). Timings are noisy (±20 %), never test
assertions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PHASES = ("timing/generate_s", "timing/reward_s", "timing/old_logprob_s", "timing/update_s")


def base_overrides(args: argparse.Namespace, out_dir: Path) -> list[str]:
    return [
        "task.type=reasoning_gym", "task.name=chain_sum",
        "task.config={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 2}",
        "task.train_size=2000", "task.eval_size=40",
        f"num_generations={args.gens}", "num_iterations=1", "beta=0", "per_device_train_batch_size=8",
        f"max_completion_length={args.max_new}", "max_prompt_length=256", f"learning_rate={args.lr}",
        "temperature=1.0", "old_logprob_source=trainer", "loss_masks=[veto]", "seed=0",
        f"logging.output_dir={out_dir}", "logging.progress=false", "logging.tensorboard=false",
        "logging.log_completions_steps=0", "model.name_or_path=default",
    ]


class ParityTask:
    """A synthetic task whose reward has within-group variance even for a random tiny model (score 1
    when the completion has an even number of characters): a stand-in that exercises the off-policy
    diagnostics when the real task gives the tiny model no signal (``--task parity``)."""

    name = "parity"
    system_prompt = "Answer with a number."

    def problems(self, split: str) -> list[Any]:
        from rlvr.tasks.base import Problem

        off = 0 if split == "train" else 1000
        return [Problem(uid=f"{split}-{i}", question=f"{i + off} + 1 =", answer=str(i + off + 1)) for i in range(64)]

    def verify(self, problem: Any, completion: str) -> Any:
        from rlvr.tasks.base import Verdict

        ok = len(completion) % 2 == 0
        return Verdict(score=float(ok), correct=ok)


def load_model(args: argparse.Namespace, cfg: Any):
    from rlvr.models import load_policy
    from rlvr.models.tiny import build_tiny_model

    if args.model == "tiny":
        return build_tiny_model(0)
    return load_policy(cfg.model)


def run_arm(args: argparse.Namespace, name: str, overrides: list[str], *, trainer_hook=None, on_step=None) -> dict[str, Any]:
    """Train one arm with :class:`rlvr.trainer.trainer.Trainer`; return its per-step metrics and timings."""
    from rlvr.config import build_config
    from rlvr.tasks import build_task
    from rlvr.trainer.trainer import Trainer

    out_dir = Path(args.out) / name
    cfg = build_config(overrides=base_overrides(args, out_dir) + overrides + list(args.override))
    task = ParityTask() if args.task == "parity" else build_task(cfg.task)
    model, tok = load_model(args, cfg)
    tr = Trainer(cfg, model, tok, task)
    if trainer_hook:
        trainer_hook(tr)
    cpu = _cpu_timers(tr)
    steps: list[dict[str, float]] = []
    t0 = time.perf_counter()
    marks = {"eval_s": 0.0}

    def cb(t, m):
        row = {k: float(v) for k, v in m.items() if isinstance(v, (int, float))}
        row["step"] = t.global_step
        row["wall_s"] = time.perf_counter() - t0 - marks["eval_s"]
        steps.append(row)
        if on_step:
            te = time.perf_counter()
            on_step(t, row)
            marks["eval_s"] += time.perf_counter() - te

    tr.callbacks.append(cb)
    c0 = time.process_time()
    tr.train()
    cpu["total_s"] = time.process_time() - c0
    wall = steps[-1]["wall_s"] if steps else 0.0
    phases = {p.split("/")[1]: sum(s.get(p, 0.0) for s in steps) for p in PHASES}
    phases["other_s"] = wall - sum(phases.values())
    gen_tokens = sum(s.get("perf/generated_tokens_per_s", 0) * s.get("timing/generate_s", 0) for s in steps)
    return {
        "name": name, "overrides": overrides, "wall_s": wall, "phases": phases, "cpu_phases": cpu,
        "generation_phases": int(tr.generation_round), "updates": int(tr.global_step),
        "generated_tokens": gen_tokens,
        "generate_tokens_per_s": gen_tokens / max(phases["generate_s"], 1e-9),
        "steps": steps,
    }


def _cpu_timers(tr: Any) -> dict[str, float]:
    """Process CPU seconds per phase (generation, scoring, behaviour log-probs, updates): on a shared,
    oversubscribed machine wall time swings several-fold with other users' load, CPU time much less."""
    cpu = {"generate_s": 0.0, "reward_s": 0.0, "old_logprob_s": 0.0, "update_s": 0.0}

    def wrap(obj: Any, attr: str, key: str) -> None:
        fn = getattr(obj, attr)

        def timed(*a, **kw):
            c = time.process_time()
            try:
                return fn(*a, **kw)
            finally:
                cpu[key] += time.process_time() - c

        setattr(obj, attr, timed)

    wrap(tr.sampler, "sample", "generate_s")
    wrap(tr.scorer, "score", "reward_s")
    wrap(tr, "_logprobs", "old_logprob_s")
    wrap(tr, "_update", "update_s")
    return cpu


# ---------------------------------------------------------------------------------------- wallclock
def wallclock(args: argparse.Namespace) -> dict[str, Any]:
    U, b, G = args.updates, args.prompts_per_update, args.gens
    if U % 4 or (U // 4) <= 4:
        sys.exit(f"--updates must be a multiple of 4 larger than 16 (staged μ = U/4 > 4), got {U}")
    mu = U // 4
    arms = {
        "staged": ["schedule=staged", f"steps_per_generation={mu}", f"generation_batch_size={mu * b * G}",
                   "epsilon=1.0", "epsilon_high=4.0", "mu_grpo.veto_scope=suffix", f"max_steps={U}"],
        "on_policy": ["schedule=on_policy", "steps_per_generation=4", f"generation_batch_size={4 * b * G}",
                      "epsilon=0.2", "mu_grpo.veto_scope=none", f"max_steps={U}"],
    }
    _warm_up(args)
    results = {}
    partial = Path(args.out) / "wallclock_partial.json"
    for name in args.order.split(","):
        print(f"[wallclock] arm {name} ...", flush=True)
        results[name] = run_arm(args, name, arms[name])
        _print_arm(results[name])
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "steps"} for k, v in results.items()}))
    s, o = results["staged"], results["on_policy"]
    summary = {
        "mode": "wallclock", "model": args.model, "updates": U, "prompts_per_update": b, "num_generations": G,
        "max_new_tokens": args.max_new, "staged_mu": mu, "on_policy_mu": 4,
        "rollouts_per_arm": U * b * G,
        "end_to_end_speedup": o["wall_s"] / max(s["wall_s"], 1e-9),
        "rollout_speedup": o["phases"]["generate_s"] / max(s["phases"]["generate_s"], 1e-9),
        "end_to_end_speedup_cpu": o["cpu_phases"]["total_s"] / max(s["cpu_phases"]["total_s"], 1e-9),
        "rollout_speedup_cpu": o["cpu_phases"]["generate_s"] / max(s["cpu_phases"]["generate_s"], 1e-9),
        "arms": {k: {kk: vv for kk, vv in v.items() if kk != "steps"} for k, v in results.items()},
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "arms"}, indent=1))
    return {**summary, "steps": {k: v["steps"] for k, v in results.items()}}


def _warm_up(args: argparse.Namespace) -> None:
    """One tiny generation + forward so first-call allocations do not land in the first arm."""
    from rlvr.config import build_config
    from rlvr.engines.hf import HFEngine
    from rlvr.types import GenerationRequest, SamplingParams

    cfg = build_config(overrides=base_overrides(args, Path(args.out) / "warmup"))
    model, tok = load_model(args, cfg)
    ids = tok("What is 2 + 3?")["input_ids"]
    HFEngine(model, tok).generate([GenerationRequest(ids, n=8)], SamplingParams(max_new_tokens=8, seed=0))


def _print_arm(r: dict[str, Any]) -> None:
    ph = "  ".join(f"{k}={v:7.1f}" for k, v in r["phases"].items())
    cp = "  ".join(f"{k}={v:7.1f}" for k, v in r["cpu_phases"].items())
    print(f"  {r['name']:10s} wall={r['wall_s']:7.1f}s  gen_phases={r['generation_phases']}  "
          f"gen_tok/s={r['generate_tokens_per_s']:6.1f}  {ph}\n  {'':10s} cpu: {cp}", flush=True)


# ---------------------------------------------------------------------------------------- stability
def stability(args: argparse.Namespace) -> dict[str, Any]:
    from rlvr.eval.evaluate import evaluate

    mu, b, G = args.mu, args.prompts_per_update, args.gens
    stale = ["schedule=staged", f"steps_per_generation={mu}", f"generation_batch_size={mu * b * G}", f"max_steps={mu}"]
    arms = {
        "grpo_mu4": ["schedule=on_policy", "steps_per_generation=4", f"generation_batch_size={4 * b * G}",
                     f"max_steps={mu}", "epsilon=0.2", "mu_grpo.veto_scope=none"],
        "naive_large_mu": stale + ["epsilon=0.2", "mu_grpo.veto_scope=none"],
        "relaxed_no_veto": stale + ["epsilon=1.0", "epsilon_high=4.0", "mu_grpo.veto_scope=none"],
        "mu_grpo": stale + ["epsilon=1.0", "epsilon_high=4.0", "mu_grpo.veto_scope=suffix"],
    }
    shared: dict[str, Any] = {}

    def share_stage(tr):
        """The large-μ arms start from the same weights and seed: reuse the first arm's stage."""
        orig_sample, orig_logprobs = tr.sampler.sample, tr._logprobs

        def sample(problems, g, params, **kw):
            key = ("sample", kw.get("first_group_id"), params.seed, kw.get("policy_version"))
            if kw.get("policy_version") == 0 and key in shared:
                cached = shared[key]
                return cached.select(list(range(len(cached))))
            out = orig_sample(problems, g, params, **kw)
            if kw.get("policy_version") == 0:
                shared[key] = out.select(list(range(len(out))))
            return out

        def logprobs(model, batch):
            if tr.global_step != 0 or model is not tr.model:
                return orig_logprobs(model, batch)
            if "old" not in shared:
                shared["old"] = orig_logprobs(model, batch)
            return shared["old"].clone()

        tr.sampler.sample, tr._logprobs = sample, logprobs

    evals: dict[str, list[tuple[int, float]]] = {}

    def eval_reward(tr) -> float:
        if args.task == "parity":
            return math.nan
        res = evaluate(tr.model, tr.tokenizer, tr.task, num_samples=args.eval_samples, ks=[1],
                       max_new_tokens=args.max_new, seed=123, limit=args.eval_prompts, split="eval")
        return float(res["reward/mean"])

    t_start = time.perf_counter()
    results = {}
    base_eval = None
    for name, ov in arms.items():
        if time.perf_counter() - t_start > args.budget_s:
            print(f"[stability] time budget spent; skipping {name}", flush=True)
            continue
        print(f"[stability] arm {name} ...", flush=True)
        evals[name] = []

        def on_step(tr, row, name=name):
            due = tr.global_step % args.eval_every == 0 or tr.global_step == args.mu
            if due and time.perf_counter() - t_start < args.budget_s:
                r = eval_reward(tr)
                evals[name].append((tr.global_step, r))
                row["eval/reward"] = r

        def hook(tr, name=name):
            nonlocal base_eval
            if name != "grpo_mu4":
                share_stage(tr)
            if base_eval is None:
                base_eval = eval_reward(tr)
            evals[name].append((0, base_eval))

        results[name] = run_arm(args, name, ov, trainer_hook=hook, on_step=on_step)
        _print_stability(results[name], evals[name])
        partial = Path(args.out) / "stability_partial.json"
        partial.write_text(json.dumps({n: {"steps": r["steps"], "eval": evals.get(n, [])} for n, r in results.items()}))
    keys = ("mu_grpo/ratio_neg_mean", "mu_grpo/ratio_pos_mean", "mu_grpo/veto_response_rate",
            "mu_grpo/veto_token_frac", "actor/clip_ratio/region", "actor/ratio/min", "actor/grad_norm")
    curves = {n: {k: [(s["step"], s.get(k)) for s in r["steps"]] for k in keys} for n, r in results.items()}
    for n in curves:
        curves[n]["eval/reward"] = evals.get(n, [])
    summary = {"mode": "stability", "model": args.model, "mu": mu, "prompts_per_update": b, "num_generations": G,
               "max_new_tokens": args.max_new, "learning_rate": args.lr, "arms": list(results),
               "curves": curves, "wall_s": {n: r["wall_s"] for n, r in results.items()}}
    if args.plot:
        plot(summary, Path(args.plot))
    return summary


def _print_stability(r: dict[str, Any], ev: list[tuple[int, float]]) -> None:
    neg = [s.get("mu_grpo/ratio_neg_mean") for s in r["steps"]]
    veto = [s.get("mu_grpo/veto_response_rate") for s in r["steps"]]
    fmt = lambda xs: " ".join("  -  " if x is None else f"{x:5.3f}" for x in xs)  # noqa: E731
    print(f"  {r['name']}: eval {ev}\n    ratio_neg_mean {fmt(neg)}\n    veto_rate      {fmt(veto)}", flush=True)


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("eval/reward", "held-out reward"), ("mu_grpo/ratio_neg_mean", "E[ρ | A<0]"),
              ("mu_grpo/veto_response_rate", "veto response rate (triggers in A<0 rows)"),
              ("actor/clip_ratio/region", "clip fraction")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    for ax, (key, title) in zip(axes, panels):
        for name, c in summary["curves"].items():
            pts = [(x, y) for x, y in c.get(key, []) if y is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, label=name)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("optimizer update")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"μ-GRPO ablations, {summary['model']} model, μ={summary['mu']}, lr={summary['learning_rate']}",
                 fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=["wallclock", "stability"])
    p.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct) or 'tiny'")
    p.add_argument("--task", default="chain_sum", choices=["chain_sum", "parity"],
                   help="reasoning-gym chain_sum, or a synthetic parity reward (no held-out eval)")
    p.add_argument("--out", default="runs/bench_mu_grpo")
    p.add_argument("--json", default=None, help="summary JSON path (default OUT/<mode>.json)")
    p.add_argument("--plot", default=None, help="stability: PNG path")
    p.add_argument("--updates", type=int, default=32, help="wallclock: total optimizer updates U")
    p.add_argument("--order", default="staged,on_policy", help="wallclock: arm order")
    p.add_argument("--mu", type=int, default=12, help="stability: updates of the single stage")
    p.add_argument("--prompts-per-update", type=int, default=1)
    p.add_argument("--gens", type=int, default=8)
    p.add_argument("--max-new", type=int, default=48)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--eval-every", type=int, default=12)
    p.add_argument("--eval-prompts", type=int, default=8)
    p.add_argument("--eval-samples", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=480.0, help="stability: stop starting arms/evals after this")
    p.add_argument("--override", action="append", default=[], help="extra key=value config overrides")
    args = p.parse_args(argv)
    import torch

    torch.manual_seed(0)
    out = wallclock(args) if args.mode == "wallclock" else stability(args)
    path = Path(args.json or Path(args.out) / f"{args.mode}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

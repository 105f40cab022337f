"""UEC-RL vs GRPO at equal rollout budget on CPU (the measured run of docs/uec_rl.md).

One process, one model load:

1. pass@k (n = 16) on a held-out split with the initial policy — also the measurement that justifies
   the task: the share of held-out prompts with zero passes out of 16;
2. UEC-RL (sampler ``hard_prompt``, filter ``uec_retention``, schedule ``uec_replay``) for a rollout
   budget / time cap; pass@k after;
3. the initial weights restored, GRPO (same sampler with ``uec.explore_num_generations=0``, schedule
   ``on_policy``, no filters — plain GRPO that also logs the hard-prompt fraction) until it has generated
   at least as many rollouts as UEC-RL did; pass@k after.

Per generation round it records the regular pass rate, the hard-prompt fraction, rollouts so far and
the mean token entropy of a fixed probe set (completions of the initial policy on held-out prompts).

Usage (heavy: wrap in the shared lock)::

    HF_HUB_OFFLINE=1 flock /tmp/rlvr_heavy.lock timeout 600 .venv/bin/python docs/uec_rl_compare.py \
        --out runs/uec_compare
    .venv/bin/python docs/uec_rl_compare.py --tiny --out runs/uec_compare_tiny   # plumbing check
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from rlvr.config import build_config
from rlvr.eval.evaluate import evaluate
from rlvr.samplers.group import GroupSampler, PromptEncoder
from rlvr.tasks import build_task
from rlvr.variants.uec_rl.schedule import mean_token_entropy
from rlvr.testing import ModelPlanContext
from rlvr.trainer.trainer import Trainer
from rlvr.types import SamplingParams

KS = [1, 2, 4, 8, 16]


class Stop(Exception):
    """Raised from the sampler wrapper when a phase's rollout budget or time cap is reached."""


def common_overrides(args) -> list[str]:
    return [
        "task.type=reasoning_gym", "task.name=chain_sum",
        "task.config={min_terms: 2, max_terms: 3, min_digits: 1, max_digits: 2}",
        "task.train_size=500", f"task.eval_size={args.eval_problems}",
        f"num_generations={args.G}", f"generation_batch_size={args.G * args.B}",
        "per_device_train_batch_size=8", f"max_completion_length={args.max_len}", "max_prompt_length=256",
        f"learning_rate={args.lr}", "max_steps=1000", "temperature=1.0", "top_p=1.0",
        "logging.progress=false", "logging.tensorboard=false", "logging.log_completions_steps=0",
        f"model.name_or_path={'default' if not args.tiny else 'tiny'}",
    ]


def run_phase(name, cfg, model, tok, task, probe, args, budget_rollouts, t_cap, out):
    tr = Trainer(cfg, model, tok, task, output_dir=out / name)
    sampler = tr.sampler
    inner = sampler.sample
    rounds = []
    t0 = time.perf_counter()

    def sample(*a, **kw):
        done = sampler.totals["rollouts/regular"] + sampler.totals["rollouts/explore"]
        ent = mean_token_entropy(ModelPlanContext(model, tr.pad_token_id), probe)
        if rounds:
            rounds[-1]["probe_entropy_after"] = ent
        if done >= budget_rollouts or time.perf_counter() - t0 > t_cap:
            raise Stop
        b = inner(*a, **kw)
        h = dict(sampler.history[-1])
        h.update(round=len(rounds) + 1, probe_entropy=ent, updates_so_far=tr.global_step,
                 t=time.perf_counter() - t0)
        rounds.append(h)
        print(name, {k: round(v, 3) for k, v in h.items() if isinstance(v, float)}, flush=True)
        return b

    sampler.sample = sample
    try:
        tr.train()
    except Stop:
        pass
    log = getattr(tr.schedule, "log", [])
    return {"rounds": rounds, "schedule_log": log, "updates": tr.global_step, "totals": dict(sampler.totals),
            "time_s": time.perf_counter() - t0}


def do_eval(model, tok, task, args, tag, out):
    r = evaluate(model, tok, task, num_samples=args.n_eval, ks=KS, temperature=1.0, max_new_tokens=args.max_len,
                 max_prompt_length=256, prompts_per_batch=8, seed=123, limit=args.eval_problems)
    r["zero_pass_frac"] = sum(p["correct"] == 0 for p in r["per_problem"]) / len(r["per_problem"])
    (out / f"eval_{tag}.json").write_text(json.dumps(r, indent=1))
    print(tag, {k: v for k, v in r.items() if k.startswith(("pass@", "zero_pass", "reward/pass", "time_s",
                                                             "completions/"))}, flush=True)
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="runs/uec_compare")
    ap.add_argument("--tiny", action="store_true", help="tiny random model (plumbing check)")
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--Gx", type=int, default=8)
    ap.add_argument("--t_explore", type=float, default=1.2)
    ap.add_argument("--max_len", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--uec_rounds", type=int, default=5)
    ap.add_argument("--uec_time", type=float, default=120)
    ap.add_argument("--grpo_time", type=float, default=170)
    ap.add_argument("--deadline", type=float, default=560, help="seconds for the whole script (caps phases)")
    ap.add_argument("--eval_problems", type=int, default=8)
    ap.add_argument("--n_eval", type=int, default=16)
    ap.add_argument("--latest_start_utc", default="14:30", help="refuse to start a heavy run after this time")
    args = ap.parse_args()
    import datetime

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M")
    if not args.tiny and now >= args.latest_start_utc:
        raise SystemExit(f"it is {now} UTC, after --latest_start_utc {args.latest_start_utc}: not starting")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    torch.manual_seed(0)
    base = common_overrides(args)
    if args.tiny:
        from rlvr.models.tiny import build_tiny_model

        model, tok = build_tiny_model(0)
    else:
        from rlvr.models import load_policy

        model, tok = load_policy(build_config(overrides=base).model)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    task = build_task(build_config(overrides=base).task)

    # fixed entropy probe: 2 completions of the initial policy on each held-out prompt
    enc = PromptEncoder(tok, task.system_prompt, 256)
    from rlvr.engines.hf import HFEngine

    probe = GroupSampler(HFEngine(model, tok), enc, tok.pad_token_id).sample(
        task.problems("eval")[: args.eval_problems], 2, SamplingParams(max_new_tokens=args.max_len, seed=7))

    summary: dict = {"args": vars(args)}
    summary["eval_before"] = do_eval(model, tok, task, args, "before", out)
    save(summary, out)

    uec_cfg = build_config(["uec_rl"], base + [
        f"num_generations={args.G}", f"generation_batch_size={args.G * args.B}", "top_p=1.0", f"learning_rate={args.lr}",
        f"uec.explore_num_generations={args.Gx}", f"uec.explore_temperature={args.t_explore}",
        f"uec.update_size={args.G * args.B // 2}", "uec.replay_every=2", "uec.replay_min_size=4",
        "weight_decay=0.0",
    ])
    budget = args.uec_rounds * args.B * (args.G + args.Gx)  # an upper bound: stops after uec_rounds at most
    t_eval = summary["eval_before"]["time_s"]
    left = lambda: args.deadline - (time.perf_counter() - t_all)  # noqa: E731
    uec_cap = max(30.0, min(args.uec_time, (left() - 2 * t_eval - 20) / 2))
    uec = run_phase("uec", uec_cfg, model, tok, task, probe, args, budget, uec_cap, out)
    uec_rollouts = uec["totals"]["rollouts/regular"] + uec["totals"]["rollouts/explore"]
    summary["uec"] = uec
    save(summary, out)
    summary["eval_uec"] = do_eval(model, tok, task, args, "uec", out)

    model.load_state_dict(init)
    grpo_cfg = build_config(overrides=base + ["sampler=hard_prompt", "uec.explore_num_generations=0"])
    grpo_cap = max(30.0, min(args.grpo_time, left() - t_eval - 45))
    grpo = run_phase("grpo", grpo_cfg, model, tok, task, probe, args, uec_rollouts, grpo_cap, out)
    summary["grpo"] = grpo
    save(summary, out)
    summary["eval_grpo"] = do_eval(model, tok, task, args, "grpo", out)
    summary["total_time_s"] = time.perf_counter() - t_all
    save(summary, out)
    plot(summary, out / "curves.png")
    print("total", round(summary["total_time_s"], 1), "s; rollouts uec", uec_rollouts, "grpo",
          grpo["totals"]["rollouts/regular"], flush=True)


def save(summary, out):
    """Write summary.json (completion samples dropped from the per-problem eval rows)."""
    slim = json.loads(json.dumps(summary))
    for k in ("eval_before", "eval_uec", "eval_grpo"):
        for p in slim.get(k, {}).get("per_problem", []):
            p.pop("sample", None)
    (out / "summary.json").write_text(json.dumps(slim, indent=1))


def plot(summary, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    for name, color in (("grpo", "tab:blue"), ("uec", "tab:red")):
        rounds = summary[name]["rounds"]
        x = [r["uec/total/rollouts/regular"] + r["uec/total/rollouts/explore"] for r in rounds]
        axes[0].plot(x, [r["uec/regular_pass_rate"] for r in rounds], "o-", color=color, label=name)
        axes[1].plot(x, [r["uec/hard_prompt_frac"] for r in rounds], "o-", color=color, label=name)
        axes[2].plot(x, [r["probe_entropy"] for r in rounds], "o-", color=color, label=name)
    axes[0].set_title("regular-sample pass rate (T=1)")
    axes[1].set_title("hard-prompt fraction (0/G pass)")
    axes[2].set_title("probe token entropy (nats)")
    for ax in axes[:3]:
        ax.set_xlabel("rollouts generated (cumulative)")
        ax.legend()
    ks = [k for k in KS if f"pass@{k}" in summary["eval_before"]]
    for tag, color in (("eval_before", "gray"), ("eval_grpo", "tab:blue"), ("eval_uec", "tab:red")):
        axes[3].plot(ks, [summary[tag][f"pass@{k}"] for k in ks], "o-", color=color, label=tag[5:])
    axes[3].set_xscale("log", base=2)
    axes[3].set_title("held-out pass@k (n=16)")
    axes[3].set_xlabel("k")
    axes[3].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()

"""IB-TPO benchmark: trajectories per generated-token budget (tree vs flat group), wall-clock per
trajectory, and optionally a short GRPO vs IB-TPO training comparison at a matched token budget.

Part 1 (``docs/ib_tpo.md`` §2.5, §7.1 on a real model): for each repetition, draw P prompts, sample a
flat group of G completions per prompt, then grow one IB tree per prompt with a decode-token budget
equal to the flat group's measured cost per prompt. Reports complete trajectories per 1k generated
tokens for both, their ratio (target ≥ 1.4, paper 1.5), and seconds per trajectory.

Part 2 (``--train-steps > 0``): GRPO and IB-TPO trainers, same seed and prompts order, each for
``--train-steps`` optimizer steps; logs reward, prompt-level Eff-Rate, entropy and IB-Score per step.

Run the real model under the shared lock (house rule), e.g.::

    HF_HUB_OFFLINE=1 flock /tmp/rlvr_heavy.lock .venv/bin/python benchmarks/bench_tree.py \\
        --out runs/bench_tree/result.json

``--model tiny`` runs the same code on the tiny random model (seconds; a smoke test).
``--model testbed:v2l`` (any ``testbed:<preset>``) measures part 1 on the testbed policy with the recipes
``ib_tpo`` + ``testbed_v2l`` (the task, lengths and step split of the IB-TPO arms of the issue-29
pre-registration) and the tree with root branching on and off (``ib_tpo.allow_root_branch``), e.g.::

    flock /tmp/rlvr-heavy.lock python benchmarks/bench_tree.py --model testbed:v2l --prompts 8 --reps 4 \
        --out docs/results/replication/bench_tree_v2l.json
Prints a table and writes JSON. Timings are measurements, never test assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from rlvr.config import build_config  # noqa: E402
from rlvr.engines.hf import HFEngine  # noqa: E402
from rlvr.rewards import Scorer  # noqa: E402
from rlvr.samplers.group import GroupSampler, PromptEncoder  # noqa: E402
from rlvr.variants.ib_tpo.sampler import IBTreeSampler  # noqa: E402
from rlvr.tasks import build_task  # noqa: E402
from rlvr.types import SamplingParams  # noqa: E402


def load(model_name: str, cfg):
    if model_name == "tiny":
        from rlvr.models.tiny import build_tiny_model

        return build_tiny_model(0)
    from rlvr.models import load_policy

    return load_policy(cfg.model)


def is_testbed(model_name: str) -> bool:
    """``testbed:<preset>`` models run on the testbed recipe instead of reasoning-gym."""
    return model_name.startswith("testbed:")


def tree_variants(args) -> dict[str, list[str]]:
    if is_testbed(args.model):  # the recipe's step split (one step per chain step); root branching on / off
        return {"tree_paragraph": [], "tree_noroot": ["ib_tpo.allow_root_branch=false"]}
    common = [f"ib_tpo.min_remaining_tokens={args.r_min}", f"ib_tpo.step_min_tokens={args.step_min}"]
    return {
        "tree_paragraph": common + ["ib_tpo.step_split=paragraph"],
        "tree_fixed": common + ["ib_tpo.step_split=fixed", f"ib_tpo.fixed_step_tokens={args.fixed_step}"],
        # fewer, wider rounds: on a latency-bound CPU the number of sequential decode steps sets the time
        "tree_fixed_wide": common + ["ib_tpo.step_split=fixed", f"ib_tpo.fixed_step_tokens={args.fixed_step}",
                                     f"ib_tpo.branches_per_round={args.wide_branches}"],
    }


def part1(args, model, tok, base: list[str], out: dict) -> None:
    cfg = build_config(args.configs, base)
    task = build_task(cfg.task)
    problems = task.problems("train")
    engine = HFEngine(model, tok)
    enc = PromptEncoder(tok, cfg.task.system_prompt or task.system_prompt, cfg.max_prompt_length)
    scorer = Scorer(task, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    G, P = cfg.num_generations, args.prompts
    flat = GroupSampler(engine, enc, pad)
    rows = []
    variants = tree_variants(args)
    for rep in range(args.reps):
        probs = problems[rep * P : (rep + 1) * P]
        params = SamplingParams(temperature=1.0, max_new_tokens=cfg.max_completion_length, seed=1000 + rep)
        t = time.perf_counter()
        fb = flat.sample(probs, G, params)
        t_flat = time.perf_counter() - t
        scorer.score(fb)
        flat_tokens = int(fb.completion_mask.sum())
        row = {
            "rep": rep, "flat_traj": len(fb), "flat_tokens": flat_tokens, "flat_s": t_flat,
            "flat_reward": float(fb.rewards.mean()), "flat_truncated": float(fb.is_truncated.float().mean()),
            "flat_mean_len": float(fb.completion_lengths.float().mean()),
        }
        rows.append(row)
        out["part1"] = {"rows": rows}
        save(args, out)
        print(json.dumps({k: v for k, v in row.items()}), flush=True)
        for name, ov in variants.items():
            tcfg = build_config(args.configs, base + ov)
            sampler = IBTreeSampler(
                engine, enc, scorer, tok, pad, tcfg.ib_tpo, tcfg.max_completion_length,
                token_budget=int(round(flat_tokens / P)), seed=rep,
            )
            t = time.perf_counter()
            tb = sampler.sample(probs, G, params)
            t_tree = time.perf_counter() - t
            m = tb.metrics
            steps = [len(ti["parent"]) - 1 for ti in tb.tree_index]  # plain dicts (TreeIndex fields)
            row.update({
                f"{name}_traj": len(tb), f"{name}_tokens": int(m["ib/tokens_decode"]), f"{name}_s": t_tree,
                f"{name}_reward": float(tb.rewards.mean()), f"{name}_rounds": m["ib/rounds_used"],
                f"{name}_fork_frac": m["ib/branch_depth_frac"], f"{name}_discarded": m["ib/tokens_discarded"],
                f"{name}_prefill": m["ib/tokens_prefill"], f"{name}_nodes_per_tree": sum(steps) / len(steps),
                f"{name}_eff_rate_prompt": m.get("ib/eff_rate_prompt", float("nan")),  # set by the advantage step
                f"{name}_ib_score": m.get("ib/score_mean", float("nan")),
            })
            if rep == 0:
                row[f"{name}_example_path"] = tb.texts[0][:600]
            save(args, out)
            print(json.dumps({k: v for k, v in row.items() if k.startswith(name) and "example" not in k}), flush=True)
    summ = {}
    ft = sum(r["flat_traj"] for r in rows)
    ftok = sum(r["flat_tokens"] for r in rows)
    fs = sum(r["flat_s"] for r in rows)
    summ["flat"] = {"traj_per_1k_tokens": 1000 * ft / ftok, "s_per_traj": fs / ft, "traj": ft, "tokens": ftok, "s": fs}
    for name in [v for v in variants if all(f"{v}_traj" in r for r in rows)]:
        tt = sum(r[f"{name}_traj"] for r in rows)
        ttok = sum(r[f"{name}_tokens"] for r in rows)
        ts = sum(r[f"{name}_s"] for r in rows)
        summ[name] = {
            "traj_per_1k_tokens": 1000 * tt / ttok, "s_per_traj": ts / tt, "traj": tt, "tokens": ttok, "s": ts,
            "traj_ratio_vs_flat_per_token": (tt / ttok) / (ft / ftok), "s_per_traj_ratio_vs_flat": (ts / tt) / (fs / ft),
        }
    out["part1"] = {"rows": rows, "summary": summ}
    save(args, out)
    print("\n| sampler | trajectories | decode tokens | traj / 1k tok | ratio vs flat | s / traj |")
    print("|---|---|---|---|---|---|")
    for name, s in summ.items():
        print(f"| {name} | {s['traj']} | {s['tokens']} | {s['traj_per_1k_tokens']:.2f} | "
              f"{s.get('traj_ratio_vs_flat_per_token', 1.0):.2f} | {s['s_per_traj']:.3f} |", flush=True)


def part2(args, model_name: str, base: list[str], out: dict, deadline: float) -> None:
    from rlvr.trainer.trainer import Trainer

    arms = {
        "grpo": ["sampler=group", "steps_per_generation=1"],
        "ib_tpo": ["sampler=tree", "adv_estimator=ib_tree", "steps_per_generation=1",
                   *tree_variants(args)["tree_paragraph" if args.train_split == "paragraph" else "tree_fixed"]],
    }
    res = {}
    import shutil

    for i, (arm, ov) in enumerate(arms.items()):
        arm_deadline = time.perf_counter() + (deadline - time.perf_counter()) / (len(arms) - i)  # equal shares
        model, tok = load(model_name, build_config(overrides=base))
        outdir = tempfile.mkdtemp(prefix=f"bench_tree_{arm}_")
        cfg = build_config(overrides=base + ov + [
            f"max_steps={args.train_steps}", f"learning_rate={args.lr}", "logging.progress=false",
            "logging.tensorboard=false", f"logging.output_dir={outdir}",
        ])
        tr = Trainer(cfg, model, tok, build_task(cfg.task))
        hist = []

        def cb(trainer, m, hist=hist):
            hist.append({k: m.get(k) for k in (
                "reward/mean", "reward/frac_zero_std_groups", "actor/entropy", "ib/score_mean", "ib/H_mean",
                "ib/I_mean", "ib/eff_rate_prompt", "ib/leaves_per_tree", "ib/tokens_decode", "timing/generate_s", "timing/step_s",
            )} | {"gen_tokens": m.get("perf/generated_tokens_per_s", 0) * m.get("timing/generate_s", 0)})
            if time.perf_counter() > arm_deadline:
                trainer.cfg.max_steps = max(trainer.global_step, 1)

        tr.callbacks.append(cb)
        tr.train()
        shutil.rmtree(outdir, ignore_errors=True)
        res[arm] = hist
        out["part2"] = res
        save(args, out)
        print(arm, json.dumps(hist), flush=True)


def synthetic(out: dict, seeds: int = 5) -> None:
    """Spec §7.1 / §2.5 in simulation: an engine whose every path is 20 equal-cost steps (80 tokens),
    G = 16, a budget of 16 full chains per tree; leaves per tree for several branch rules and M."""
    import random as _random
    from types import SimpleNamespace

    from rlvr.variants.ib_tpo.config import IBTPOConfig
    from rlvr.tasks.base import Problem
    from rlvr.types import Generation

    class Engine:
        def __init__(self, seed):
            self.rng = _random.Random(seed)

        def generate(self, requests, params):
            res = []
            for r in requests:
                n = 80 - (len(r.context_ids) - 5)
                res.append([Generation([self.rng.randrange(10, 99) for _ in range(n - 1)] + [2],
                                       [-self.rng.random() * 2] * n, "eos") for _ in range(r.n)])
            return res

    class Coin:
        task = SimpleNamespace(name="coin")

        def __init__(self, seed):
            self.rng = _random.Random(seed)

        def score(self, b):
            ok = [self.rng.random() < 0.5 for _ in range(len(b))]
            b.rewards, b.correct = torch.tensor(ok, dtype=torch.float32), torch.tensor(ok)
            b.texts, b.feedback = [""] * len(b), [None] * len(b)
            return SimpleNamespace(errors=0)

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return ""

    probs = [Problem(uid=f"p{i}", question="q", answer="1") for i in range(16)]
    rows = {}
    for label, kw in {
        "random, M=8": {"branch_score": "random"},
        "ib, M=8": {"branch_score": "ib"},
        "entropy, M=8": {"branch_score": "entropy"},
        "random, M=4": {"branch_score": "random", "num_initial_chains": 4, "leaf_target_factor": 2.0},
        "random, M=12": {"branch_score": "random", "num_initial_chains": 12, "leaf_target_factor": 2.0},
    }.items():
        leaves = []
        for seed in range(seeds):
            ib = IBTPOConfig(step_split="fixed", fixed_step_tokens=4, min_remaining_tokens=4, branches_per_round=4,
                             **kw)
            smp = IBTreeSampler(Engine(seed), lambda p: [100] * 5, Coin(seed), Tok(), 0, ib, 80,
                                token_budget=16 * 80, seed=seed)
            trees = smp.grow(probs, 16, SamplingParams(max_new_tokens=80, seed=seed))
            leaves += [len(t.leaves) for t in trees]
        M = kw.get("num_initial_chains", 8)
        rows[label] = {"leaves_per_tree": sum(leaves) / len(leaves), "ratio_vs_flat": sum(leaves) / len(leaves) / 16,
                       "predicted_2G_minus_M": 32 - M}
    out["synthetic"] = rows
    print("\n| synthetic (20 equal steps, G=16, budget 16 chains) | leaves/tree | vs flat | 2G-M |")
    print("|---|---|---|---|")
    for k, r in rows.items():
        print(f"| {k} | {r['leaves_per_tree']:.1f} | {r['ratio_vs_flat']:.2f} | {r['predicted_2G_minus_M']} |")


def plot(result_json: str, png: str) -> None:
    """Part-2 curves (reward, prompt-level Eff-Rate, entropy, IB-Score per step) as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = json.loads(Path(result_json).read_text()).get("part2", {})
    keys = [("reward/mean", "reward"), ("eff_rate", "Eff-Rate (prompt)"), ("actor/entropy", "entropy (nats/token)"),
            ("ib/score_mean", "IB-Score (tree only)")]
    fig, axes = plt.subplots(1, 4, figsize=(14, 3))
    for arm, hist in res.items():
        steps = list(range(1, len(hist) + 1))
        for ax, (k, title) in zip(axes, keys):
            if k == "eff_rate":
                ys = [1 - h["reward/frac_zero_std_groups"] if h.get("reward/frac_zero_std_groups") is not None else None
                      for h in hist]
            else:
                ys = [h.get(k) for h in hist]
            if any(y is not None for y in ys):
                ax.plot(steps, [float("nan") if y is None else y for y in ys], marker="o", label=arm,
                        color={"grpo": "C0", "ib_tpo": "C1"}.get(arm))
            ax.set_title(title)
            ax.set_xlabel("optimizer step")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(png, dpi=80)


def save(args, out: dict) -> None:
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=float))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default", help="default (SmolLM2-135M-Instruct), tiny or testbed:<preset>")
    ap.add_argument("--task", default="chain_sum")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-len", type=int, default=96)
    ap.add_argument("--r-min", type=int, default=16)
    ap.add_argument("--step-min", type=int, default=8)
    ap.add_argument("--fixed-step", type=int, default=16)
    ap.add_argument("--wide-branches", type=int, default=4, help="branches per round of the tree_fixed_wide variant")
    ap.add_argument("--train-steps", type=int, default=0)
    ap.add_argument("--train-len", type=int, default=64)
    ap.add_argument("--train-prompts", type=int, default=4)
    ap.add_argument("--train-split", default="paragraph")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--time-limit", type=float, default=570.0, help="part 2 stops after this many seconds in all")
    ap.add_argument("--out", default="runs/bench_tree/result.json")
    ap.add_argument("--synthetic", action="store_true", help="only the no-model equal-cost simulation (seconds)")
    ap.add_argument("--plot", default=None, help="only plot part 2 of an existing --out JSON into this PNG")
    args = ap.parse_args(argv)
    if args.plot:
        plot(args.out, args.plot)
        return 0
    if args.synthetic:
        out = {"synthetic_note": "no model: equal-cost engine, coin-flip rewards"}
        synthetic(out)
        save(args, out)
        return 0
    t0 = time.perf_counter()
    torch.manual_seed(0)
    base = [
        f"model.name_or_path={args.model}", "task.type=reasoning_gym", f"task.name={args.task}",
        f"num_generations={args.G}", f"generation_batch_size={args.G * args.prompts}",
        f"max_completion_length={args.max_len}", "max_prompt_length=256", "per_device_train_batch_size=8",
    ]
    args.configs = []
    if is_testbed(args.model):  # task, lengths and step split from the recipes; the sizes from the flags
        import rlvr.testbed  # noqa: F401 (registers the testbed model source and task type)

        if args.train_steps > 0:
            ap.error("--train-steps is for reasoning-gym models; train testbed arms with rlvr compare")
        args.configs = ["ib_tpo", "testbed_v2l"]
        base = [f"model.name_or_path={args.model}", f"num_generations={args.G}",
                f"generation_batch_size={args.G * args.prompts}", "steps_per_generation=1",
                f"per_device_train_batch_size={args.G * args.prompts}"]  # no update here: one batch
    out: dict = {"args": vars(args), "torch_threads": torch.get_num_threads()}
    model, tok = load(args.model, build_config(args.configs, base))
    out["load_s"] = time.perf_counter() - t0
    if args.reps > 0:
        part1(args, model, tok, base, out)
    out["part1_s"] = time.perf_counter() - t0
    save(args, out)
    if args.train_steps > 0:
        drop = ("max_completion_length", "generation_batch_size")
        tb = [o for o in base if not o.startswith(drop)] + [
            f"max_completion_length={args.train_len}", f"generation_batch_size={args.G * args.train_prompts}"]
        part2(args, args.model, tb, out, t0 + args.time_limit)
    out["total_s"] = time.perf_counter() - t0
    save(args, out)
    print(f"wrote {args.out} ({out['total_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Command line: ``rlvr train``, ``rlvr eval``, ``rlvr plot``.

Configuration errors exit with code 2 and a message naming the key, before any model is loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Sequence

from rlvr.errors import ConfigError, DataError, ModelLoadError, RlvrError

EXIT_CONFIG = 2
EXIT_RUNTIME = 1


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", action="append", default=[], metavar="FILE",
                   help="YAML config or built-in recipe name (grpo, grpo_paper, dr_grpo, dapo, gspo, demo, testbed, "
                   "mu_grpo, mu_grpo_small, uec_rl, ib_tpo, fbos_rl); repeatable, later wins")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides, e.g. learning_rate=1e-5 task.name=basic_arithmetic")


def build_parser() -> argparse.ArgumentParser:
    """The ``rlvr`` argument parser."""
    parser = argparse.ArgumentParser(prog="rlvr", description="Reinforcement learning from verifiable rewards.")
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a policy")
    _common(t)
    t.add_argument("--resume", nargs="?", const="auto", default=None, metavar="auto|force|PATH",
                   help="continue from the latest checkpoint in the output dir (auto), ignoring config changes "
                        "(force), or from a given checkpoint folder")
    e = sub.add_parser("eval", help="pass@k and mean reward on the held-out split")
    _common(e)
    e.add_argument("--checkpoint", help="model folder to evaluate (default: the config's model)")
    e.add_argument("--tag", default="eval", help="result file name: OUTPUT_DIR/eval_<tag>.json")
    e.add_argument("--out", help="explicit JSON output path")
    e.add_argument("--limit", type=_positive_int, help="evaluate only the first N problems (N >= 1)")
    pl = sub.add_parser("plot", help="PNG curves of a run directory")
    pl.add_argument("run_dir")
    pl.add_argument("--out", help="PNG path (default RUN_DIR/curves.png)")
    cp = sub.add_parser("compare", help="several arms x seeds under an equal budget, then a Markdown + PNG report")
    cp.add_argument("--spec", help="comparison YAML: arms, seeds, budget, output_dir, base_configs, common_configs, "
                    "common, eval {num_samples, ks, limit, baseline}, max_steps_cap, max_idle_draws")
    cp.add_argument("--arm", action="append", default=[], metavar="'NAME=RECIPE[+RECIPE] [k=v ...]'",
                    help="an arm: recipe(s) plus overrides; repeatable")
    cp.add_argument("--seeds", help="comma-separated run seeds, e.g. 0,1,2")
    cp.add_argument("--budget", help="steps=N, rollouts=N or tokens=N (the same for every arm)")
    cp.add_argument("--out", help="comparison folder (finished runs in it are skipped)")
    cp.add_argument("--base", action="append", default=[], metavar="FILE", help="config applied before every arm's recipes")
    cp.add_argument("--common", action="append", default=[], metavar="FILE",
                    help="config applied after every arm's recipes (e.g. testbed); repeatable")
    cp.add_argument("--report-only", action="store_true", help="only re-render report.md and the plots")
    cp.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process (default 1)")
    cp.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides applied to every arm")
    return parser


def _load_config(args: argparse.Namespace):
    from rlvr.config import build_config
    from rlvr.tasks import validate_task_config
    from rlvr.trainer.components import validate_components

    resume = getattr(args, "resume", None)
    if resume and "=" in resume and not Path(resume).exists():  # `--resume key=value`: an override, not a path
        args.overrides = [resume, *args.overrides]
        args.resume = "auto"
    cfg = build_config(args.config, args.overrides)
    validate_components(cfg)
    validate_task_config(cfg.task)
    return cfg


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {n}")
    return n


def _resume_target(cfg, mode: str):
    """The checkpoint folder ``--resume MODE`` continues from, or None to start from scratch.

    ``auto``: the latest complete ``checkpoint-N`` in the output dir; ``force``: the same, ignoring
    config and data changes; anything else: that checkpoint folder. Unless forced, the saved config
    (``max_steps``, ``save_steps``, ``logging``, ``eval`` ignored) and the content hashes of the task's
    data files (``task.path``, ``task.eval_path``) must match the current ones.

    Raises:
        ConfigError: the folder is not a checkpoint, or the config or data changed (every difference
            is named, old -> new).
    """
    from rlvr.trainer.checkpoint import STATE_FILE, latest_checkpoint, resume_differences

    out = Path(cfg.logging.output_dir)
    if mode in ("auto", "force"):
        ckpt = latest_checkpoint(out)
        if ckpt is None:
            print(f"rlvr: no checkpoint in {out}; starting from scratch", file=sys.stderr)
            return None
    else:
        ckpt = Path(mode)
        if not (ckpt / STATE_FILE).exists():
            raise ConfigError(f"--resume {mode}: not an rlvr checkpoint folder (no {STATE_FILE})")
    if mode != "force":
        saved = json.loads((ckpt / STATE_FILE).read_text())
        changed = resume_differences(saved, cfg)
        if changed:
            raise ConfigError(
                f"--resume: refusing to resume from {ckpt}: the config or data changed since it was written:\n  "
                + "\n  ".join(changed) + "\nUse --resume force to continue anyway."
            )
    return ckpt


def cmd_train(args: argparse.Namespace) -> int:
    """``rlvr train``: validate everything cheap, then load the model and train."""
    cfg = _load_config(args)
    ckpt = _resume_target(cfg, args.resume) if args.resume else None
    from rlvr.models import load_policy
    from rlvr.tasks import build_task
    from rlvr.trainer.checkpoint import load_checkpoint
    from rlvr.trainer.trainer import Trainer

    from rlvr.engines.factory import check_engine_config

    task = build_task(cfg.task)
    task.problems("train")  # surface data errors before the model loads
    check_engine_config(cfg)
    model, tokenizer = load_policy(cfg.model)
    out = Path(cfg.logging.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(_yaml(cfg.model_dump(mode="json")))
    trainer = Trainer(cfg, model, tokenizer, task)
    try:
        if ckpt is not None:
            load_checkpoint(trainer, ckpt)
            print(f"rlvr: resumed from {ckpt} at step {trainer.global_step}", file=sys.stderr)
        last = trainer.train()
    finally:
        trainer.close()  # stops a vLLM server the run started (also on Ctrl-C and errors)
    shown = {k: round(v, 4) for k, v in last.items() if k in ("reward/mean", "reward/pass_rate", "actor/entropy")}
    print(f"rlvr: finished {trainer.global_step} steps in {out}; last: {shown}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """``rlvr eval``: pass@k on the held-out split, written as JSON."""
    cfg = _load_config(args)
    from rlvr.eval.evaluate import evaluate, write_eval
    from rlvr.models import load_policy
    from rlvr.tasks import build_task

    task = build_task(cfg.task)
    task.problems("eval")
    model_cfg = cfg.model.model_copy(update={"name_or_path": args.checkpoint}) if args.checkpoint else cfg.model
    if args.checkpoint and not Path(args.checkpoint).exists():
        raise ModelLoadError(f"--checkpoint {args.checkpoint}: no such folder")
    from rlvr.engines.factory import build_engine, check_engine_config

    check_engine_config(cfg)
    model, tokenizer = load_policy(model_cfg)
    e = cfg.eval
    engine = build_engine(cfg, model, tokenizer, cfg.logging.output_dir) if cfg.engine == "vllm" else None
    try:
        result = evaluate(
            model, tokenizer, task, num_samples=e.num_samples, ks=e.ks, temperature=e.temperature, top_p=cfg.top_p,
            max_new_tokens=cfg.max_completion_length, max_prompt_length=cfg.max_prompt_length,
            system_prompt=cfg.task.system_prompt, prompts_per_batch=max(1, e.batch_size // e.num_samples),
            seed=cfg.seed, limit=args.limit, engine=engine,
        )
    finally:
        if engine is not None:
            engine.close()
    result["model"] = args.checkpoint or cfg.model.name_or_path
    path = Path(args.out) if args.out else Path(cfg.logging.output_dir) / f"eval_{args.tag}.json"
    write_eval(result, path)
    summary = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in result.items() if k != "per_problem"}
    print(json.dumps(summary, indent=2))
    print(f"rlvr: wrote {path}", file=sys.stderr)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    """``rlvr plot RUN_DIR``: write PNG curves."""
    from rlvr.eval.plot import plot_run

    path = plot_run(args.run_dir, args.out)
    print(f"rlvr: wrote {path}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """``rlvr compare``: run every unfinished arm x seed under the budget, then write the report."""
    import yaml

    from rlvr.compare.harness import Arm, Budget, CompareSpec, run_compare
    from rlvr.compare.report import write_report

    if args.spec and not Path(args.spec).is_file():
        raise ConfigError(f"--spec {args.spec}: no such file (a comparison YAML: arms, seeds, budget, ...)")
    d = yaml.safe_load(Path(args.spec).read_text()) if args.spec else {}
    if args.spec and not isinstance(d, dict):
        raise ConfigError(f"--spec {args.spec}: expected a mapping")
    spec = CompareSpec.from_dict({**d, "budget": d.get("budget", args.budget or "steps=1"),
                                  "arms": d.get("arms") or ["grpo"]})
    if args.arm:
        spec.arms = [Arm.parse(a) for a in args.arm]
    if args.seeds:
        try:
            spec.seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"--seeds {args.seeds!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if args.budget:
        spec.budget = Budget.parse(args.budget)
    elif not d.get("budget"):
        raise ConfigError("rlvr compare needs a budget: --budget steps=N|rollouts=N|tokens=N or budget: in --spec")
    if args.out:
        spec.output_dir = args.out
    spec.base_configs += args.base
    spec.common_configs += args.common
    spec.common += args.overrides
    spec.__post_init__()
    if args.report_only:
        path = write_report(spec.output_dir, arms=spec.report_arms(), seeds=spec.seeds, budget=spec.budget)
    else:
        run_compare(spec, log=lambda m: print(m, file=sys.stderr, flush=True), jobs=args.jobs)
        path = Path(spec.output_dir) / "report.md"
    print(f"rlvr: wrote {path}")
    return 0


def _yaml(d: dict) -> str:
    import yaml

    return yaml.safe_dump(d, sort_keys=False)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code (2 for configuration errors)."""
    args = build_parser().parse_args(argv)
    if args.command != "plot" and "HF_HUB_OFFLINE" not in os.environ:
        os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    warnings.filterwarnings("once", category=UserWarning)
    handlers = {"train": cmd_train, "eval": cmd_eval, "plot": cmd_plot, "compare": cmd_compare}
    try:
        return handlers[args.command](args)
    except ConfigError as exc:
        print(f"rlvr: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (DataError, ModelLoadError, FileNotFoundError) as exc:
        print(f"rlvr: {exc}", file=sys.stderr)
        return EXIT_CONFIG if isinstance(exc, DataError) else EXIT_RUNTIME
    except RlvrError as exc:
        print(f"rlvr: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    except KeyboardInterrupt:
        print("rlvr: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The ``rlvr`` argument parser: every subcommand's flags, and ``key=value`` overrides anywhere on the line."""

from __future__ import annotations

import argparse
from typing import Sequence

from rlvr.cli.common import _nonnegative_float, _nonnegative_int, _positive_int


def _common(p: argparse.ArgumentParser) -> None:
    from rlvr.config import RECIPES_DIR

    p.add_argument("--config", "-c", action="append", default=[], metavar="FILE",
                   help="YAML config or built-in recipe name ("
                   + ", ".join(sorted(f.stem for f in RECIPES_DIR.glob("*.yaml")))
                   + "); repeatable, later wins")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides, e.g. learning_rate=1e-5 task.name=basic_arithmetic")


def _plugin_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plugin", action="append", default=[], dest="plugins", metavar="MODULE",
                   help="import MODULE (pkg.module or path/to/file.py) first, so the parts and config sections "
                        "it registers are known; repeatable (also: plugins: [...] in the config)")


def build_parser() -> argparse.ArgumentParser:
    """The ``rlvr`` argument parser."""
    from rlvr import __version__

    parser = argparse.ArgumentParser(prog="rlvr", description="Reinforcement learning from verifiable rewards.")
    parser.add_argument("--version", action="version", version=f"rlvr {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a policy")
    _common(t)
    t.add_argument("--resume", nargs="?", const="auto", default=None, metavar="auto|force|PATH",
                   help="continue from the latest checkpoint in the output dir (auto), ignoring config changes "
                        "(force), or from a given checkpoint folder")
    t.add_argument("--overwrite", action="store_true",
                   help="the output dir holds an earlier run: delete its training files (metrics, checkpoints, "
                        "final/, tb/, config.yaml; nothing else) and start over")
    e = sub.add_parser("eval", help="pass@k, maj@k and mean reward (with 95%% intervals) on the held-out split")
    _common(e)
    e.add_argument("--checkpoint", action="append", default=[], metavar="MODEL|RUN_DIR|base",
                   help="model folder or LoRA adapter folder to evaluate; a run directory means its checkpoint-N/ (by step) and final/; "
                        "'base' is the config's model; repeatable: one table row per model (default: the config's model)")
    e.add_argument("--tag", default="eval", help="result file names: OUTPUT_DIR/eval_<tag>.{json,md,samples.jsonl}")
    e.add_argument("--out", help="explicit JSON output path (the .md table and .samples.jsonl go next to it)")
    e.add_argument("--overwrite", action="store_true",
                   help="replace an earlier evaluation's files of the same --tag / --out (refused without it)")
    e.add_argument("--limit", type=_positive_int, help="evaluate only the first N problems of the eval split (N >= 1)")
    e.add_argument("--offset", type=_nonnegative_int, default=0,
                   help="skip the first N problems (a shard: --offset A --limit N evaluates problems A+1..A+N); "
                        "combine shards with rlvr eval-merge")
    em = sub.add_parser("eval-merge", help="one table + JSON from the per-sample JSONL files of eval shards")
    em.add_argument("samples", nargs="+", metavar="X.samples.jsonl", help="shards' per-sample files, in split order")
    em.add_argument("--out", required=True, help="merged JSON path (the .md table and .samples.jsonl go next to it)")
    em.add_argument("--allow-mixed-precision", action="store_true",
                    help="merge shards evaluated at different precisions (refused by default; the result says 'mixed')")
    ex = sub.add_parser("export", help="write a LoRA adapter folder merged into its base as a Hugging Face folder")
    ex.add_argument("folder", help="a LoRA run's final/ or checkpoint-N/ (peft adapter format)")
    ex.add_argument("--merge", action="store_true", required=True,
                    help="merge the adapter into the base weights (required: the only export there is)")
    ex.add_argument("--out", required=True, help="new folder for the merged model (must not exist or be empty)")
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
    cp.add_argument("--jobs", type=_positive_int, default=1, help="runs at once, each in its own process (default 1)")
    cp.add_argument("--stop-after", type=_nonnegative_float, metavar="SECONDS",
                    help="end this call at the first optimizer step after SECONDS: the run in progress writes a "
                         "checkpoint and resumes on the next call (fits long runs into time-limited slots; --jobs 1)")
    cp.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides applied to every arm")
    dr = sub.add_parser("doctor", help="which code sandbox a run would get here and why (bwrap probe, user "
                        "namespaces, uids, interpreter, local's uid pool), plus torch threads and bf16; exit 1 "
                        "when no isolating sandbox is available")
    _common(dr)
    for p in (t, e, em, ex, pl, cp, dr):
        _plugin_flag(p)
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``argv``; ``key=value`` overrides may stand anywhere (before, between or after the
    ``--config`` flags): they are collected in order and applied after every config file, so a
    later override of the same key wins."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    bad = [a for a in extra if a.startswith("-") or "=" not in a]
    if bad or (extra and not hasattr(args, "overrides")):
        parser.parse_args(argv)  # argparse's own error message (exit 2)
    if extra:
        # argparse gives the first run of positionals to ``overrides`` and the rest to ``extra``;
        # put them back in command-line order
        order = {a: i for i, a in reversed(list(enumerate(argv)))}
        args.overrides = sorted([*args.overrides, *extra], key=lambda a: order.get(a, 0))
    args.argv = list(argv)
    return args

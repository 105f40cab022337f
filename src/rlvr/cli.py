"""Command line: ``rlvr train``, ``rlvr eval``, ``rlvr export``, ``rlvr plot``, ``rlvr compare``.

Exit codes: 0 done; 1 a run-time failure (a model that cannot be loaded, a file that cannot be
written, more than half of a run's reward calls failed, non-finite updates); 2 bad configuration or
data, found before any model is loaded where possible; 3 a run stopped because no generation round
gave a trainable group for ``max_idle_rounds`` rounds; 130 / 143 stopped by SIGINT / SIGTERM after
writing a checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Sequence

from rlvr.errors import ConfigError, DataError, IdleRunError, ModelLoadError, RlvrError

EXIT_CONFIG = 2
EXIT_RUNTIME = 1
REWARD_FAILURE_LIMIT = 0.5
"""``rlvr train`` exits 1 when more than this fraction of the run's reward calls failed (error or timeout)."""
EXIT_IDLE = 3  # max_idle_rounds generation rounds without an update (a checkpoint was written)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", action="append", default=[], metavar="FILE",
                   help="YAML config or built-in recipe name ("
                   + ", ".join(sorted(f.stem for f in (Path(__file__).parent / "recipes").glob("*.yaml")))
                   + "); repeatable, later wins")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides, e.g. learning_rate=1e-5 task.name=basic_arithmetic")


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
    e.add_argument("--limit", type=_positive_int, help="evaluate only the first N problems of the eval split (N >= 1)")
    e.add_argument("--offset", type=_nonnegative_int, default=0,
                   help="skip the first N problems (a shard: --offset A --limit N evaluates problems A+1..A+N); "
                        "combine shards with rlvr eval-merge")
    em = sub.add_parser("eval-merge", help="one table + JSON from the per-sample JSONL files of eval shards")
    em.add_argument("samples", nargs="+", metavar="X.samples.jsonl", help="shards' per-sample files, in split order")
    em.add_argument("--out", required=True, help="merged JSON path (the .md table and .samples.jsonl go next to it)")
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
    cp.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides applied to every arm")
    return parser


def _load_config(args: argparse.Namespace):
    import rlvr.testbed  # noqa: F401 (registers the testbed's model source and task type)
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


def _int_at_least(lo: int):
    """An argparse ``type`` that accepts an integer >= ``lo`` and names what it expected otherwise."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {text!r}") from None
        if n < lo:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {n}")
        return n

    return parse


_nonnegative_int = _int_at_least(0)
_positive_int = _int_at_least(1)


def _resume_target(cfg, mode: str):
    """The checkpoint folder ``--resume MODE`` continues from, or None to start from scratch.

    ``auto``: the latest whole ``checkpoint-N`` in the output dir (newer ones that are incomplete or
    corrupt are reported by name and skipped); ``force``: the same, ignoring config and data changes;
    anything else: that checkpoint folder. Unless forced, the saved config (``max_steps``,
    ``save_steps``, ``logging``, ``eval`` ignored) and the content hashes of the task's data files
    (``task.path``, ``task.eval_path``) must match the current ones.

    Raises:
        ConfigError: the folder is not a checkpoint or is damaged, or the config or data changed
            (every difference is named, old -> new).
    """
    from rlvr.trainer.checkpoint import STATE_FILE, resume_differences
    from rlvr.trainer.run_dir import checkpoint_problems, find_resumable, refuse_restart_of_finished_run

    out = Path(cfg.logging.output_dir)
    if mode in ("auto", "force"):
        ckpt, skipped = find_resumable(out)
        for bad, problems in skipped:
            print(f"rlvr: skipping {bad}: incomplete or corrupt ({'; '.join(problems)})", file=sys.stderr)
        if ckpt is None:
            refuse_restart_of_finished_run(out)
            print(f"rlvr: no {'whole ' if skipped else ''}checkpoint in {out}; starting from scratch", file=sys.stderr)
            return None
        if skipped:
            print(f"rlvr: resuming from the previous whole checkpoint, {ckpt}", file=sys.stderr)
    else:
        ckpt = Path(mode)
        if not (ckpt / STATE_FILE).exists() and not (ckpt / ".complete").exists():
            raise ConfigError(f"--resume {mode}: not an rlvr checkpoint folder (no {STATE_FILE})")
        problems = checkpoint_problems(ckpt)
        if problems:
            raise ConfigError(f"--resume {mode}: the checkpoint is incomplete or corrupt:\n  " + "\n  ".join(problems))
    if mode != "force":
        saved = json.loads((ckpt / STATE_FILE).read_text())
        changed = resume_differences(saved, cfg)
        if changed:
            raise ConfigError(
                f"--resume: refusing to resume from {ckpt}: the config or data changed since it was written:\n  "
                + "\n  ".join(changed) + "\nUse --resume force to continue anyway."
            )
    return ckpt


def _prepare_output_dir(cfg, args: argparse.Namespace) -> Path:
    """Refuse an output dir that is a file, unwritable, or already holds a run (unless ``--resume``
    or ``--overwrite``); with ``--overwrite`` delete that run's training files. Runs before the model
    loads.

    Raises:
        OutputDirError: see above (exit 2); the message names the folder and the ways out.
    """
    from rlvr.errors import OutputDirError
    from rlvr.trainer.run_dir import check_writable_dir, describe, remove_run_artefacts, run_artefacts

    out = Path(cfg.logging.output_dir)
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"logging.output_dir={str(out)!r} is a file, not a folder: choose another logging.output_dir")
    old = run_artefacts(out)
    if old and args.overwrite:
        remove_run_artefacts(out)
        print(f"rlvr: --overwrite: deleted the earlier run's {describe(old)} in {out}", file=sys.stderr)
    elif old and not args.resume:
        raise OutputDirError(
            f"logging.output_dir {out} already holds a run ({describe(old)}). Continue it with --resume, "
            f"start over with --overwrite (deletes those training files, nothing else), or choose another "
            f"logging.output_dir."
        )
    return check_writable_dir(out)


def _resume_command(argv: Sequence[str]) -> str:
    """The command line that continues an interrupted ``rlvr train`` (``--resume`` added, ``--overwrite`` dropped)."""
    import shlex

    args = [a for a in argv if a != "--overwrite"]
    if not any(a == "--resume" or a.startswith("--resume=") for a in args):
        args.append("--resume")
    return "rlvr " + " ".join(shlex.quote(a) for a in args)


def cmd_train(args: argparse.Namespace) -> int:
    """``rlvr train``: validate everything cheap, then load the model and train.

    Returns 1 when more than :data:`REWARD_FAILURE_LIMIT` of the run's reward calls failed.
    """
    cfg = _load_config(args)
    from rlvr.loggers import check_report_to

    check_report_to(cfg.logging.sinks)  # a missing wandb/mlflow package: exit 2 before any model loads
    if args.overwrite and args.resume:  # before _resume_target, which would report on the folder first
        from rlvr.errors import OutputDirError

        raise OutputDirError("--overwrite and --resume contradict each other: continue the run in "
                             f"{cfg.logging.output_dir} (--resume) or delete it and start over (--overwrite)")
    ckpt = _resume_target(cfg, args.resume) if args.resume else None
    from rlvr.distributed import init_distributed, shutdown
    from rlvr.distributed.setup import local_config

    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if launched else 1
    local_cfg = local_config(cfg, world)  # batch geometry per rank: a ConfigError before anything starts
    from rlvr.engines.factory import check_engine_config
    from rlvr.tasks import build_task
    from rlvr.trainer.rollout import check_filter_metric

    task = build_task(cfg.task)
    task.problems("train")  # data errors (exit 2) before --overwrite deletes anything and before the model loads
    check_filter_metric(cfg, task)
    check_engine_config(cfg)
    from rlvr.models import check_model_path

    check_model_path(cfg.model)  # a mistyped model path must not cost the run --overwrite would delete
    if int(os.environ.get("RANK", "0")) == 0 or not launched:  # one rank owns the output dir
        _prepare_output_dir(cfg, args)
    try:
        env = init_distributed(cfg.device, backend=cfg.distributed.backend, timeout_s=cfg.distributed.timeout_s,
                               num_threads=cfg.distributed.num_threads)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        return _train(cfg, local_cfg, ckpt, env, task, args)
    finally:
        shutdown()


def _train(cfg, local_cfg, ckpt, env, task, args: argparse.Namespace | None = None) -> int:
    """Load the model, build this rank's trainer over ``task`` (built and checked by :func:`cmd_train`),
    resume, train (one process or one rank of a ``torchrun`` job; only rank 0 writes the output dir and
    prints)."""
    from rlvr.distributed import DataParallel
    from rlvr.distributed.setup import use_fsdp
    from rlvr.models import load_policy
    from rlvr.trainer.checkpoint import load_checkpoint
    from rlvr.trainer.lifecycle import RunInterrupted
    from rlvr.trainer.trainer import Trainer

    main_rank = env.rank == 0
    model, tokenizer = load_policy(cfg.model)
    out = Path(cfg.logging.output_dir)
    if main_rank:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(_yaml(cfg.model_dump(mode="json")))
    dp = None
    if env.distributed:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        dp = DataParallel(env, fsdp=use_fsdp(cfg, env.world_size), pad_token_id=int(pad))
        if main_rank:
            print(f"rlvr: {env.world_size} processes ({env.local_world_size} on this node), backend {env.backend}, "
                  f"device {env.device.type}, {env.threads} CPU thread(s) per process, "
                  f"{'FSDP2' if dp.fsdp else 'replicated'} policy, {local_cfg.generation_batch_size} completions "
                  f"per rank per round", file=sys.stderr)
    else:
        model.to(env.device)
    trainer = Trainer(local_cfg, model, tokenizer, task, dp=dp, run_config=cfg)
    try:
        resume = getattr(args, "resume", None)
        if ckpt is not None:
            load_checkpoint(trainer, ckpt)
            if main_rank:
                print(f"rlvr: resumed from {ckpt} at step {trainer.global_step}", file=sys.stderr)
        elif resume and main_rank and (out / "metrics.jsonl").exists():  # starting from scratch: step 1 is logged anew
            from rlvr.trainer.logger import _drop_rows_after

            _drop_rows_after(out / "metrics.jsonl", 0)
        try:
            last = trainer.train()
        except RunInterrupted as exc:
            if main_rank:
                print(f"rlvr: {exc}\nrlvr: to continue: {_resume_command(getattr(args, 'argv', ['train']))}",
                      file=sys.stderr)
            return exc.exit_code
    finally:
        trainer.close()  # stops a vLLM server the run started (also on Ctrl-C and errors)
    shown = {k: round(v, 4) for k, v in last.items() if k in ("reward/mean", "reward/pass_rate", "actor/entropy")}
    s = trainer.summary
    if s.failed_fraction > REWARD_FAILURE_LIMIT:
        if main_rank:
            print(f"rlvr: {s.errors + s.timeouts} of {s.calls} reward calls failed ({s.errors} errors, {s.timeouts} "
                  f"timeouts): the run's rewards are mostly zeros from failures, not from the verifier. Check "
                  f"task.reward_fn and reward_timeout_s (the first error is in the log above).", file=sys.stderr)
        return EXIT_RUNTIME
    if main_rank:
        print(f"rlvr: finished {trainer.global_step} steps in {out}; last: {shown}")
    return 0


def _check_eval_output(args: argparse.Namespace, cfg) -> Path:
    """Where ``rlvr eval`` writes, checked before any model loads.

    Raises:
        ConfigError: ``--tag`` holds a path separator, or the output folder cannot be written.
    """
    from rlvr.trainer.run_dir import check_writable_dir

    if any(sep in args.tag for sep in ("/", "\\", os.sep)) or args.tag in ("", ".", ".."):
        raise ConfigError(f"--tag {args.tag!r}: a tag is part of a file name (eval_<tag>.json) and may not hold a "
                          "path separator; use --out PATH to write elsewhere")
    path = Path(args.out) if args.out else Path(cfg.logging.output_dir) / f"eval_{args.tag}.json"
    if path.is_dir():
        raise ConfigError(f"--out {path}: is a directory (expected a JSON file path)")
    check_writable_dir(path.parent, "--out" if args.out else "logging.output_dir")
    return path


def cmd_eval(args: argparse.Namespace) -> int:
    """``rlvr eval``: pass@k, maj@k and mean reward of one or more models, as JSON + Markdown + JSONL.

    Everything cheap is checked before any model loads: the config, the task's data, the
    ``--checkpoint`` values and that the output files can be written. When the report cannot be
    written after all, the results are printed whole to stdout instead (exit 1), so they are not lost.
    """
    cfg = _load_config(args)
    from rlvr.eval.evaluate import evaluate
    from rlvr.eval.report import SamplesWriter, resolve_models, summary_row, write_report
    from rlvr.models import load_policy
    from rlvr.tasks import build_task

    path = _check_eval_output(args, cfg)
    task = build_task(cfg.task)
    n_eval = len(task.problems("eval"))
    if args.offset >= n_eval:
        raise ConfigError(f"--offset {args.offset}: the eval split has only {n_eval} problems")
    from rlvr.engines.factory import build_engine, check_engine_config

    check_engine_config(cfg)
    specs = resolve_models(args.checkpoint)
    json_path = path
    stem = json_path.with_suffix("") if json_path.suffix == ".json" else json_path
    md_path, samples_path = stem.with_name(stem.name + ".md"), stem.with_name(stem.name + ".samples.jsonl")
    try:
        writer = SamplesWriter(samples_path)
    except OSError as exc:
        raise ConfigError(f"--out {json_path}: cannot write the evaluation files there ({exc})") from None
    e = cfg.eval
    n_draw = 1 if e.temperature == 0 else e.num_samples
    if e.temperature == 0 and (e.num_samples > 1 or max(e.ks) > 1):
        print(f"rlvr: eval.temperature=0 is greedy decoding: 1 sample per problem (not eval.num_samples="
              f"{e.num_samples}); reporting k=1 only", file=sys.stderr)
    from rlvr.distributed.env import set_cpu_threads

    set_cpu_threads(cfg.distributed.num_threads, 1)  # distributed.num_threads / OMP_NUM_THREADS / all cores
    rows, results = [], []
    try:
        for spec in specs:
            if spec.path is not None:
                from rlvr.lora import load_checkpoint_policy

                model, tokenizer = load_checkpoint_policy(cfg.model, spec.path)  # a model folder or a LoRA adapter
            else:
                model, tokenizer = load_policy(cfg.model)
            writer.model = spec.label
            engine = build_engine(cfg, model, tokenizer, cfg.logging.output_dir) if cfg.engine == "vllm" else None
            try:
                result = evaluate(
                    model, tokenizer, task, num_samples=e.num_samples, ks=e.ks, temperature=e.temperature,
                    top_p=cfg.top_p, max_new_tokens=cfg.max_completion_length,
                    max_prompt_length=cfg.max_prompt_length, system_prompt=cfg.task.system_prompt,
                    prompts_per_batch=max(1, e.batch_size // n_draw), seed=cfg.seed, limit=args.limit, offset=args.offset,
                    progress=cfg.logging.progress, label=spec.label, on_problem=writer, engine=engine,
                )
            finally:
                if engine is not None:
                    engine.close()
            result["model"] = spec.path or cfg.model.name_or_path
            del model
            rows.append(summary_row(result, spec))
            results.append(result)
            try:
                write_report(rows, json_path, md_path, single=results[0] if len(specs) == 1 else None)
            except OSError as exc:
                lost = {**results[0], "rows": rows} if len(specs) == 1 else {"rows": rows, "results": results}
                print(json.dumps(lost, indent=2, default=str))
                print(f"rlvr: could not write {json_path} ({exc.strerror or exc}); the full results are printed "
                      "above", file=sys.stderr)
                return EXIT_RUNTIME
            r = rows[-1]
            shown = ", ".join(f"{m}={r[m]:.4f} [{r[f'ci95/{m}'][0]:.3f}, {r[f'ci95/{m}'][1]:.3f}]"
                              for m in (f"pass@{k}" for k in r["ks"]) if m in r)
            print(f"rlvr: {spec.label}: {r['problems']} problems x {r['num_samples']} sample(s): {shown}",
                  file=sys.stderr)
    finally:
        writer.close()
    if len(specs) == 1:
        summary = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in results[0].items() if k != "per_problem"}
        print(json.dumps(summary, indent=2))
    else:
        print(md_path.read_text())
    print(f"rlvr: wrote {json_path}, {md_path} and {samples_path}", file=sys.stderr)
    return 0


def cmd_eval_merge(args: argparse.Namespace) -> int:
    """``rlvr eval-merge A.samples.jsonl B.samples.jsonl --out X.json``: shards of one evaluation → one result
    (:func:`rlvr.eval.merge.write_merged`). Overlapping or inconsistent shards are a data error (exit 2)."""
    from rlvr.eval.merge import write_merged

    merged, md_path, samples_path = write_merged(args.samples, Path(args.out))
    shown = ", ".join(f"{m}={merged[m]:.4f} [{merged[f'ci95/{m}'][0]:.3f}, {merged[f'ci95/{m}'][1]:.3f}]"
                      for k in merged["ks"] for m in (f"pass@{k}", f"maj@{k}") if m in merged)
    print(md_path.read_text())
    print(f"rlvr: {merged['problems']} problems from {len(args.samples)} shard(s): {shown}", file=sys.stderr)
    print(f"rlvr: wrote {args.out}, {md_path} and {samples_path}", file=sys.stderr)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """``rlvr export FOLDER --merge --out DIR``: base + LoRA adapter merged into one HF model folder."""
    from rlvr.config import ModelConfig
    from rlvr.lora import export_merged

    path = export_merged(args.folder, args.out, ModelConfig())
    print(f"rlvr: wrote {path}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    """``rlvr plot RUN_DIR``: write PNG curves."""
    from rlvr.eval.plot import plot_run

    path = plot_run(args.run_dir, args.out)
    print(f"rlvr: wrote {path}")
    return 0


def _compare_spec(args: argparse.Namespace):
    """The comparison from ``--spec`` and the flags.

    Raises:
        ConfigError: no such spec file, a malformed spec (any bad value, named), no arm, no budget.
    """
    from rlvr.compare.harness import Arm, Budget, CompareSpec
    from rlvr.config import safe_load_unique

    where = f"--spec {args.spec}" if args.spec else "rlvr compare"
    if args.spec and not Path(args.spec).is_file():
        raise ConfigError(f"--spec {args.spec}: no such file (a comparison YAML: arms, seeds, budget, ...)")
    try:
        d = safe_load_unique(Path(args.spec).read_text(encoding="utf-8"), args.spec) if args.spec else {}
    except UnicodeDecodeError:
        raise ConfigError(f"--spec {args.spec}: not UTF-8 text (expected a YAML file)") from None
    if args.spec and not isinstance(d, dict):
        raise ConfigError(f"--spec {args.spec}: expected a mapping")
    if not args.arm and not d.get("arms"):
        raise ConfigError(f"{where}: no arm to run: give --arm 'NAME=RECIPE [key=value ...]' (repeatable) "
                          "or arms: in --spec")
    if not args.budget and not d.get("budget"):
        raise ConfigError("rlvr compare needs a budget: --budget steps=N|rollouts=N|tokens=N or budget: in --spec")
    try:
        spec = CompareSpec.from_dict({**d, "budget": d.get("budget", args.budget), "arms": d.get("arms") or ["_"]})
        if args.arm:
            spec.arms = [Arm.parse(a) for a in args.arm]
        if args.seeds:
            try:
                spec.seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
            except ValueError:
                raise ConfigError(f"--seeds {args.seeds!r}: expected comma-separated integers, e.g. 0,1,2") from None
        if args.budget:
            spec.budget = Budget.parse(args.budget)
    except ConfigError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ConfigError(f"{where}: malformed ({type(exc).__name__}: {exc})") from None
    if args.out:
        spec.output_dir = args.out
    spec.base_configs += args.base
    spec.common_configs += args.common
    spec.common += args.overrides
    spec.__post_init__()
    return spec


def cmd_compare(args: argparse.Namespace) -> int:
    """``rlvr compare``: run every unfinished arm x seed under the budget, then write the report."""
    from rlvr.compare.harness import run_compare
    from rlvr.compare.report import write_report

    spec = _compare_spec(args)
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


class _Terminated(KeyboardInterrupt):
    """SIGTERM outside the training loop (which handles it itself, see rlvr.trainer.lifecycle)."""


def _on_sigterm(signum, frame):  # noqa: ARG001
    raise _Terminated()


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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code (see the module docstring)."""
    import signal
    import threading

    from rlvr.trainer.lifecycle import RunInterrupted

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.command != "plot" and "HF_HUB_OFFLINE" not in os.environ:
        os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    warnings.filterwarnings("once", category=UserWarning)
    handlers = {"train": cmd_train, "eval": cmd_eval, "eval-merge": cmd_eval_merge, "export": cmd_export, "plot": cmd_plot, "compare": cmd_compare}
    old_term = signal.signal(signal.SIGTERM, _on_sigterm) if threading.current_thread() is threading.main_thread() else None
    try:
        return handlers[args.command](args)
    except ConfigError as exc:
        print(f"rlvr: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (DataError, ModelLoadError) as exc:
        print(f"rlvr: {exc}", file=sys.stderr)
        return EXIT_CONFIG if isinstance(exc, DataError) else EXIT_RUNTIME
    except IdleRunError as exc:
        print(f"rlvr: stopped: {exc}", file=sys.stderr)
        return EXIT_IDLE
    except RlvrError as exc:
        print(f"rlvr: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", EXIT_RUNTIME)
    except OSError as exc:  # disk full, permissions, a file vanished: name the file, no traceback
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        print(f"rlvr: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_RUNTIME
    except RunInterrupted as exc:
        print(f"rlvr: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        term = isinstance(exc, _Terminated)
        print(f"rlvr: {'terminated (SIGTERM)' if term else 'interrupted'}", file=sys.stderr)
        return 143 if term else 130
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


if __name__ == "__main__":
    sys.exit(main())

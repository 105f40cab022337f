"""``rlvr eval``, ``rlvr eval-merge`` and ``rlvr plot``: the commands over :mod:`rlvr.eval`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rlvr.cli.common import EXIT_RUNTIME, _load_config
from rlvr.errors import ConfigError
from rlvr.util.text import plural


def _check_eval_output(args: argparse.Namespace, cfg) -> Path:
    """Where ``rlvr eval`` writes, checked before any model loads.

    Raises:
        ConfigError: ``--tag`` holds a path separator, the output folder cannot be written, or an earlier
            evaluation's files are there and ``--overwrite`` was not given (nothing is replaced silently).
    """
    from rlvr.eval.report import companion_paths
    from rlvr.trainer.run_dir import check_writable_dir

    if any(sep in args.tag for sep in ("/", "\\", os.sep)) or args.tag in ("", ".", ".."):
        raise ConfigError(f"--tag {args.tag!r}: a tag is part of a file name (eval_<tag>.json) and may not hold a "
                          "path separator; use --out PATH to write elsewhere")
    path = Path(args.out) if args.out else Path(cfg.logging.output_dir) / f"eval_{args.tag}.json"
    if path.is_dir():
        raise ConfigError(f"--out {path}: is a directory (expected a JSON file path)")
    check_writable_dir(path.parent, "--out" if args.out else "logging.output_dir")
    earlier = [p for p in (path, *companion_paths(path)) if p.exists()]
    if earlier and not getattr(args, "overwrite", False):
        where = f"--out {args.out}" if args.out else f"--tag {args.tag}"
        raise ConfigError(f"{where}: {earlier[0]} holds an earlier evaluation; pass another --tag (or --out), "
                          "or --overwrite to replace it")
    return path


def _run_precisions(cfg, specs) -> dict[str, str]:
    """``model.dtype`` per model to evaluate: for a checkpoint under ``model.dtype=auto`` the precision its run
    recorded (:func:`rlvr.precision.record.follow_recorded_precision`), else the config's.

    Raises:
        DataError: a checkpoint's ``precision.json`` is damaged (names the file).
    """
    from rlvr.precision.record import follow_recorded_precision

    return {s.label: cfg.model.dtype if s.path is None else
            follow_recorded_precision(cfg.model.dtype, s.path, context=f"eval {s.label}") for s in specs}


def cmd_eval(args: argparse.Namespace) -> int:
    """``rlvr eval``: pass@k, maj@k and mean reward of one or more models, as JSON + Markdown + JSONL.

    Everything cheap is checked before any model loads: the config, the task's data, the
    ``--checkpoint`` values, their recorded precision (followed under ``model.dtype=auto``) and that the
    output files can be written. When the report cannot be
    written after all, the results are printed whole to stdout instead (exit 1), so they are not lost.
    """
    cfg = _load_config(args)
    from rlvr.eval.report import SamplesWriter, companion_paths, resolve_models, summary_row
    from rlvr.tasks import build_task

    path = _check_eval_output(args, cfg)
    task = build_task(cfg.task)
    n_eval = len(task.problems("eval"))
    if args.offset >= n_eval:
        raise ConfigError(f"--offset {args.offset}: the eval split has only {plural(n_eval, 'problem')}")
    from rlvr.engines.factory import check_engine_config

    check_engine_config(cfg)
    specs = resolve_models(args.checkpoint)
    if any(spec.path is None for spec in specs):  # the config's model is evaluated: a mistyped path is exit 2, now
        from rlvr.models import check_model_path

        check_model_path(cfg.model)
    dtypes = _run_precisions(cfg, specs)  # a damaged precision record: exit 2 before any model loads
    json_path = path
    md_path, samples_path = companion_paths(json_path)
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
            model, tokenizer = _load_eval_model(cfg, spec, dtypes)
            writer.model = spec.label
            result = _evaluate_model(cfg, args, task, model, tokenizer, spec.label, writer, n_draw)
            result["model"] = spec.path or cfg.model.name_or_path
            del model
            rows.append(summary_row(result, spec))
            results.append(result)
            if not _write_or_print(rows, results, len(specs), json_path, md_path):
                return EXIT_RUNTIME
            r = rows[-1]
            shown = ", ".join(f"{m}={r[m]:.4f} [{r[f'ci95/{m}'][0]:.3f}, {r[f'ci95/{m}'][1]:.3f}]"
                              for m in (f"pass@{k}" for k in r["ks"]) if m in r)
            print(f"rlvr: {spec.label}: {plural(r['problems'], 'problem')} x {plural(r['num_samples'], 'sample')}: {shown}",
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


def _load_eval_model(cfg, spec, dtypes: dict[str, str]):
    """``(model, tokenizer)`` of one model ``rlvr eval`` evaluates: a checkpoint (a model folder or a LoRA
    adapter) at its run's precision under ``model.dtype=auto`` (``dtypes``), else the config's model."""
    if spec.path is not None:
        from rlvr.lora import load_checkpoint_policy

        model_cfg = cfg.model.model_copy(update={"dtype": dtypes[spec.label]})  # the run's, under auto
        return load_checkpoint_policy(model_cfg, spec.path)  # a model folder or a LoRA adapter
    from rlvr.models import load_policy

    return load_policy(cfg.model)


def _evaluate_model(cfg, args: argparse.Namespace, task, model, tokenizer, label: str, writer, n_draw: int) -> dict:
    """:func:`rlvr.eval.evaluate.evaluate` of one model with the config's ``eval:`` settings (the samples
    streamed to ``writer``), on a vLLM server it starts and stops under ``engine=vllm``."""
    from rlvr.engines.factory import build_engine
    from rlvr.eval.evaluate import evaluate
    from rlvr.samplers.multiturn import episode_sampler_factory

    e = cfg.eval
    engine = build_engine(cfg, model, tokenizer, cfg.logging.output_dir) if cfg.engine == "vllm" else None
    episodes = episode_sampler_factory(cfg, tokenizer)
    try:
        return evaluate(
            model, tokenizer, task, num_samples=e.num_samples, ks=e.ks, temperature=e.temperature,
            top_p=cfg.top_p, max_new_tokens=cfg.max_completion_length,
            max_prompt_length=cfg.max_prompt_length, system_prompt=cfg.task.system_prompt,
            prompts_per_batch=max(1, e.batch_size // n_draw), seed=cfg.seed, limit=args.limit, offset=args.offset,
            progress=cfg.logging.progress, label=label, on_problem=writer, engine=engine,
            make_sampler=episodes, continuous=cfg.continuous_batching,
        )
    finally:
        if engine is not None:
            engine.close()


def _write_or_print(rows: list, results: list, n_models: int, json_path: Path, md_path: Path) -> bool:
    """Write the report of the models evaluated so far; when it cannot be written, print the results whole
    to stdout (so they are not lost) and say so on stderr: False then."""
    from rlvr.eval.report import write_report

    try:
        write_report(rows, json_path, md_path, single=results[0] if n_models == 1 else None)
    except OSError as exc:
        lost = {**results[0], "rows": rows} if n_models == 1 else {"rows": rows, "results": results}
        print(json.dumps(lost, indent=2, default=str))
        print(f"rlvr: could not write {json_path} ({exc.strerror or exc}); the full results are printed "
              "above", file=sys.stderr)
        return False
    return True


def cmd_eval_merge(args: argparse.Namespace) -> int:
    """``rlvr eval-merge A.samples.jsonl B.samples.jsonl --out X.json``: shards of one evaluation → one result
    (:func:`rlvr.eval.merge.write_merged`). Overlapping or inconsistent shards are a data error (exit 2), and so
    are shards of different precisions unless ``--allow-mixed-precision``."""
    from rlvr.eval.merge import write_merged

    merged, md_path, samples_path = write_merged(args.samples, Path(args.out),
                                                 allow_mixed_precision=args.allow_mixed_precision)
    shown = ", ".join(f"{m}={merged[m]:.4f} [{merged[f'ci95/{m}'][0]:.3f}, {merged[f'ci95/{m}'][1]:.3f}]"
                      for k in merged["ks"] for m in (f"pass@{k}", f"maj@{k}") if m in merged)
    print(md_path.read_text())
    print(f"rlvr: {plural(merged['problems'], 'problem')} from {plural(len(args.samples), 'shard')}: {shown}",
          file=sys.stderr)
    print(f"rlvr: wrote {args.out}, {md_path} and {samples_path}", file=sys.stderr)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    """``rlvr plot RUN_DIR``: write PNG curves.

    Raises:
        DataError: ``RUN_DIR`` has no ``metrics.jsonl`` (exit 2: bad input, not a failure of the plot).
    """
    from rlvr.errors import DataError
    from rlvr.eval.plot import plot_run

    if not (Path(args.run_dir) / "metrics.jsonl").is_file():
        raise DataError(f"rlvr plot {args.run_dir}: no metrics.jsonl there (expected an rlvr run directory)")
    path = plot_run(args.run_dir, args.out)
    print(f"rlvr: wrote {path}")
    return 0

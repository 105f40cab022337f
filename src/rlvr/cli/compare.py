"""``rlvr compare``: arms x seeds under one budget (:mod:`rlvr.compare`), from ``--spec`` and the flags."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlvr.errors import ConfigError


def _compare_spec(args: argparse.Namespace):
    """The comparison from ``--spec`` and the flags.

    Raises:
        ConfigError: no such spec file, a malformed spec (any bad value, named), no arm, no budget.
    """
    from rlvr.compare.spec import Arm, CompareSpec
    from rlvr.compare.budget import Budget
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
    if getattr(args, "plugins", None):  # recorded in every run's config, so worker processes import them too
        spec.common.append("plugins=" + json.dumps(list(args.plugins)))
    spec.__post_init__()
    return spec


def _check_arms(spec) -> None:
    """Refuse, before any run starts, an arm whose ``model.name_or_path`` names no model (a run would
    otherwise fail alone, leave ``error.txt`` and let the comparison end with exit 0), or a rollout
    budget below one generation round of an arm (``generation_batch_size`` rollouts: the arm could not
    take a single step and its "result" would be the untrained model's, issue 25 item 4.4).

    Raises:
        ConfigError: naming the arm, the key and the path, or the budget and its minimum.
    """
    import rlvr.testbed  # noqa: F401 (registers the testbed's model source, as rlvr train does)
    from rlvr.models import check_model_path

    seed = spec.seeds[0]
    for arm in spec.arms:
        cfg = spec.run_config(arm, seed, Path(spec.output_dir) / arm.name / f"seed{seed}")
        b = spec.budget
        if b.kind == "rollouts" and b.amount < cfg.generation_batch_size:
            raise ConfigError(
                f"compare budget rollouts={b.amount} is below one generation round of arm {arm.name!r} "
                f"(generation_batch_size={cfg.generation_batch_size} rollouts), so no arm would take a step: "
                f"the minimum is rollouts={cfg.generation_batch_size}")
        try:
            check_model_path(cfg.model)
        except ConfigError as exc:
            raise ConfigError(f"compare arm {arm.name!r}: {exc}") from None


def cmd_compare(args: argparse.Namespace) -> int:
    """``rlvr compare``: run every unfinished arm x seed under the budget, then write the report."""
    from rlvr.compare.harness import run_compare
    from rlvr.compare.report import write_report

    spec = _compare_spec(args)
    if args.report_only:
        path = write_report(spec.output_dir, arms=spec.report_arms(), seeds=spec.seeds, budget=spec.budget)
    else:
        if args.stop_after is not None and args.jobs > 1:
            raise ConfigError("rlvr compare --stop-after needs --jobs 1 (one run at a time is checkpointed)")
        from rlvr.trainer.run_dir import check_writable_dir

        # a file or an unwritable folder: exit 2 naming it (it was 'File exists: runs/x', exit 1, from mkdir)
        check_writable_dir(spec.output_dir, key="--out" if args.out else "output_dir")
        _check_arms(spec)
        run_compare(spec, log=lambda m: print(m, file=sys.stderr, flush=True), jobs=args.jobs,
                    stop_after_s=args.stop_after)
        path = Path(spec.output_dir) / "report.md"
    print(f"rlvr: wrote {path}")
    return 0

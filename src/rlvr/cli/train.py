"""``rlvr train``: checks before the model loads (config, data, output dir, ``--resume`` target), then the run."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Mapping, Sequence

from rlvr.cli.common import EXIT_RUNTIME, REWARD_FAILURE_LIMIT, _load_config, _yaml
from rlvr.errors import ConfigError
from rlvr.util.text import plural


def _resume_target(cfg, mode: str):
    """The checkpoint folder ``--resume MODE`` continues from, or None to start from scratch.

    ``auto``: the latest whole ``checkpoint-N`` in the output dir (newer ones that are incomplete or
    corrupt are reported by name and skipped); ``force``: the same, ignoring config and data changes;
    anything else: that checkpoint folder. Unless forced, the saved config (``max_steps``,
    ``save_steps``, ``logging``, ``eval`` ignored) and the content hashes of the task's data files
    (``task.path``, ``task.eval_path``) must match the current ones.

    Raises:
        ConfigError: the folder is not a checkpoint or is damaged (checksums, :mod:`rlvr.trainer.checksums`),
            every ``checkpoint-N`` of ``auto``/``force`` is, the checkpoint holds a LoRA adapter for a
            full-model run or the reverse, or the config or data changed (every difference is named, old -> new).
    """
    from rlvr.trainer.checkpoint import resume_differences
    from rlvr.trainer.checkpoint_state import STATE_FILE
    from rlvr.trainer.run_dir import checkpoint_problems, find_resumable, refuse_restart_of_finished_run

    out = Path(cfg.logging.output_dir)
    if mode in ("auto", "force"):
        ckpt, skipped = find_resumable(out)
        for bad, problems in skipped:
            print(f"rlvr: skipping {bad}: incomplete or corrupt ({'; '.join(problems)})", file=sys.stderr)
        if ckpt is None and skipped:  # starting over would drop the metrics of steps a checkpoint once held
            raise ConfigError(
                f"--resume: none of the {plural(len(skipped), 'checkpoint')} in {out} is usable (each is named above "
                f"with what is damaged): restore one from a backup, resume a chosen one with --resume PATH, or "
                f"start over with --overwrite")
        if ckpt is None:
            refuse_restart_of_finished_run(out)
            print(f"rlvr: no checkpoint in {out}; starting from scratch", file=sys.stderr)
            return None
        if skipped:
            print(f"rlvr: resuming from the previous whole checkpoint, {ckpt}", file=sys.stderr)
    else:
        ckpt = Path(mode)
        if not ckpt.exists():  # a typo of auto/force lands here too: say what the value may be
            raise ConfigError(f"--resume {mode}: no such checkpoint folder (expected auto, force or the path of "
                              f"a checkpoint-N folder, e.g. {Path(cfg.logging.output_dir) / 'checkpoint-10'})")
        if not (ckpt / STATE_FILE).exists() and not (ckpt / ".complete").exists():
            raise ConfigError(f"--resume {mode}: not an rlvr checkpoint folder (no {STATE_FILE})")
        problems = checkpoint_problems(ckpt)
        if problems:
            raise ConfigError(f"--resume {mode}: the checkpoint is incomplete or corrupt:\n  " + "\n  ".join(problems))
    _check_checkpoint_kind(ckpt, cfg)
    step = json.loads((ckpt / STATE_FILE).read_text()).get("global_step")
    if isinstance(step, int) and step > cfg.max_steps:  # it would write final/ at step N > max_steps, saying nothing
        raise ConfigError(
            f"--resume: {ckpt} is at step {step}, past max_steps={cfg.max_steps}: nothing to train. Raise max_steps "
            f"to continue (e.g. max_steps={step + max(cfg.max_steps, 1)}), or train on from its weights in a new folder "
            f"with model.name_or_path={ckpt} logging.output_dir=NEW_DIR")
    if mode != "force":
        saved = json.loads((ckpt / STATE_FILE).read_text())
        changed = resume_differences(saved, cfg)
        if changed:
            raise ConfigError(
                f"--resume: refusing to resume from {ckpt}: the config or data changed since it was written:\n  "
                + "\n  ".join(changed) + "\nUse --resume force to continue anyway."
            )
    return ckpt


def _check_checkpoint_kind(ckpt: Path, cfg) -> None:
    """A LoRA checkpoint cannot resume a full-model run, nor a full one a LoRA run (``--resume force``
    skips the config comparison that would name ``model.lora.r``): one line, before the model loads.

    Raises:
        ConfigError: naming the checkpoint, what it holds and what the run trains.
    """
    from rlvr.lora import is_adapter_folder
    from rlvr.trainer.dist_checkpoint import is_distributed_checkpoint

    if is_distributed_checkpoint(ckpt):
        return
    adapter, lora_run = is_adapter_folder(ckpt), cfg.model.lora.r > 0
    if adapter != lora_run:
        held = "a LoRA adapter" if adapter else "a full model (no adapter_config.json)"
        run = f"a LoRA adapter (model.lora.r={cfg.model.lora.r})" if lora_run else "the full model (model.lora.r=0)"
        raise ConfigError(f"--resume: checkpoint {ckpt} holds {held}, but this run trains {run}: resume with the "
                          "model.lora.* settings it was written with, or start a new run")


def _prepare_output_dir(cfg, args: argparse.Namespace, lock=None) -> Path:
    """Refuse an output dir that is a file, unwritable, in use by another trainer, or already holds a run
    (unless ``--resume`` or ``--overwrite``); with ``--overwrite`` delete that run's training files. Runs
    before the model loads. ``lock`` (a :class:`~rlvr.trainer.run_lock.RunDirLock`) is taken once the
    folder is known to be writable and before anything in it is deleted, and stays held.

    Raises:
        OutputDirError: see above (exit 2); the message names the folder and the ways out (for a
            folder in use: the other trainer's pid and host).
    """
    from rlvr.errors import OutputDirError
    from rlvr.trainer.run_dir import check_writable_dir, describe, remove_run_artefacts, run_artefacts

    out = Path(cfg.logging.output_dir)
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"logging.output_dir={str(out)!r} is a file, not a folder: choose another logging.output_dir")
    check_writable_dir(out)
    if lock is not None:
        lock.acquire()
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
    return out


def _resume_command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """The command line that continues an interrupted ``rlvr train`` (``--resume`` added, ``--overwrite``
    dropped). Under ``torchrun`` (``RANK``/``WORLD_SIZE`` in ``env``) it starts with the launcher and its
    process counts, ``torchrun --nproc_per_node L [--nnodes N] -m rlvr ...``: a one-process ``rlvr`` would
    resume a different job (a multi-node job's rendezvous options are not known here and are left out)."""
    import shlex

    env = os.environ if env is None else env
    args = [a for a in argv if a != "--overwrite"]
    if not any(a == "--resume" or a.startswith("--resume=") for a in args):
        args.append("--resume")
    tail = " ".join(shlex.quote(a) for a in args)
    if "RANK" in env and "WORLD_SIZE" in env:
        world, local = int(env["WORLD_SIZE"]), int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"]))
        nodes = f" --nnodes {world // local}" if local and world // local > 1 else ""
        return f"torchrun --nproc_per_node {local}{nodes} -m rlvr {tail}"
    return "rlvr " + tail


def cmd_train(args: argparse.Namespace) -> int:
    """``rlvr train``: validate everything cheap, then load the model and train.

    Returns 1 when more than :data:`REWARD_FAILURE_LIMIT` of the run's reward calls failed.
    """
    cfg = _load_config(args, training=True)  # parts and trackers (a missing wandb/mlflow package): exit 2 now
    if args.overwrite and args.resume:  # before _resume_target, which would report on the folder first
        from rlvr.errors import OutputDirError

        raise OutputDirError("--overwrite and --resume contradict each other: continue the run in "
                             f"{cfg.logging.output_dir} (--resume) or delete it and start over (--overwrite)")
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    owner = int(os.environ.get("RANK", "0")) == 0 or not launched  # one rank owns the output dir
    from rlvr.trainer.run_lock import RunDirLock

    lock = RunDirLock(cfg.logging.output_dir)
    try:
        return _checked_start(cfg, args, launched, owner, lock)
    finally:
        lock.release()


def _checked_start(cfg, args: argparse.Namespace, launched: bool, owner: bool, lock) -> int:
    """:func:`cmd_train` from the ``--resume`` target on: every check that needs no model, then the run.

    ``lock`` is taken before the output dir is changed in any way (tidied for ``--resume``, emptied by
    ``--overwrite``). A start that fails before its first step in a folder that held no run leaves
    nothing that would refuse the next start (:func:`~rlvr.trainer.run_dir.forget_failed_start`).
    """
    if args.resume and not launched:  # one process owns the dir: tidy first, so a checkpoint put back is resumed
        from rlvr.trainer.run_dir import clean_stale_temporaries

        if Path(cfg.logging.output_dir).is_dir():
            lock.acquire()  # before tidying: a running trainer's staging folders are not leftovers
        clean_stale_temporaries(cfg.logging.output_dir, log=lambda m: print(m, file=sys.stderr))
    ckpt = _resume_target(cfg, args.resume) if args.resume else None
    from rlvr.distributed import init_distributed, shutdown
    from rlvr.distributed.setup import local_config

    world = int(os.environ["WORLD_SIZE"]) if launched else 1
    local_cfg = local_config(cfg, world)  # batch geometry per rank: a ConfigError before anything starts
    if ckpt is not None:  # model.dtype=auto continues at the precision the run recorded (a bad record: exit 2 now)
        from rlvr.precision.record import config_at_recorded_precision

        local_cfg = config_at_recorded_precision(local_cfg, ckpt, context=f"--resume from {ckpt}",
                                                 log=int(os.environ.get("RANK", "0")) == 0)
    from rlvr.engines.factory import check_engine_config
    from rlvr.tasks import build_task
    from rlvr.trainer.rollout import check_filter_metric

    task = build_task(cfg.task)
    if not task.problems("train"):  # data errors (exit 2) before --overwrite deletes anything and before the model loads
        from rlvr.errors import DataError

        raise DataError(f"task {cfg.task.type}: no training problems (task.train_size={cfg.task.train_size})")
    if cfg.task.mixture is not None and hasattr(task, "check_training"):  # each source's data, the curriculum's names
        task.check_training(cfg.task.curriculum)
    check_filter_metric(cfg, task)  # the task's half of validate_run (its config half ran in _load_config)
    from rlvr.rewards.combine import check_rewards

    check_rewards(cfg, task)  # rewards: sources, names, api_key_env
    check_engine_config(cfg)
    from rlvr.models import check_model_path

    check_model_path(cfg.model)  # a mistyped model path must not cost the run --overwrite would delete
    fresh = False
    if owner:
        from rlvr.trainer.run_dir import run_artefacts

        _prepare_output_dir(cfg, args, lock)
        fresh = not run_artefacts(cfg.logging.output_dir)
    try:
        env = init_distributed(cfg.device, backend=cfg.distributed.backend, timeout_s=cfg.distributed.timeout_s,
                               num_threads=cfg.distributed.num_threads)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        return _train(cfg, local_cfg, ckpt, env, task, args, validated=True)
    except BaseException:
        if fresh:
            from rlvr.trainer.run_dir import forget_failed_start

            forget_failed_start(cfg.logging.output_dir)
        raise
    finally:
        shutdown()


def _train(cfg, local_cfg, ckpt, env, task, args: argparse.Namespace | None = None, *, validated: bool = False) -> int:
    """Load the model, build this rank's trainer over ``task`` (built and checked by :func:`cmd_train`),
    resume, train (one process or one rank of a ``torchrun`` job; only rank 0 writes the output dir and
    prints). ``validated``: :func:`cmd_train` already ran :func:`~rlvr.trainer.components.validate_run`
    on ``cfg`` and ``task`` (the trainer then does not run it again)."""
    from rlvr.distributed import DataParallel
    from rlvr.distributed.setup import use_fsdp
    from rlvr.models import load_policy
    from rlvr.trainer.checkpoint import load_checkpoint
    from rlvr.trainer.lifecycle import RunInterrupted
    from rlvr.trainer.trainer import Trainer

    from rlvr.precision import resolve_model_precision

    main_rank = env.rank == 0
    # model.dtype resolved once for the run's device (at the run's recorded precision on --resume): the
    # load, the sharding, the trainer's forwards and the engine all use this policy
    precision = resolve_model_precision(local_cfg.model, env.device)
    model, tokenizer = load_policy(local_cfg.model, precision=precision)
    out = Path(cfg.logging.output_dir)
    dp = None
    if env.distributed:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        dp = DataParallel(env, fsdp=use_fsdp(cfg, env.world_size), pad_token_id=int(pad))
        if main_rank:
            print(f"rlvr: {plural(env.world_size, 'process', 'processes')} ({env.local_world_size} on this node), backend {env.backend}, "
                  f"device {env.device.type}, {env.threads} CPU thread(s) per process, "
                  f"{'FSDP2' if dp.fsdp else 'replicated'} policy, {plural(local_cfg.generation_batch_size, 'completion')} "
                  f"per rank per round", file=sys.stderr)
    else:
        model.to(env.device)
    trainer = Trainer(local_cfg, model, tokenizer, task, dp=dp, run_config=cfg, precision=precision,
                      validated=validated)
    try:
        resume = getattr(args, "resume", None)
        if ckpt is not None:
            load_checkpoint(trainer, ckpt)
            if main_rank:
                print(f"rlvr: resumed from {ckpt} at step {trainer.global_step}", file=sys.stderr)
        elif resume and main_rank and (out / "metrics.jsonl").exists():  # starting from scratch: step 1 is logged anew
            from rlvr.trainer.logger import drop_rows_after

            drop_rows_after(out / "metrics.jsonl", 0)
        if main_rank:  # every start-up check has passed (model, tokenizer, trainer, resume): the run begins
            out.mkdir(parents=True, exist_ok=True)
            (out / "config.yaml").write_text(_yaml(cfg.model_dump(mode="json")))
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
            print(f"rlvr: {s.errors + s.timeouts} of {plural(s.calls, 'reward call')} failed ({plural(s.errors, 'error')}, "
                  f"{plural(s.timeouts, 'timeout')}): the run's rewards are mostly zeros from failures, not from the verifier. Check "
                  f"task.reward_fn and reward_timeout_s (the first error is in the log above).", file=sys.stderr)
        return EXIT_RUNTIME
    if main_rank:
        print(f"rlvr: finished {plural(trainer.global_step, 'step')} in {out}; last: {shown}")
    return 0

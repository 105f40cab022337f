"""``rlvr compare``: run several arms (recipe + overrides) × seeds under one equal budget, then report.

Layout of a comparison folder ``OUT``::

    OUT/compare.yaml                 the resolved comparison spec (written once)
    OUT/<arm>/seed<k>/               one run: metrics.jsonl, curve.jsonl, config.yaml, result.json
    OUT/report.md, OUT/summary.json  the table (mean ± std over seeds)
    OUT/reward_curves.png, OUT/diagnostics.png

A run is finished when its ``result.json`` exists (written atomically, last); re-running the same
comparison skips finished runs and starts unfinished ones afresh, so an interrupted comparison
resumes where it stopped at run granularity.

This module runs the arms (:func:`run_compare`, :func:`run_one`, the untrained baseline) and
writes their result files. What a comparison is lives in :mod:`rlvr.compare.spec`, the equal budget
(what counts as generated, the sampler wrapper that enforces it) in :mod:`rlvr.compare.budget`, the
per-step curve and its summary in :mod:`rlvr.compare.curves`, the held-out evaluation in
:mod:`rlvr.compare.heldout`.

Source: interpretation of issue 8 (no paper).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import yaml

from rlvr.compare.budget import Budget, BudgetExhausted, BudgetMeter
from rlvr.compare.curves import curve_summary, curve_values
from rlvr.compare.heldout import _eval_keys, _held_out_eval
from rlvr.compare.pieces import PIECE_FILE, Deadline, PieceState, TimeLimitReached
from rlvr.compare.report import BASELINE, read_curve, write_report
from rlvr.compare.spec import Arm, CompareSpec
from rlvr.errors import ConfigError, IdleRunError
from rlvr.util.staging import write_text_atomic
from rlvr.util.text import plural


def _atomic_json(path: Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2))


def _progress_total(budget: Budget, cfg: Any, trainer: Any) -> int | None:
    """The optimizer steps a run's step bar counts to under ``budget`` (``max_steps`` is only a cap then):
    the budget itself for ``steps``; for ``rollouts`` with the plain group sampler and no dynamic sampling,
    whole generation rounds × μ updates each; otherwise None (not known in advance: the bar counts)."""
    if budget.kind == "steps":
        return budget.amount
    if budget.kind == "rollouts" and cfg.sampler == "group" and not cfg.dynamic_sampling.enable:
        return min(cfg.max_steps, budget.amount // cfg.generation_batch_size * trainer.updates_per_generation)
    return None


def run_one(spec: CompareSpec, arm: Arm, seed: int, *, model_factory: Callable[[Any], tuple[Any, Any]] | None = None,
            task_factory: Callable[[Any], Any] | None = None, log: Callable[[str], None] = print,
            deadline: Deadline | None = None) -> dict[str, Any]:
    """Run one arm × seed to its budget, evaluate it, and write ``result.json`` (last, atomically).

    With a ``deadline`` (:mod:`rlvr.compare.pieces`) the run stops at the first step boundary after
    it, writes a checkpoint and ``piece.json``, and raises :class:`TimeLimitReached`; a later call
    resumes it from that checkpoint (an unfinished run without ``piece.json`` starts afresh).

    Args:
        model_factory: ``cfg -> (model, tokenizer)``; default :func:`rlvr.models.load_policy` on
            ``cfg.model`` (tests pass the tiny in-process model).
        task_factory: ``cfg -> Task``; default :func:`rlvr.tasks.build_task` on ``cfg.task``.

    Returns:
        the result dict (also written to ``OUT/<arm>/seed<k>/result.json``).

    Raises:
        ConfigError: invalid run configuration; other errors of the run propagate.
        TimeLimitReached: the ``deadline`` passed (the run is checkpointed, not finished).
    """
    from rlvr.trainer.checkpoint import load_checkpoint
    from rlvr.trainer.trainer import Trainer

    run_dir = Path(spec.output_dir) / arm.name / f"seed{seed}"
    cfg, run_cfg, piece = _open_run(spec, arm, seed, run_dir)
    model, tok, task = _load_model_and_task(cfg, model_factory, task_factory)
    trainer = Trainer(cfg, model, tok, task, run_config=run_cfg)
    if piece is not None:
        load_checkpoint(trainer, piece.checkpoint)
        log(f"compare: {arm.name} seed {seed}: resumed at step {trainer.global_step} ({piece.rollouts} rollouts, "
            f"piece {piece.pieces + 1})")
    meter = BudgetMeter(trainer.sampler, spec.budget, progress=lambda: trainer.global_step,
                        max_idle_draws=spec.max_idle_draws)
    if piece is not None:
        meter.rollouts, meter.tokens, meter._idle = piece.rollouts, piece.tokens, piece.idle_draws
        meter._last_step = piece.step
    trainer.sampler = meter
    trainer.progress_total = _progress_total(spec.budget, cfg, trainer)
    t0 = time.perf_counter() - (piece.wall_s if piece else 0.0)
    curve = _CurveWriter(spec, cfg, meter, tok, task, run_dir / "curve.jsonl", piece, t0, deadline)
    trainer.callbacks.append(curve.record)
    try:
        stop = _train_to_budget(trainer, meter, curve, piece, run_dir, f"{arm.name} seed {seed}", log)
    finally:
        curve.close()
        trainer.close()  # a vLLM server the run started must not outlive it (one per arm x seed)
    wall = curve.wall_s()
    log(f"compare: {arm.name} seed {seed}: {plural(trainer.global_step, 'step')}, {plural(meter.rollouts, 'rollout')}, "
        f"{plural(meter.tokens, 'token')}, {wall:.1f} s ({stop})")
    ev = _eval_keys(_held_out_eval(spec, cfg, trainer.model, tok, task), task)
    if spec.eval_curve_points > 1:  # the final evaluation closes the held-out learning curve
        with open(curve.path, "a") as f:
            f.write(json.dumps({"step": trainer.global_step, "rollouts": meter.rollouts, "tokens": meter.tokens,
                                "wall_s": round(wall, 3), **ev}) + "\n")
    result = {
        "arm": arm.name, "seed": seed, "steps": trainer.global_step, "rollouts": meter.rollouts,
        "tokens": meter.tokens, "wall_s": round(wall, 2), "stop": stop, "precision": trainer.precision.mode,
        **curve_summary(read_curve(run_dir)), **ev,
    }
    _atomic_json(run_dir / "result.json", result)
    for done in [*run_dir.glob("checkpoint-*"), run_dir / PIECE_FILE]:  # the pieces' state is not needed now
        shutil.rmtree(done, ignore_errors=True) if done.is_dir() else done.unlink(missing_ok=True)
    return result


def _open_run(spec: CompareSpec, arm: Arm, seed: int, run_dir: Path) -> tuple[Any, Any, PieceState | None]:
    """``(cfg, run_cfg, piece)`` of one arm × seed: the config it trains with (a later piece continues at
    the precision its first one resolved), the run's own config (saved in checkpoints) and its piece
    state (None: a fresh start, ``run_dir`` emptied and ``config.yaml`` written).

    Raises:
        ConfigError: the arm's config is invalid. DataError: a damaged precision record.
    """
    cfg = spec.run_config(arm, seed, run_dir)
    piece = PieceState.load(run_dir)
    if piece is None:
        if run_dir.exists():
            shutil.rmtree(run_dir)  # an unfinished run without a piece checkpoint: start it afresh
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    run_cfg = cfg
    if piece is not None:  # a later piece continues at the precision the first one resolved
        from rlvr.precision.record import config_at_recorded_precision

        cfg = config_at_recorded_precision(cfg, piece.checkpoint, context=f"compare {arm.name} seed {seed}")
    return cfg, run_cfg, piece


class _CurveWriter:
    """The trainer callback of :func:`run_one`: one ``curve.jsonl`` row per optimizer step (step, rollouts,
    tokens, wall seconds without the mid-run evaluations, the curve values), a held-out evaluation at each
    of ``spec.eval_curve_points`` budget fractions, and a stop request at the step boundary after the
    ``deadline``. A later piece appends (its rows after the checkpointed step dropped)."""

    def __init__(self, spec: CompareSpec, cfg: Any, meter: BudgetMeter, tok: Any, task: Any, path: Path,
                 piece: PieceState | None, t0: float, deadline: Deadline | None) -> None:
        from rlvr.trainer.logger import drop_rows_after

        self.spec, self.cfg, self.meter, self.tok, self.task, self.path = spec, cfg, meter, tok, task, path
        self.t0, self.deadline = t0, deadline
        if piece is not None:  # rows of a later piece that was killed before its checkpoint are redone
            drop_rows_after(path, piece.step)
        self.f = open(path, "a" if piece else "w")
        self.paused = 0.0  # seconds spent in mid-run evaluations (left out of wall_s)
        self.next_point = piece.next_point if piece else 1

    def wall_s(self) -> float:
        """Seconds of this run so far (all pieces), without the mid-run evaluations."""
        return time.perf_counter() - self.t0 - self.paused

    def spent(self, trainer: Any) -> float:
        """The fraction of the budget used."""
        b, meter = self.spec.budget, self.meter
        used = {"steps": trainer.global_step, "rollouts": meter.rollouts, "tokens": meter.tokens}[b.kind]
        return used / b.amount

    def record(self, tr: Any, m: dict[str, float]) -> None:
        """The callback (``trainer.callbacks``): write the step's row."""
        meter, spec = self.meter, self.spec
        row = {"step": tr.global_step, "rollouts": meter.rollouts, "tokens": meter.tokens,
               "wall_s": round(time.perf_counter() - self.t0 - self.paused, 3)}
        row.update(curve_values(m, getattr(tr.schedule, "primary_phase", None)))
        n = spec.eval_curve_points
        if n > 1 and self.next_point < n and self.spent(tr) >= self.next_point / n:
            while self.next_point < n and self.spent(tr) >= self.next_point / n:
                self.next_point += 1
            te, was_training = time.perf_counter(), tr.model.training
            row.update(_eval_keys(_held_out_eval(spec, self.cfg, tr.model, self.tok, self.task), self.task))
            tr.model.train(was_training)
            self.paused += time.perf_counter() - te
        self.f.write(json.dumps(row) + "\n")
        self.f.flush()
        if self.deadline is not None and self.deadline.passed():
            tr.request_stop()  # checkpoint at this step boundary (the trainer's SIGTERM path)

    def close(self) -> None:
        """Close the curve file."""
        self.f.close()


def _train_to_budget(trainer: Any, meter: BudgetMeter, curve: _CurveWriter, piece: PieceState | None, run_dir: Path,
                     label: str, log: Callable[[str], None]) -> str:
    """Train until ``max_steps``, the budget or a stall, and say which (the ``stop`` of ``result.json``).

    Raises:
        TimeLimitReached: the deadline stopped the run (its checkpoint and ``piece.json`` were written).
        RunInterrupted: a real SIGINT/SIGTERM.
    """
    from rlvr.trainer.lifecycle import RunInterrupted

    try:
        trainer.train()
    except RunInterrupted as exc:
        if trainer._stop_asked is None or exc.checkpoint is None:
            raise  # a real SIGINT/SIGTERM: the comparison stops as before
        PieceState(checkpoint=str(exc.checkpoint), step=trainer.global_step, rollouts=meter.rollouts,
                   tokens=meter.tokens, idle_draws=meter._idle, wall_s=round(curve.wall_s(), 3),
                   next_point=curve.next_point, pieces=(piece.pieces if piece else 0) + 1).save(run_dir)
        log(f"compare: {label}: time limit reached at step {trainer.global_step} "
            f"({meter.rollouts} rollouts); checkpoint {exc.checkpoint}; run the comparison again to continue")
        raise TimeLimitReached(label) from None
    except BudgetExhausted as exc:
        return f"budget: {exc}"
    except IdleRunError:  # the trainer's own guard (max_idle_rounds): a stalled arm, not a failed one
        return f"stalled: no trainable group in {trainer.idle.rounds} generation rounds (max_idle_rounds)"
    return "max_steps"


def _run_in_worker(spec: CompareSpec, arm: Arm, seed: int, threads: int) -> dict[str, Any] | None:
    import torch

    torch.set_num_threads(threads)
    return _guarded(spec, arm, seed, None, None, lambda m: print(m, flush=True))


def _load_model_and_task(cfg: Any, model_factory: Callable[[Any], tuple[Any, Any]] | None,
                         task_factory: Callable[[Any], Any] | None) -> tuple[Any, Any, Any]:
    """``(model, tokenizer, task)`` of a run config: the factories when given, else
    :func:`rlvr.models.load_policy` and :func:`rlvr.tasks.build_task`."""
    if model_factory is None:
        import rlvr.testbed  # noqa: F401 (registers the testbed model source)
        from rlvr.models import load_policy

        model, tok = load_policy(cfg.model)
    else:
        model, tok = model_factory(cfg)
    if task_factory is None:
        import rlvr.testbed  # noqa: F401 (registers the testbed task type)
        from rlvr.tasks import build_task

        task = build_task(cfg.task)
    else:
        task = task_factory(cfg)
    return model, tok, task


def run_baseline(spec: CompareSpec, seed: int, *, model_factory: Callable[[Any], tuple[Any, Any]] | None = None,
                 task_factory: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """Evaluate the untrained policy of the first arm's run config (``seed``) like every trained run,
    and write ``OUT/initial/seed<k>/result.json`` (eval keys only)."""
    run_dir = Path(spec.output_dir) / BASELINE / f"seed{seed}"
    cfg = spec.run_config(spec.arms[0], seed, run_dir)
    model, tok, task = _load_model_and_task(cfg, model_factory, task_factory)
    raw = _held_out_eval(spec, cfg, model, tok, task)
    result = {"arm": BASELINE, "seed": seed, "steps": 0, "rollouts": 0, "tokens": 0, "precision": raw.get("precision"),
              **_eval_keys(raw, task)}
    run_dir.mkdir(parents=True, exist_ok=True)
    _atomic_json(run_dir / "result.json", result)
    return result


def _baseline_inputs(spec: CompareSpec, seed: int) -> str:
    """What the untrained policy's evaluation of ``seed`` depends on: the first arm's run config without the
    run seed and the logging section (JSON). The held-out evaluation has its own fixed seed
    (:func:`rlvr.compare.heldout._held_out_eval`), and neither the model section nor the task section
    reads the run seed, so two seeds with equal inputs evaluate the same policy on the same draws."""
    cfg = spec.run_config(spec.arms[0], seed, Path(spec.output_dir) / BASELINE / f"seed{seed}")
    return json.dumps(cfg.model_dump(mode="json", exclude={"seed", "logging"}), sort_keys=True, default=str)


def _run_baselines(spec: CompareSpec, out: Path, log: Callable[[str], None], model_factory, task_factory) -> None:
    """Write ``OUT/initial/seed<k>/result.json`` for every seed that has none.

    Without factories the untrained policy's evaluation does not depend on the run seed
    (:func:`_baseline_inputs`), so it runs once and the other seeds get its result (with
    ``"reused_from_seed"``): before this, a pre-registered table re-ran the same 200 × 8 evaluation once per
    seed and got the same numbers 8 times. A model or task factory may read the seed: then every seed is
    evaluated. Interpretation: a saving, not a change of what the baseline row measures.
    """
    done: dict[str, dict[str, Any]] = {}
    for seed in spec.seeds:
        path = out / BASELINE / f"seed{seed}" / "result.json"
        shareable = model_factory is None and task_factory is None
        key = _baseline_inputs(spec, seed) if shareable else None
        if path.exists():
            if key is not None and key not in done:
                done[key] = json.loads(path.read_text())
            continue
        if key is not None and key in done:
            src = done[key]
            base_seed = src.get("reused_from_seed", src["seed"])
            log(f"compare: {BASELINE} seed {seed}: the same evaluation as seed {base_seed} (the untrained policy "
                "does not depend on the run seed); its result reused")
            path.parent.mkdir(parents=True, exist_ok=True)
            _atomic_json(path, {**src, "seed": seed, "reused_from_seed": base_seed})
            continue
        log(f"compare: {BASELINE} seed {seed}: evaluating the untrained policy")
        result = run_baseline(spec, seed, model_factory=model_factory, task_factory=task_factory)
        if key is not None:
            done[key] = result


def _guarded(spec: CompareSpec, arm: Arm, seed: int, model_factory, task_factory, log,
             deadline: Deadline | None = None) -> dict[str, Any] | None:
    """:func:`run_one`, but a run that crashes writes ``error.txt`` and yields None (the others go on)."""
    import traceback

    try:
        return run_one(spec, arm, seed, model_factory=model_factory, task_factory=task_factory, log=log,
                       deadline=deadline)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - one failing arm must not lose the comparison
        run_dir = Path(spec.output_dir) / arm.name / f"seed{seed}"
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "error.txt").write_text(traceback.format_exc())
        log(f"compare: {arm.name} seed {seed}: FAILED ({type(exc).__name__}: {exc}); see {run_dir / 'error.txt'}")
        return None


def run_compare(spec: CompareSpec, *, model_factory=None, task_factory=None, log: Callable[[str], None] = print,
                report: bool = True, jobs: int = 1, stop_after_s: float | None = None) -> list[dict[str, Any]]:
    """Run every arm × seed not finished yet (finished = ``result.json`` exists), then write the report.

    ``stop_after_s`` (one job only) limits this call: once that many seconds have passed, the run in
    progress stops at its next step boundary with a checkpoint (resumed by the next call, see
    :mod:`rlvr.compare.pieces`) and no further run starts; the report then covers the finished runs.

    Every run config is validated before the first run starts, so a typo in the last arm fails at
    once. Runs go arm by arm, seed by seed; with ``jobs > 1`` that many runs go at once, each in its
    own (spawned) process with one torch thread (factories are then not allowed: each worker loads
    the model from ``cfg.model``). Wall times of parallel runs share the CPU: compare them only
    between runs of the same comparison.

    Raises:
        ValueError: ``jobs > 1`` together with a model or task factory or with ``stop_after_s``.

    A run that raises (other than a configuration error) leaves ``error.txt`` in its folder, is left
    out of the results and the report, and is retried on the next invocation.

    Returns:
        all results (finished earlier or now), in arm × seed order (the runs themselves go seed by seed).

    Raises:
        ConfigError: an invalid arm configuration, or an existing ``compare.yaml`` in the output
            folder that differs from ``spec`` (finished runs would not be comparable).
    """
    out = Path(spec.output_dir)
    for arm in spec.arms:
        for seed in spec.seeds:
            spec.run_config(arm, seed, out / arm.name / f"seed{seed}")
    out.mkdir(parents=True, exist_ok=True)
    _write_spec(spec, out / "compare.yaml")
    if jobs > 1 and (model_factory is not None or task_factory is not None):
        raise ValueError("run_compare: jobs > 1 loads models in worker processes; factories are not supported")
    if jobs > 1 and stop_after_s is not None:
        raise ValueError("run_compare: stop_after_s needs jobs=1 (one run at a time is checkpointed)")
    deadline = Deadline(stop_after_s)
    results, todo = _finished_and_todo(spec, out, log)
    if jobs > 1 and len(todo) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {(a.name, s): pool.submit(_run_in_worker, spec, a, s, 1) for a, s in todo}
            for key, fut in futures.items():
                results[key] = fut.result()
    else:
        try:
            for i, (arm, seed) in enumerate(todo):
                if i and deadline.passed():
                    log(f"compare: time limit ({stop_after_s} s) reached; {len(todo) - i} run(s) left for the next call")
                    raise TimeLimitReached("before " + arm.name)
                results[(arm.name, seed)] = _guarded(spec, arm, seed, model_factory, task_factory, log, deadline)
        except TimeLimitReached:
            if report:
                write_report(out, arms=spec.report_arms(), seeds=spec.seeds, budget=spec.budget)
            return [r for r in results.values() if r is not None]
    if spec.eval_baseline:
        _run_baselines(spec, out, log, model_factory, task_factory)
    if report:
        write_report(out, arms=spec.report_arms(), seeds=spec.seeds, budget=spec.budget)
    return [r for r in (results[(a.name, s)] for a in spec.arms for s in spec.seeds) if r is not None]


def _write_spec(spec: CompareSpec, saved: Path) -> None:
    """Write ``compare.yaml``: ``spec``, merged with the one saved there earlier (its arms and seeds
    kept, new ones added; adding the baseline evaluation later keeps finished runs comparable).

    Raises:
        ConfigError: the saved comparison differs from ``spec`` in its budget, configs, common
            overrides, evaluation, step cap or the settings of an arm both have.
    """
    now = spec.to_dict()
    if saved.exists():
        old = yaml.safe_load(saved.read_text()) or {}
        keep = ("budget", "base_configs", "common_configs", "common", "eval", "max_steps_cap")

        def same(k: str) -> bool:  # adding the baseline evaluation later keeps finished runs comparable
            a, b = old.get(k), now.get(k)
            if k == "eval" and isinstance(a, dict) and isinstance(b, dict):
                a, b = {**a, "baseline": None}, {**b, "baseline": None}
            return a == b

        diff = [k for k in keep if not same(k)]
        old_arms = {a["name"]: a for a in old.get("arms", [])}
        diff += [f"arm {a['name']}" for a in now["arms"] if a["name"] in old_arms and old_arms[a["name"]] != a]
        if diff:
            raise ConfigError(f"{saved} was written for a different comparison ({', '.join(diff)}); "
                              "use another output_dir or delete it")
        merged = dict(now)
        merged["arms"] = list(old_arms.values()) + [a for a in now["arms"] if a["name"] not in old_arms]
        merged["seeds"] = sorted(set(old.get("seeds", [])) | set(spec.seeds))
        now = merged
    saved.write_text(yaml.safe_dump(now, sort_keys=False))


def _finished_and_todo(spec: CompareSpec, out: Path, log: Callable[[str], None],
                       ) -> tuple[dict[tuple[str, int], dict[str, Any] | None], list[tuple[Arm, int]]]:
    """``(results, todo)``: the results of the runs finished earlier (``result.json`` read) by
    ``(arm, seed)``, and the arm × seed pairs still to run, **seed-major** (every arm of seed 0, then of
    seed 1, ...): the claims pair arms by seed, so a comparison cut off early (a time limit, a kill)
    leaves whole pairs rather than one arm's seeds. Interpretation: an order, no change to any run."""
    results: dict[tuple[str, int], dict[str, Any] | None] = {}
    todo = []
    for seed in spec.seeds:
        for arm in spec.arms:
            res_path = out / arm.name / f"seed{seed}" / "result.json"
            if res_path.exists():
                log(f"compare: {arm.name} seed {seed}: finished earlier, skipped")
                results[(arm.name, seed)] = json.loads(res_path.read_text())
            else:
                todo.append((arm, seed))
    return results, todo

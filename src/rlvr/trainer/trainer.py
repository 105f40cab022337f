"""The training loop: it wires a sampler, a scorer, the core loss and a schedule. No algorithm math here.

Schedule (``grpo_core.md`` §4, §10): each generation batch of ``generation_batch_size`` completions
feeds ``steps_per_generation × num_iterations`` optimizer updates; groups are reshuffled between
passes. ``max_steps`` counts optimizer updates (TRL semantics).

This module holds the wiring (:class:`Trainer`'s constructor) and the loop around rounds and steps:
stopping, resume re-planning, the rank agreements, checkpoints. The halves of an iteration are
mixins in their own modules: :mod:`rlvr.trainer.prepare` (a generation batch from the weight push to
the batch filters) and :mod:`rlvr.trainer.steps` (one optimizer update and the actions after it);
config-only setup helpers are :mod:`rlvr.trainer.setup`.
"""

from __future__ import annotations

import contextlib
import copy
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from rlvr.config import RLConfig
from rlvr.engines.factory import build_engine
from rlvr.errors import ConfigError, IdleRunError, RewardFailureError, RunStopped
from rlvr.loggers import build_trackers
from rlvr.lora import apply_lora, base_causal_lm, is_peft_model, lora_engine
from rlvr.precision import PrecisionPolicy
from rlvr.rewards.combine import build_scorer
from rlvr.samplers.group import PromptEncoder
from rlvr.trainer.checkpoint import save_checkpoint
from rlvr.trainer.checkpoint_state import capture_rng_state, pending_round_state, restore_rng_state
from rlvr.schedules import SCHEDULES, OptimizerStep, Schedule
from rlvr.trainer.components import (
    ADV_ESTIMATORS,
    BATCH_FILTERS,
    MASKS,
    MASTER_WEIGHTS_DP_ERROR,
    SAMPLERS,
    SamplerContext,
    validate_run,
)
from rlvr.parts import AdvantageContext
from rlvr.trainer.context import TrainerPlanContext
from rlvr.trainer.mixture import build_loader
from rlvr.trainer.lifecycle import (
    RewardFailureWatch, RunInterrupted, RunSummary, StopControl, _Abandon, _Abort, restore_round, rollout_progress,
    round_snapshot,
)
from rlvr.trainer.idle import IdleTracker, RoundSignal
from rlvr.trainer.logger import NullLogger, RunLogger
from rlvr.trainer.metrics import peak_memory_mb
from rlvr.trainer.optim import build_optimizer, build_scheduler
from rlvr.trainer.overlap import RolloutPipeline
from rlvr.trainer.prepare import BatchPreparation
from rlvr.trainer.run_dir import clean_stale_temporaries, rotate_checkpoints
from rlvr.trainer.run_state import RunState, run_state_field
from rlvr.trainer.setup import apply_precision, disable_dropout, loss_settings, resolve_run_precision, seed_everything
from rlvr.trainer.steps import OptimizerSteps
from rlvr.trainer.update import MaskFn
from rlvr.types import RolloutBatch


class Trainer(BatchPreparation, OptimizerSteps):
    """GRPO-family trainer.

    Args:
        cfg: the validated run configuration.
        model: the policy (trained in place), its weights in the ``param_dtype`` of ``cfg.model.dtype``'s
            precision policy (float32 unless ``bf16-pure``); the policy is attached to it
            (:func:`apply_precision`): forwards autocast under ``bf16`` and the default engine decodes
            with bf16 weights. With ``model.lora.r > 0`` a plain model is wrapped with peft LoRA
            adapters here (only they train; ``self.model`` is then the ``PeftModel``); a model that
            already is a ``PeftModel`` is used as it is.
        tokenizer: its tokenizer (with a chat template).
        task: prompt source and verifier (:class:`rlvr.tasks.Task`).
        engine: generation backend; defaults to the one ``cfg.engine`` names
            (:func:`rlvr.engines.factory.build_engine`: ``hf`` = :class:`rlvr.engines.hf.HFEngine` on
            ``model``, ``vllm`` = a vLLM server the trainer owns and stops in :meth:`close`). Before each
            generation round :meth:`sync_weights` pushes the current weights to an engine that exposes a
            ``generation_sync`` sync point (no-op for one that shares ``model``).
        sampler: exploration strategy with ``sample(problems, G, params, policy_version=,
            first_group_id=) -> RolloutBatch``; defaults to ``SAMPLERS[cfg.sampler]``. A sampler may
            score its batch itself (rewards set) and attach structure a batch-level advantage
            estimator reads; it never sets advantages.
        schedule: a :class:`rlvr.schedules.Schedule` planning the optimizer steps of each generation
            batch; defaults to ``SCHEDULES[cfg.schedule]``.
        ref_model: reference policy for the KL term; loaded (copied) only when ``beta > 0``.
            With LoRA (``model.lora.r > 0``) no copy is made: the reference is the same model with its
            adapters disabled (:func:`rlvr.lora.reference_policy`).
        extra_mask_fns: mask hooks applied in every update, after those named by ``cfg.loss_masks``.
        output_dir: run directory; defaults to ``cfg.logging.output_dir``.
        dp: this rank's :class:`rlvr.distributed.DataParallel` under ``torchrun`` (None: one process).
            ``cfg`` is then the rank's config (:func:`rlvr.distributed.setup.local_config`) and
            ``run_config`` the job's (saved in checkpoints). The trainer shards the models (FSDP2) or
            keeps them replicated, draws this rank's prompts, all-reduces normalisers and metrics, and
            logs on rank 0 only.
        run_config: the job's config as the user wrote it (default ``cfg``).
        precision: the run's resolved :class:`~rlvr.precision.PrecisionPolicy` (``rlvr train`` resolves
            ``model.dtype`` once for the run's device and loads the model with it); None: ``cfg.model.dtype``
            resolved here for ``dp``'s device, else for the model's (:func:`resolve_run_precision`).
        validated: True when the caller already ran :func:`rlvr.trainer.components.validate_run` on this
            run (``rlvr train`` does, before any model loads); False (default): the trainer runs it first.

    Raises:
        ConfigError: ``validated=False`` and :func:`~rlvr.trainer.components.validate_run` refuses the run.
    """

    # views of self.run_state: the loop state a checkpoint saves (trainer/run_state.py)
    global_step = run_state_field("global_step")
    generation_round = run_state_field("generation_round")
    rollout_round = run_state_field("rollout_round")
    weight_version = run_state_field("weight_version")
    num_tokens = run_state_field("num_tokens")
    consecutive_nonfinite = run_state_field("consecutive_nonfinite")
    pending_round = run_state_field("pending_round")
    _carry = run_state_field("carry")
    _resume_round = run_state_field("resume_round")
    _pipeline = run_state_field("pipeline")

    def __init__(
        self,
        cfg: RLConfig,
        model: torch.nn.Module,
        tokenizer: Any,
        task: Any,
        *,
        engine: Any = None,
        sampler: Any = None,
        schedule: Any = None,
        ref_model: torch.nn.Module | None = None,
        extra_mask_fns: Sequence[MaskFn] = (),
        output_dir: str | Path | None = None,
        dp: Any = None,
        run_config: RLConfig | None = None,
        precision: PrecisionPolicy | None = None,
        validated: bool = False,
    ) -> None:
        if not validated:  # once per run: the CLI validated before loading the model and says so
            validate_run(cfg, task)
        seed_everything(cfg.seed)
        self.run_state = RunState()
        self.cfg = cfg
        self.run_config = run_config or cfg
        self.dp = dp
        self.rank = dp.rank if dp is not None else 0
        self.world_size = dp.world_size if dp is not None else 1
        self.precision = precision if precision is not None else resolve_run_precision(
            cfg.model, model, dp.env.device if dp is not None else None)  # once: sharding, forwards, engine
        if self.precision.master_weights and self.world_size > 1:
            raise ConfigError(MASTER_WEIGHTS_DP_ERROR)
        lora = cfg.model.lora.r > 0 or is_peft_model(model)
        model, ref_model, gen_model, sharded = self._prepare_models(model, ref_model, lora)
        self.model = model
        self.weight_sync: Callable[[int], Any] | None = None  # called with global_step before each round
        self.tokenizer = tokenizer
        self.task = task
        self.output_dir = Path(output_dir or cfg.logging.output_dir)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        apply_precision(model, cfg.model.dtype, self.precision)
        self._attach_engine(engine, gen_model, lora, sharded)
        self._build_parts(sampler, schedule, ref_model, extra_mask_fns)
        self.idle = IdleTracker(cfg.max_idle_rounds)
        self._round_signal: RoundSignal | None = None  # counts of the last generation round (for idle stops)
        self._draw_count = 0
        self._logger: RunLogger | None = None
        self.last_checkpoint: Path | None = None  # the newest resumable checkpoint this trainer wrote
        self.final_dir: Path | None = None  # the exported model folder (final/), once written
        self.summary = RunSummary()
        self.callbacks: list[Callable[["Trainer", dict[str, float]], None]] = []
        self._stop_asked: int | None = None  # request_stop(): polled at step boundaries like a first signal
        self.progress_total: int | None = cfg.max_steps  # the step bar's total (None: unknown; rlvr compare sets it)
        self._gen_version = 0  # policy version stamped on the rows being generated
        # max_async_level > 0: later rounds are generated in a background thread (trainer/overlap.py);
        # streaming.enable: a producer thread fills a buffer of whole groups (trainer/streaming.py)
        self._pipeline = RolloutPipeline(self, cfg.max_async_level) if cfg.max_async_level > 0 else None
        if cfg.streaming.enable:
            if self.world_size > 1:
                raise ConfigError("streaming.enable runs in one process (not under torchrun)")
            from rlvr.trainer.streaming import StreamingPipeline

            self._pipeline = StreamingPipeline(self, cfg.streaming)

    def _prepare_models(
        self, model: torch.nn.Module, ref_model: torch.nn.Module | None, lora: bool,
    ) -> tuple[torch.nn.Module, torch.nn.Module | None, torch.nn.Module, bool]:
        """LoRA adapters, dropout off, the KL reference copy, and (torchrun) device placement and sharding:
        ``(model, ref_model, gen_model, sharded)``, where ``gen_model`` is what the engine generates with."""
        cfg = self.cfg
        if cfg.model.lora.r > 0 and not is_peft_model(model):
            spec = cfg.model.model_dump(mode="json", exclude={"lora", "gradient_checkpointing"})
            model = apply_lora(model, cfg.model.lora, base_model_spec=spec)
        if cfg.disable_dropout:  # the loss forward sees the network old_logp, ref_logp and sampling see
            disable_dropout(model)
        self._ref_is_base = cfg.beta > 0 and ref_model is None and lora  # adapters disabled = reference
        if cfg.beta > 0 and ref_model is None and not self._ref_is_base:
            ref_model = copy.deepcopy(model)  # before any sharding: a full copy, sharded below like the policy
        gen_model, sharded = model, False
        dp = self.dp
        if dp is not None:  # seam: the one place models become rank-aware (device, FSDP2, generation copy)
            from rlvr.distributed.setup import prepare_models

            prepared = prepare_models(model, ref_model, cfg, dp.env, self.precision)
            model, ref_model, gen_model, sharded = prepared.model, prepared.ref_model, prepared.gen_model, prepared.sharded
        return model, ref_model, gen_model, sharded

    def _attach_engine(self, engine: Any, gen_model: torch.nn.Module, lora: bool, sharded: bool) -> None:
        """The generation engine (``engine``, or one built for the policy: a LoRA merged copy, the configured
        backend) and its weight push points ``weight_sync`` / ``generation_sync``."""
        cfg, model, tokenizer = self.cfg, self.model, self.tokenizer
        self._owns_engine = engine is None  # the trainer stops what it started (a vLLM server) in close()
        self._lora_sharded = lora and sharded  # torchrun + FSDP2: the copy is re-merged through generation_sync
        if engine is None and self._lora_sharded:
            from rlvr.engines.hf import HFEngine

            # the separate merged copy, or (generation_weights=gathered) the peft layers of the gathered policy
            engine = HFEngine(base_causal_lm(gen_model), tokenizer, precision=self.precision,
                              continuous=cfg.continuous_batching)
        elif engine is None and lora:
            engine, self.weight_sync = lora_engine(model, tokenizer, merged=cfg.model.lora.merged_generation,
                                                   precision=self.precision, continuous=cfg.continuous_batching)
        elif engine is None:
            engine = build_engine(cfg, gen_model, tokenizer, self.output_dir)
        if self.weight_sync is None and getattr(engine, "casts_weights", False):
            # a bf16 decode copy (model.dtype=bf16): re-cast once per policy version, before each round
            self.weight_sync = lambda step, _e=engine: _e.sync_weights(version=step)
        self.engine = engine
        # generation weights: a version counter and one push point (rlvr.distributed.weights.WeightSync);
        # an engine exposing `generation_sync` (e.g. vLLM) plugs in here; an unsharded policy needs none.
        # (`weight_sync` above is LoRA's pull-style callable for its merged copy.)
        self.generation_sync = getattr(engine, "generation_sync", None)
        self._gather_for_generation = sharded and gen_model is model  # distributed.generation_weights=gathered
        if self.generation_sync is None and sharded and not self._gather_for_generation:
            from rlvr.distributed.weights import ModuleCopySync

            self.generation_sync = ModuleCopySync(gen_model)

    def _build_parts(
        self, sampler: Any, schedule: Any, ref_model: torch.nn.Module | None, extra_mask_fns: Sequence[MaskFn],
    ) -> None:
        """The run's parts from the config: prompt encoder, scorer, sampler, schedule, prompt loader, optimizer,
        loss settings, advantage estimator, masks, batch filters and the frozen reference model."""
        cfg, task, tokenizer, engine, model = self.cfg, self.task, self.tokenizer, self.engine, self.model
        system_prompt = cfg.task.system_prompt or task.system_prompt
        self.encoder = PromptEncoder(tokenizer, system_prompt, cfg.max_prompt_length)
        # the task's verifier, or the weighted rewards: list (reward models, judges) around it
        self.scorer = build_scorer(cfg, task, tokenizer, device=next(model.parameters()).device,
                                   system_prompt=system_prompt)
        ctx = SamplerContext(cfg, engine, self.encoder, self.scorer, tokenizer, self.pad_token_id)
        self.sampler = sampler or SAMPLERS[cfg.sampler](ctx)
        self.schedule: Schedule = schedule or SCHEDULES[cfg.schedule](cfg)
        self.plan_ctx = TrainerPlanContext(self)  # all a schedule sees of the trainer
        self.loader = build_loader(task, cfg)  # a MixtureLoader for task.mixture (rlvr.trainer.mixture)
        if self.world_size > 1:
            from rlvr.distributed.data import RankPromptLoader

            self.loader = RankPromptLoader(self.loader, self.rank, self.world_size)
        self.optimizer = build_optimizer(model.parameters(), cfg, master_weights=self.precision.master_weights)
        self.scheduler = build_scheduler(self.optimizer, cfg)
        self.settings = loss_settings(cfg)
        self.adv_fn = ADV_ESTIMATORS[cfg.adv_estimator]
        section = ADV_ESTIMATORS.section_of(cfg.adv_estimator)
        self.adv_ctx = AdvantageContext(cfg, None if section is None else getattr(cfg, section), self.world_size,
                                        None if self.dp is None or self.world_size == 1 else self.dp.sum)
        self.extra_mask_fns = [MASKS[m](cfg) for m in cfg.loss_masks] + list(extra_mask_fns)
        self.batch_filters = [BATCH_FILTERS[f](cfg) for f in cfg.batch_filters]
        self.ref_model = None
        if cfg.beta > 0 and not self._ref_is_base:
            self.ref_model = ref_model
            self.ref_model.eval().requires_grad_(False)

    # ----------------------------------------------------------------------------- loop
    def train(self) -> dict[str, float]:
        """Run until ``max_steps`` optimizer updates; returns the last step's metrics.

        A summary (steps, wall time, reward start -> end, verifier errors and timeouts, the checkpoint)
        is printed to stderr at the end of every run, also one that fails or is interrupted; its
        counters stay in :attr:`summary`.

        Raises:
            TrainingError: ``max_consecutive_nonfinite`` updates in a row had a non-finite loss or
                gradient (a checkpoint is written first).
            RunInterrupted: SIGINT or SIGTERM (see :mod:`rlvr.trainer.lifecycle`): the update in
                progress is finished or the generation round in progress abandoned, and a
                checkpoint is written first.
            IdleRunError: ``max_idle_rounds`` generation rounds in a row gave no update and no trainable
                row (dynamic sampling exhausted, every row filtered out); a checkpoint is written first
                and the message gives the pass rate, the zero-variance share and what to try.
            RunStopped: a part of the run (e.g. ``rlvr compare``'s budget meter around the sampler) ended
                it on purpose; the summary says ``stopped (<why>)`` and no checkpoint is written.
        """
        cfg = self.cfg
        logger = self._logger = self._open_logger()
        last: dict[str, float] = {}
        t_run = time.perf_counter()
        self.summary = RunSummary()
        self.summary.start(self)
        self.reward_watch = RewardFailureWatch()
        status, stop = "failed", StopControl()
        try:
            stop.__enter__()
            while self.global_step < cfg.max_steps:
                req = self._agreed_stop(stop)
                if req is not None:
                    raise self._interrupted(req)
                t_step = time.perf_counter()
                batch, opt_batches, start, gen_metrics, gen_tokens = self._next_round(stop)
                step_before = self.global_step
                m = self._run_updates(batch, opt_batches, start, gen_metrics, gen_tokens, t_step, t_run, stop)
                last = m if m is not None else last
                # idle: nothing trainable came out of this round and nothing was trained (rows kept for a later
                # update, e.g. in a schedule's accumulation buffer, are progress)
                if self.idle.round_done(self.global_step > step_before or self._rows_anywhere(batch), self._round_signal):
                    path = self.save(self.output_dir / f"checkpoint-{self.global_step}")
                    raise IdleRunError(self.idle.message(cfg, path))
                if not opt_batches:
                    logger.message(f"generation round {self.generation_round}: no trainable groups, skipping "
                                   f"({self.idle.rounds}/{cfg.max_idle_rounds} idle rounds before the run stops)")
            self.save(self.output_dir / "final", hf_folder=True)
            status = "finished"
        except _Abort:
            raise RunInterrupted(stop.requested or signal.SIGINT, self.global_step, None) from None
        except RunInterrupted:
            status = "interrupted"
            raise
        except IdleRunError:
            status = "stopped (no learning signal)"
            raise
        except RewardFailureError:
            status = "stopped (every reward call failed)"
            raise
        except RunStopped as exc:  # a normal end asked for by a part of the run (a compare budget), not a failure
            status = f"stopped ({exc})"
            raise
        finally:
            self._close_run(logger, stop, status)
        return last

    def _open_logger(self) -> RunLogger | NullLogger:
        """The run's logger: rank 0 writes (after clearing a killed save's leftovers, before this run's first
        save; see run_dir for why it is safe), the other ranks of a job log nothing."""
        cfg = self.cfg
        if self.rank != 0:  # one writer per job: rank 0 logs the reduced metrics
            return NullLogger()
        clean_stale_temporaries(self.output_dir, log=lambda m: print(m, file=sys.stderr))
        trackers = build_trackers(cfg.logging.sinks, self.output_dir, self.run_config.model_dump(mode="json"),
                                  cfg.logging, resume=self.global_step > 0)
        return RunLogger(
            self.output_dir, self.progress_total, start_step=self.global_step,
            tensorboard="tensorboard" in cfg.logging.sinks, progress=cfg.logging.progress, trackers=trackers,
        )

    def _next_round(self, stop: StopControl) -> tuple[RolloutBatch, list[OptimizerStep], int, dict[str, float], int]:
        """The generation round to train on next and its plan: ``(batch, opt_batches, start, gen_metrics,
        gen_tokens)``, where updates before ``start`` are already done (a resumed round). Sets
        ``pending_round`` (what a checkpoint saves) and ``_round_signal``.

        Raises:
            RunInterrupted: a signal abandoned the round being generated (its state is put back first).
            RewardFailureError: see :meth:`_check_reward_failures`.
        """
        self._round_signal = None
        if self._resume_round is not None:  # resumed mid generation batch: same plan, skip done updates
            batch, opt_batches, start = self._replan_resumed()
            gen_metrics, gen_tokens = {}, 0
        else:
            snap = None
            if self._pipeline is not None:  # overlap: a signal stops at the next update boundary
                r = self._pipeline.next()
                self._last_samples = self._sample_rows(r.batch)
            else:
                snap = round_snapshot(self)
                try:
                    # a signal abandons the round; under torchrun the round finishes (it holds
                    # collectives) and the ranks stop together at the next step boundary
                    abandon = stop.abandonable() if self.world_size == 1 else contextlib.nullcontext()
                    with abandon, rollout_progress(self):
                        r = self.prepare_round()
                except _Abandon:
                    restore_round(self, snap)
                    raise self._interrupted(stop.requested) from None
            batch, gen_metrics, self._round_signal = r.batch, r.metrics, r.signal
            self._check_reward_failures(r.reward_counts, snap)
            gen_tokens = int(batch.model_mask.sum()) if len(batch) else 0
            self.pending_round = pending_round_state(self, batch)
            opt_batches = self.schedule.plan(batch, self.plan_ctx) if len(batch) else []
            start = 0
        opt_batches = self._equalise_updates(opt_batches, batch)
        self.pending_round["num_opt_batches"] = len(opt_batches)
        return batch, opt_batches, start, gen_metrics, gen_tokens

    def _run_updates(
        self, batch: RolloutBatch, opt_batches: list[OptimizerStep], start: int, gen_metrics: dict[str, float],
        gen_tokens: int, t_step: float, t_run: float, stop: StopControl,
    ) -> dict[str, float] | None:
        """Run the round's optimizer updates from index ``start`` (up to ``max_steps``), logging each step's
        metrics row; returns the last row, or None when no update ran. ``t_step``/``t_run``: perf-counter
        seconds at the round's and the run's start (for the timing and throughput metrics).

        Raises:
            RunInterrupted: a stop was requested; the update in progress is finished first.
        """
        last = None
        for i, ob in enumerate(opt_batches):
            if i < start:
                continue
            if self.global_step >= self.cfg.max_steps:
                break
            m = self._update(ob)
            self.global_step += 1
            self.pending_round["next_index"] = i + 1
            if i == 0:
                m.update(gen_metrics)
                m["perf/generated_tokens_per_s"] = gen_tokens / max(gen_metrics.get("timing/generate_s", 0), 1e-9)
            m["timing/step_s"] = time.perf_counter() - t_step
            m["perf/tokens_per_s"] = self.num_tokens / max(time.perf_counter() - t_run, 1e-9)
            m["perf/num_tokens"] = float(self.num_tokens)
            m["perf/peak_memory_mb"] = peak_memory_mb()
            m["generation/round"] = float(self.generation_round)
            t_step = time.perf_counter()
            m = self._reduce_step_metrics(m)  # torchrun: the job's row, the same on every rank
            last = m
            self._after_step(m)
            self.summary.observe(m)
            req = self._agreed_stop(stop)
            if req is not None:  # the update in progress is finished: stop here
                raise self._interrupted(req)
        return last

    def _close_run(self, logger: RunLogger | NullLogger, stop: StopControl, status: str) -> None:
        """End of :meth:`train` on every path: stop the generation thread, restore the signal handlers, close
        the logger and the scorer, and print the run summary (rank 0) with ``status``.

        Raises:
            OSError: closing the logger failed and no other error is on its way out.
        """
        if self._pipeline is not None:
            try:
                self._pipeline.drain()  # no generation thread outlives train()
            except Exception:
                pass
        stop.__exit__()
        in_flight = sys.exc_info()[1]
        try:
            logger.close()
        except OSError:
            if in_flight is None:
                raise
            # an error is already on its way out (e.g. the named disk-full error of the log write
            # that left this unflushed buffer): it is the one to report, and the summary still prints
        if hasattr(self.scorer, "close"):
            self.scorer.close()
        self.summary.update_counts(self)
        if self.rank == 0:
            print(self.summary.text(self.global_step, self.last_checkpoint, status, final=self.final_dir),
                  file=sys.stderr, flush=True)

    def _check_reward_failures(self, counts: list[int] | None, snap: dict[str, Any] | None = None) -> None:
        """Count one generation round's reward calls, summed over ranks (one all-reduce under torchrun, so
        every rank takes the same decision and the summary is the job's).

        Raises:
            RewardFailureError: every call failed in ``REWARD_FAILURE_ROUNDS`` rounds in a row; a checkpoint
                is written first (issue 25 items 4.8, 4.9), of the state before this round when ``snap``
                (its :func:`round_snapshot`) is given, so a resumed run generates the round again.
        """
        if counts is None:
            return
        if self.dp is not None and self.world_size > 1:
            counts = self.dp.sum([float(c) for c in counts])
        if self.reward_watch.round_done(*(int(round(c)) for c in counts)):
            if snap is not None:
                restore_round(self, snap)
            path = self.save(self.output_dir / f"checkpoint-{self.global_step}")
            raise RewardFailureError(self.reward_watch.message(path, getattr(self.scorer, "last_error", None)))

    def _agreed_stop(self, stop: StopControl) -> int | None:
        """The signal to stop on, agreed by every rank (one all-reduce under torchrun: a rank that got
        SIGTERM a moment later still stops at the same step), or None."""
        req = stop.requested or self._stop_asked
        if self.dp is None or self.world_size == 1:
            return req
        got = self.dp.max([float(req or 0)])[0]
        return int(got) if got else None

    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        """Ask :meth:`train` to stop at the next step boundary exactly as a first ``signum`` would: the
        update in progress is finished, a checkpoint is written and :class:`RunInterrupted` is raised
        (with ``signum``). For callers that stop a run themselves, e.g. a time-limited comparison
        piece (:mod:`rlvr.compare.pieces`); call it from a callback. Single process only (under
        ``torchrun`` every rank would have to ask at the same step).

        Raises:
            RuntimeError: under ``torchrun`` (world size > 1).
        """
        if self.world_size > 1:
            raise RuntimeError("Trainer.request_stop: single process only (send SIGTERM to every rank instead)")
        self._stop_asked = int(signum)

    def _interrupted(self, signum: int) -> RunInterrupted:
        """Write a checkpoint of the state now (a step boundary) and build the exception to raise."""
        path = self.output_dir / f"checkpoint-{self.global_step}"
        if self.last_checkpoint != path:
            self.save(path)
        return RunInterrupted(signum, self.global_step, path)

    def _replan_resumed(self) -> tuple[RolloutBatch, list[OptimizerStep], int]:
        """Rebuild the optimizer batches of a generation batch restored from a checkpoint.

        The schedule state, global RNG state and step count are set to what they were when the batch
        was first planned, the plan is recomputed, then the RNG is put back to the checkpoint's state;
        the updates already done (``next_index``) are skipped by the caller.
        """
        r, self._resume_round = self._resume_round, None
        assert r is not None
        batch = r["batch"]
        now_rng, now_step = capture_rng_state(), self.global_step
        self.schedule.load_state_dict(r["schedule_state"])
        restore_rng_state(r["rng"])
        self.global_step = r["plan_step"]
        try:
            opt_batches = self.schedule.plan(batch, self.plan_ctx) if len(batch) else []
        finally:
            self.global_step = now_step
            restore_rng_state(now_rng)
        self.pending_round = {**r, "next_index": r["next_index"]}
        self._last_samples = self._sample_rows(batch)
        return batch, opt_batches, int(r["next_index"])

    def _rows_anywhere(self, batch: RolloutBatch) -> bool:
        """Whether this round left a trainable row on any rank (the idle rule must agree on every rank)."""
        if self.dp is None or self.world_size == 1:
            return len(batch) > 0
        return self.dp.max([float(len(batch))])[0] > 0

    def _equalise_updates(self, opt_batches: list[OptimizerStep], batch: RolloutBatch) -> list[OptimizerStep]:
        """Pad this rank's updates with empty ones up to the most any rank has this round (every rank
        takes every optimizer step together; a rank whose groups were all filtered out contributes 0)."""
        if self.dp is None or self.world_size == 1:
            return opt_batches
        n = int(self.dp.max([len(opt_batches)])[0])
        return list(opt_batches) + [OptimizerStep(batch.select([])) for _ in range(n - len(opt_batches))]

    def close(self) -> None:
        """Release what the trainer started: the engine's server when the trainer built the engine
        (idempotent; also runs at interpreter exit)."""
        if self._pipeline is not None:
            self._pipeline.close()
        if self._owns_engine and hasattr(self.engine, "close"):
            self.engine.close()

    def save(self, path: Path, *, hf_folder: bool = False) -> Path:
        """Write a checkpoint (model as safetensors, optimizer, scheduler, loader, RNG, config); a
        ``checkpoint-N`` folder under the output dir then counts towards ``save_total_limit``. Under
        ``torchrun`` every rank calls it (:mod:`rlvr.trainer.dist_checkpoint`); rank 0 rotates.

        With overlap, the generation in flight is awaited first, so the checkpoint holds the queued
        rounds and the loader position after them (exact resume)."""
        if self._pipeline is not None and not hf_folder:
            self._pipeline.drain()
        if self.dp is not None and self.dp.env.backend is not None:
            from rlvr.trainer.dist_checkpoint import save_distributed

            out = save_distributed(self, path, hf_folder=hf_folder)
        else:
            out = save_checkpoint(self, path, hf_folder=hf_folder)
        if hf_folder:
            self.final_dir = out
        else:
            self.last_checkpoint = out
        if not hf_folder and out.parent == self.output_dir and self.rank == 0:
            rotate_checkpoints(self.output_dir, self.cfg.save_total_limit)
        return out

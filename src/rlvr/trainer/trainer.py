"""The training loop: it wires a sampler, a scorer, the core loss and a schedule. No algorithm math here.

Schedule (``grpo_core.md`` §4, §10): each generation batch of ``generation_batch_size`` completions
feeds ``steps_per_generation × num_iterations`` optimizer updates; groups are reshuffled between
passes. ``max_steps`` counts optimizer updates (TRL semantics).
"""

from __future__ import annotations

import contextlib
import copy
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from rlvr.config import RLConfig
from rlvr.core.advantages import get_adv_estimator
from rlvr.core.kl import canonical_kl_estimator, kl_penalty
from rlvr.core.objective import LossSettings
from rlvr.engines.factory import build_engine
from rlvr.errors import IdleRunError, RlvrError, RunStopped
from rlvr.loggers import build_trackers, check_report_to
from rlvr.lora import apply_lora, base_causal_lm, is_peft_model, iter_merged, lora_engine, reference_policy
from rlvr.precision import PrecisionPolicy, resolve_precision, set_model_precision
from rlvr.rewards import Scorer
from rlvr.samplers.group import PromptEncoder
from rlvr.trainer.checkpoint import capture_rng_state, pending_round_state, restore_rng_state, save_checkpoint
from rlvr.schedules import SCHEDULES, OptimizerStep, Schedule
from rlvr.trainer.components import (
    BATCH_ADV_ESTIMATORS,
    BATCH_FILTERS,
    MASKS,
    SAMPLERS,
    SamplerContext,
    validate_components,
)
from rlvr.trainer.context import TrainerPlanContext
from rlvr.trainer.data import PromptLoader
from rlvr.trainer.forward import batch_logprobs
from rlvr.trainer.lifecycle import (
    RunInterrupted, RunSummary, StopControl, _Abandon, _Abort, restore_round, rollout_progress, round_snapshot,
)
from rlvr.trainer.idle import IdleTracker, RoundSignal
from rlvr.trainer.logger import NullLogger, RunLogger
from rlvr.trainer.metrics import peak_memory_mb, rollout_metrics
from rlvr.trainer.optim import build_optimizer, build_scheduler
from rlvr.trainer.overlap import RolloutPipeline
from rlvr.trainer.rollout import assign_advantages, check_filter_metric, collect_generation_batch
from rlvr.trainer.run_dir import clean_stale_temporaries, rotate_checkpoints
from rlvr.trainer.update import MaskFn, policy_update
from rlvr.types import RolloutBatch, SamplingParams


class TrainingError(RlvrError):
    """Training cannot continue (e.g. too many consecutive non-finite updates)."""


def apply_precision(model: torch.nn.Module, requested: str) -> PrecisionPolicy:
    """Resolve ``model.dtype`` for the model's device and attach the policy to the model (and so to
    every forward of it and to the default engine; :mod:`rlvr.precision`).

    Raises:
        RlvrError: the model's floating-point weights are not in the policy's ``param_dtype`` (e.g.
            ``bf16-pure`` for an fp32 model, or ``bf16``/``fp32`` — fp32 master weights — for a bf16 one);
            the message says how to load it.
    """
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    policy = resolve_precision(requested, param.device if param is not None else "cpu")
    if param is not None and param.dtype != policy.param_dtype:
        raise RlvrError(
            f"model.dtype={requested} (precision {policy.mode}) keeps the weights in "
            f"{str(policy.param_dtype).removeprefix('torch.')}, but the model's are "
            f"{str(param.dtype).removeprefix('torch.')}: load it with rlvr.models.load_policy(cfg.model) or "
            f"convert it first (model.to({policy.param_dtype}))"
        )
    set_model_precision(model, policy)
    return policy


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch RNGs (CPU runs are then reproducible)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def loss_settings(cfg: RLConfig) -> LossSettings:
    """The core's loss settings from the run config (``kl_in_reward`` moves KL out of the loss)."""
    return LossSettings(
        epsilon=cfg.epsilon,
        epsilon_high=cfg.epsilon_high,
        clip_ratio_c=cfg.clip_ratio_c,
        importance_sampling_level=cfg.importance_sampling_level,
        loss_agg_mode=cfg.loss_agg_mode,
        seq_denominator=cfg.seq_denominator,
        loss_scale_factor=cfg.loss_scale_factor if cfg.loss_scale_factor else float(cfg.max_completion_length),
        beta=0.0 if cfg.kl_in_reward else cfg.beta,
        kl_estimator=canonical_kl_estimator(cfg.kl_estimator),
        kl_is_correction=cfg.kl_is_correction,
        entropy_coef=cfg.entropy_coef,
        policy_loss=cfg.policy_loss,
        rollout_is_mode=cfg.vllm_importance_sampling_mode if cfg.vllm_importance_sampling_correction else None,
        rollout_is_clip_max=cfg.vllm_importance_sampling_clip_max,
        rollout_is_clip_min=cfg.vllm_importance_sampling_clip_min,
    )


class Trainer:
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
    """

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
    ) -> None:
        check_report_to(cfg.logging.sinks)  # a missing tracker package fails before any work
        seed_everything(cfg.seed)
        self.cfg = cfg
        self.run_config = run_config or cfg
        self.dp = dp
        self.rank = dp.rank if dp is not None else 0
        self.world_size = dp.world_size if dp is not None else 1
        lora = cfg.model.lora.r > 0 or is_peft_model(model)
        if cfg.model.lora.r > 0 and not is_peft_model(model):
            spec = cfg.model.model_dump(mode="json", exclude={"lora", "gradient_checkpointing"})
            model = apply_lora(model, cfg.model.lora, base_model_spec=spec)
        self._ref_is_base = cfg.beta > 0 and ref_model is None and lora  # adapters disabled = reference
        if cfg.beta > 0 and ref_model is None and not self._ref_is_base:
            ref_model = copy.deepcopy(model)  # before any sharding: a full copy, sharded below like the policy
        gen_model, sharded = model, False
        if dp is not None:  # seam: the one place models become rank-aware (device, FSDP2, generation copy)
            from rlvr.distributed.setup import prepare_models

            prepared = prepare_models(model, ref_model, cfg, dp.env)
            model, ref_model, gen_model, sharded = prepared.model, prepared.ref_model, prepared.gen_model, prepared.sharded
        self.model = model
        self.weight_sync: Callable[[int], Any] | None = None  # called with global_step before each round
        self.tokenizer = tokenizer
        self.task = task
        self.output_dir = Path(output_dir or cfg.logging.output_dir)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.precision = apply_precision(model, cfg.model.dtype)
        validate_components(cfg)  # before a server is started
        check_filter_metric(cfg, task)
        self._owns_engine = engine is None  # the trainer stops what it started (a vLLM server) in close()
        self._lora_sharded = lora and sharded  # torchrun + FSDP2: the copy is re-merged through generation_sync
        if engine is None and self._lora_sharded:
            from rlvr.engines.hf import HFEngine

            # the separate merged copy, or (generation_weights=gathered) the peft layers of the gathered policy
            engine = HFEngine(base_causal_lm(gen_model), tokenizer, precision=self.precision)
        elif engine is None and lora:
            engine, self.weight_sync = lora_engine(model, tokenizer, merged=cfg.model.lora.merged_generation,
                                                   precision=self.precision)
        elif engine is None:
            engine = build_engine(cfg, gen_model, tokenizer, self.output_dir)
        if self.weight_sync is None and getattr(engine, "casts_weights", False):
            # a bf16 decode copy (model.dtype=bf16): re-cast once per policy version, before each round
            self.weight_sync = lambda step, _e=engine: _e.sync_weights(version=step)
        self.engine = engine
        # generation weights: a version counter and one push point (rlvr.distributed.weights.WeightSync);
        # an engine exposing `generation_sync` (e.g. vLLM) plugs in here; an unsharded policy needs none.
        # (`weight_sync` above is LoRA's pull-style callable for its merged copy.)
        self.weight_version = 0
        self.generation_sync = getattr(engine, "generation_sync", None)
        self._gather_for_generation = sharded and gen_model is model  # distributed.generation_weights=gathered
        if self.generation_sync is None and sharded and not self._gather_for_generation:
            from rlvr.distributed.weights import ModuleCopySync

            self.generation_sync = ModuleCopySync(gen_model)
        system_prompt = cfg.task.system_prompt or task.system_prompt
        self.encoder = PromptEncoder(tokenizer, system_prompt, cfg.max_prompt_length)
        self.scorer = Scorer(
            task, tokenizer, fatal=cfg.reward_errors_fatal, timeout_s=cfg.reward_timeout_s,
            num_workers=cfg.reward_num_workers,
        )
        ctx = SamplerContext(cfg, engine, self.encoder, self.scorer, tokenizer, self.pad_token_id)
        self.sampler = sampler or SAMPLERS[cfg.sampler](ctx)
        self.schedule: Schedule = schedule or SCHEDULES[cfg.schedule](cfg)
        self.plan_ctx = TrainerPlanContext(self)  # all a schedule sees of the trainer
        self.loader = PromptLoader(task.problems("train"), seed=cfg.seed)
        if self.world_size > 1:
            from rlvr.distributed.data import RankPromptLoader

            self.loader = RankPromptLoader(self.loader, self.rank, self.world_size)
        self.optimizer = build_optimizer(model.parameters(), cfg)
        self.scheduler = build_scheduler(self.optimizer, cfg)
        self.settings = loss_settings(cfg)
        self.batch_adv_fn = BATCH_ADV_ESTIMATORS.get(cfg.adv_estimator)
        self.adv_fn = None if self.batch_adv_fn is not None else get_adv_estimator(cfg.adv_estimator)
        self.extra_mask_fns = [MASKS[m](cfg) for m in cfg.loss_masks] + list(extra_mask_fns)
        self.batch_filters = [BATCH_FILTERS[f](cfg) for f in cfg.batch_filters]
        self.ref_model = None
        if cfg.beta > 0 and not self._ref_is_base:
            self.ref_model = ref_model
            self.ref_model.eval().requires_grad_(False)
        self.global_step = 0
        self.generation_round = 0  # rounds handed to training (what schedules read)
        self.rollout_round = 0  # rounds generated (seeds, group ids); ahead of generation_round under overlap
        self.num_tokens = 0
        self.consecutive_nonfinite = 0
        self.idle = IdleTracker(cfg.max_idle_rounds)
        self._round_signal: RoundSignal | None = None  # counts of the last generation round (for idle stops)
        self._draw_count = 0
        self._carry: list[RolloutBatch] = []
        # the generation batch being trained on, for checkpoints (see checkpoint.py): batch, the
        # schedule state and RNG state from just before planning, the step at planning, next index
        self.pending_round: dict[str, Any] | None = None
        self._resume_round: dict[str, Any] | None = None  # set by load_checkpoint: re-plan, skip done updates
        self._logger: RunLogger | None = None
        self.last_checkpoint: Path | None = None  # the newest resumable checkpoint this trainer wrote
        self.final_dir: Path | None = None  # the exported model folder (final/), once written
        self.summary = RunSummary()
        self.callbacks: list[Callable[["Trainer", dict[str, float]], None]] = []
        self._stop_asked: int | None = None  # request_stop(): polled at step boundaries like a first signal
        self._gen_version = 0  # policy version stamped on the rows being generated
        # max_async_level > 0: later rounds are generated in a background thread (trainer/overlap.py)
        self._pipeline = RolloutPipeline(self, cfg.max_async_level) if cfg.max_async_level > 0 else None

    # ----------------------------------------------------------------------------- rollouts
    @property
    def updates_per_generation(self) -> int:
        """μ = ``steps_per_generation × num_iterations``."""
        return self.cfg.steps_per_generation * self.cfg.num_iterations

    def sampling_params(self) -> SamplingParams:
        """Sampling settings of the current generation round; the seed is derived from the run seed
        and the round index (``rollout_round``), so a resumed run draws the same rollouts."""
        c = self.cfg
        return SamplingParams(
            temperature=c.temperature, top_p=c.top_p, top_k=c.top_k, max_new_tokens=c.max_completion_length,
            seed=(c.seed * 1_000_003 + self.rollout_round * 7919 + self.rank * 104_729) % 2**31,
        )

    def _draw(self, k: int) -> RolloutBatch:
        problems = self.loader.next(k)
        # group ids unique over the job: draw d of rank r gets block d·W + r
        first = self.rollout_round * 1_000_000 + (self._draw_count * self.world_size + self.rank) * k
        self._draw_count += 1
        return self.sampler.sample(
            problems, self.cfg.num_generations, self.sampling_params(), policy_version=self._gen_version,
            first_group_id=first,
        )

    def _logprobs(self, model: torch.nn.Module, batch: RolloutBatch) -> torch.Tensor:
        logp, _ = batch_logprobs(
            model, batch, pad_token_id=self.pad_token_id, rows_per_micro=self.cfg.per_device_train_batch_size,
            chunk_size=self.cfg.logprob_chunk_size, share_prompt=self.cfg.share_prompt_forward,
        )
        return logp

    def sync_weights(self) -> None:
        """Push the trained weights to the generation engine when it is behind ``weight_version``
        (every rank; a collective when the policy is sharded)."""
        ws = self.generation_sync
        if ws is not None and ws.version != self.weight_version:
            from rlvr.distributed.weights import full_named_tensors

            if self._lora_sharded:  # only the adapted projections change: push W + ΔW, computed on gathered weights
                with self.dp.inference(self.model):
                    ws.push(iter_merged(self.model), self.weight_version)
            else:
                ws.push(full_named_tensors(self.model), self.weight_version)

    def _needs_trainer_old_logp(self) -> bool:
        cfg = self.cfg
        return (cfg.beta > 0 and cfg.kl_in_reward) or (bool(self.schedule.needs_old_logp) and cfg.old_logprob_source == "trainer")

    def generate_batch(self, policy_version: int | None = None) -> tuple[RolloutBatch, dict[str, float]]:
        """The one preparation path of a generation batch: sample → score → shape rewards (overlong
        penalty; KL in the reward) → advantages → batch filters.

        This is the only writer of ``old_logp`` / ``ref_logp`` of a generation batch and the only place
        advantages are computed (a batch-level estimator of :data:`rlvr.parts.BATCH_ADV_ESTIMATORS`, or a
        group estimator of :data:`rlvr.core.advantages.ADV_ESTIMATORS`), so shaping reaches every
        sampler's advantages.

        Args:
            policy_version: ``None`` (synchronous): push the current weights to the engine if needed
                (:meth:`sync_weights`) and stamp the rows with ``global_step``. An int (the overlap
                pipeline, running this in a background thread): the engine already holds that version;
                nothing here reads the module being trained, and behaviour log-probs are the engine's
                (``sampler_logp``).

        Returns:
            ``(batch, metrics)``: the prepared batch (possibly empty) and its per-round scalars.
        """
        cfg = self.cfg
        timings: dict[str, float] = {}
        overlapped = policy_version is not None
        if not overlapped:
            t = time.perf_counter()
            self.sync_weights()
            timings["timing/weight_sync_s"] = time.perf_counter() - t
        self._gen_version = self.global_step if policy_version is None else int(policy_version)
        t0 = time.perf_counter()
        self._draw_count = 0
        score_time = 0.0
        timeouts_before = getattr(self.scorer, "timeouts_total", 0)
        if self.weight_sync is not None and not overlapped:  # the engine samples from a separate copy (e.g. merged LoRA weights)
            self.weight_sync(self.global_step)

        def score(b: RolloutBatch):
            nonlocal score_time
            t = time.perf_counter()
            s = self.scorer.score(b)
            score_time += time.perf_counter() - t
            return s

        gathered = self.dp.inference(self.model) if self._gather_for_generation else contextlib.nullcontext()
        with gathered:  # generation_weights=gathered: the shards are gathered once for the whole round
            batch, cstats, self._carry = collect_generation_batch(
                self._draw, score, cfg, pad_token_id=self.pad_token_id, carry=self._carry
            )
        if self.world_size > 1:  # ranks that drew fewer times (dynamic sampling) skip their slices of the
            n = int(self.dp.max([self._draw_count])[0])  # others' draws: every rank's loader stays identical
            for _ in range(n - self._draw_count):
                self.loader.next(cfg.prompts_per_generation)
        timings["timing/reward_s"] = score_time
        timings["timing/generate_s"] = time.perf_counter() - t0 - score_time
        self.rollout_round += 1
        signal_ = RoundSignal.of(cstats.raw_batches)
        if overlapped:  # handed to the main thread with its round (trainer/overlap.py)
            batch.meta["round_signal"] = signal_
        else:
            self.generation_round = self.rollout_round
            self._round_signal = signal_
        metrics: dict[str, float] = {}
        if len(batch) == 0:
            if self.dp is not None and self.dp.fsdp:  # sharded forwards are collectives: join them with no rows
                if self._needs_trainer_old_logp():
                    self._logprobs(self.model, batch)
                if self.ref_model is not None:
                    self._logprobs(self.ref_model, batch)
            if self._global_batch_std():  # the all-reduce of the job's reward std, with no rows
                self._assign_advantages(batch)
            return batch, {**timings, "dynamic_sampling/shortfall": float(cstats.shortfall)}
        self._behaviour_logprobs(batch, timings, overlapped=overlapped)
        self._advantages(batch)
        sampled = batch  # rollout metrics describe what was sampled, before filters (which may drop every row)
        for f in self.batch_filters:
            batch = f(batch)
        all_rows = RolloutBatch.concat(cstats.raw_batches, self.pad_token_id) if len(cstats.raw_batches) > 1 else None
        metrics.update(rollout_metrics(sampled if all_rows is None else all_rows,
                                       tuple(getattr(self.sampler, "view_only_kinds", ()))))  # seam: second views
        metrics.update(batch.meta.get("metrics", {}))  # seam: samplers, estimators and filters report scalars here
        if all_rows is not None:
            metrics["advantages/mean"] = float(batch.advantages.mean())
            metrics["advantages/abs_mean"] = float(batch.advantages.abs().mean())
        metrics.update(timings)
        metrics["reward/verifier_errors"] = float(cstats.score.errors)
        metrics["reward/verifier_timeouts"] = float(getattr(self.scorer, "timeouts_total", 0) - timeouts_before)
        metrics["prompts/truncated_total"] = float(self.encoder.truncated)
        if cfg.dynamic_sampling.enable:
            metrics["dynamic_sampling/num_gen_batches"] = float(cstats.rounds)
            metrics["dynamic_sampling/kept_group_frac"] = cstats.groups_kept / max(cstats.groups_seen, 1)
            metrics["dynamic_sampling/shortfall"] = float(cstats.shortfall)
        if not overlapped:
            self._last_samples = self._sample_rows(batch)
        return batch, metrics

    def _behaviour_logprobs(self, batch: RolloutBatch, timings: dict[str, float], *, overlapped: bool = False) -> None:
        """Set ``old_logp`` (when the schedule needs it, or for KL in the reward) and ``ref_logp`` (``beta > 0``)
        and shape the rewards by ``−beta · KL(π_old ‖ π_ref)`` summed over tokens with ``kl_in_reward``.

        ``overlapped`` (generation in the overlap thread, ``max_async_level > 0``): the trained module has
        moved on, so the behaviour log-probs are always the engine's (``sampler_logp``).

        Raises:
            TrainingError: ``overlapped`` and the sampler gives no ``sampler_logp``.
        """
        cfg = self.cfg
        need_old = bool(self.schedule.needs_old_logp)
        if overlapped:
            if batch.sampler_logp is None:
                raise TrainingError(f"max_async_level={cfg.max_async_level}: sampler {cfg.sampler!r} gives no "
                                    "behaviour log-probs (sampler_logp)")
            batch.old_logp = batch.sampler_logp
        elif self._needs_trainer_old_logp():
            t = time.perf_counter()
            batch.old_logp = self._logprobs(self.model, batch)
            timings["timing/old_logprob_s"] = time.perf_counter() - t
        if need_old and cfg.old_logprob_source == "sampler" and not overlapped:
            batch.old_logp = batch.sampler_logp
        if self.ref_model is not None or self._ref_is_base:
            t = time.perf_counter()
            with (reference_policy(self.model) if self._ref_is_base else contextlib.nullcontext(self.ref_model)) as ref:
                batch.ref_logp = self._logprobs(ref, batch)
            timings["timing/ref_logprob_s"] = time.perf_counter() - t
            if cfg.kl_in_reward:
                kl = kl_penalty(batch.old_logp, batch.ref_logp, canonical_kl_estimator(cfg.kl_estimator))
                batch.rewards = batch.rewards - cfg.beta * (kl * batch.completion_mask).sum(dim=1)
        if not need_old and not overlapped:
            batch.old_logp = None  # every row trained once, at once: ratio ≡ 1 via sg(logp)

    def _advantages(self, batch: RolloutBatch) -> None:
        """Advantages of the (shaped) batch: the batch-level estimator, or the group estimator with its
        group-size check; estimator metrics join ``meta["metrics"]``."""
        if self.batch_adv_fn is not None:
            m = self.batch_adv_fn(batch, self.cfg) or {}
            if m:
                batch.meta["metrics"] = {**batch.meta.get("metrics", {}), **m}
        else:
            self._assign_advantages(batch)

    def _global_batch_std(self) -> bool:
        """``scale_rewards=batch`` over several ranks: the std is the job's (all-reduced), not the rank's."""
        return self.world_size > 1 and self.cfg.scale_rewards == "batch" and self.cfg.adv_estimator == "grpo"

    def _assign_advantages(self, batch: RolloutBatch) -> None:
        if not self._global_batch_std():
            assign_advantages(batch, self.cfg, self.adv_fn)
            return
        from rlvr.distributed.stats import global_std

        # (r − mean_g) / (std_job + eps): GRPO's batch scaling with the std of every rank's rewards
        std = global_std(batch.rewards, self.dp, unbiased=self.cfg.adv_std_unbiased)
        if len(batch) == 0:
            return
        assign_advantages(batch, self.cfg.model_copy(update={"scale_rewards": "none"}), self.adv_fn)
        batch.advantages = batch.advantages / (std + self.cfg.adv_eps)

    def _sample_rows(self, batch: RolloutBatch) -> list[dict[str, Any]]:
        k = self.cfg.logging.num_completions_to_print
        rows = []
        for i in range(min(k, len(batch))):
            p = batch.problems[int(batch.prompt_index[i])]
            rows.append({
                "question": getattr(p, "question", str(p)),
                "completion": batch.texts[i] if batch.texts else "",
                "reward": float(batch.rewards[i]),
                "feedback": batch.feedback[i] if batch.feedback else None,
            })
        return rows

    # ----------------------------------------------------------------------------- updates
    def _update(self, step: OptimizerStep) -> dict[str, float]:
        cfg = self.cfg
        for action in step.start:  # a schedule's entry actions (e.g. optimizer reset at a stage start); they
            getattr(self.plan_ctx, action)()  # run once: a resumed run skips the updates already done
        t = time.perf_counter()
        self.model.train()
        opt_batch = step.batch
        res = policy_update(
            self.model, self.optimizer, opt_batch, step.loss_settings or self.settings, pad_token_id=self.pad_token_id,
            rows_per_micro=cfg.per_device_train_batch_size, loss_norm_scope=cfg.loss_norm_scope,
            mask_truncated=cfg.mask_truncated_completions, max_grad_norm=cfg.max_grad_norm,
            chunk_size=cfg.logprob_chunk_size, extra_mask_fns=self.extra_mask_fns,
            loss_inputs=step.loss_inputs, share_prompt=cfg.share_prompt_forward, dp=self.dp,
        )
        phase = step.phase
        m = {f"{phase}/{k}": v for k, v in res.metrics.items()} if phase else dict(res.metrics)
        m.update(step.metrics)
        m["timing/update_s"] = time.perf_counter() - t
        m["actor/lr"] = self.optimizer.param_groups[0]["lr"]
        if len(opt_batch):  # a rank may run an empty update to keep step with the others
            staleness = (self.global_step - opt_batch.policy_version).float()
            m["staleness/mean"] = float(staleness.mean())
            m["staleness/max"] = float(staleness.max())
        if res.skipped:
            self.consecutive_nonfinite += 1
            m["actor/skipped_nonfinite"] = 1.0
        else:
            self.consecutive_nonfinite = 0
            self.scheduler.step()
            self.weight_version += 1
            m["actor/skipped_nonfinite"] = 0.0
        self.num_tokens += res.tokens
        return m

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
        if self.rank == 0:  # before this run's first save: a killed save's leftovers (run_dir: why it is safe)
            clean_stale_temporaries(self.output_dir, log=lambda m: print(m, file=sys.stderr))
            trackers = build_trackers(cfg.logging.sinks, self.output_dir, self.run_config.model_dump(mode="json"),
                                      cfg.logging, resume=self.global_step > 0)
            logger = RunLogger(
                self.output_dir, cfg.max_steps, start_step=self.global_step,
                tensorboard="tensorboard" in cfg.logging.sinks, progress=cfg.logging.progress, trackers=trackers,
            )
        else:  # one writer per job: rank 0 logs the reduced metrics
            logger = NullLogger()
        self._logger = logger
        last: dict[str, float] = {}
        t_run = time.perf_counter()
        self.summary = RunSummary()
        self.summary.start(self)
        status, stop = "failed", StopControl()
        try:
            stop.__enter__()
            while self.global_step < cfg.max_steps:
                req = self._agreed_stop(stop)
                if req is not None:
                    raise self._interrupted(req)
                t_step = time.perf_counter()
                self._round_signal = None
                if self._resume_round is not None:  # resumed mid generation batch: same plan, skip done updates
                    batch, opt_batches, start = self._replan_resumed()
                    gen_metrics, gen_tokens = {}, 0
                else:
                    if self._pipeline is not None:  # overlap: a signal stops at the next update boundary
                        batch, gen_metrics = self._pipeline.next()
                        self._round_signal = batch.meta.pop("round_signal", None)
                        self._last_samples = self._sample_rows(batch)
                    else:
                        snap = round_snapshot(self)
                        try:
                            # a signal abandons the round; under torchrun the round finishes (it holds
                            # collectives) and the ranks stop together at the next step boundary
                            abandon = stop.abandonable() if self.world_size == 1 else contextlib.nullcontext()
                            with abandon, rollout_progress(self):
                                batch, gen_metrics = self.generate_batch()
                        except _Abandon:
                            restore_round(self, snap)
                            raise self._interrupted(stop.requested) from None
                    gen_tokens = int(batch.completion_mask.sum()) if len(batch) else 0
                    self.pending_round = pending_round_state(self, batch)
                    opt_batches = self.schedule.plan(batch, self.plan_ctx) if len(batch) else []
                    start = 0
                opt_batches = self._equalise_updates(opt_batches, batch)
                self.pending_round["num_opt_batches"] = len(opt_batches)
                step_before = self.global_step
                for i, ob in enumerate(opt_batches):
                    if i < start:
                        continue
                    if self.global_step >= cfg.max_steps:
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
        except RunStopped as exc:  # a normal end asked for by a part of the run (a compare budget), not a failure
            status = f"stopped ({exc})"
            raise
        finally:
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
        return last

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

    def _reduce_step_metrics(self, m: dict[str, float]) -> dict[str, float]:
        """Under torchrun, one all-gather of every rank's row reduced by name
        (:func:`rlvr.distributed.metrics.reduce_metric_dicts`); ``m`` itself in one process."""
        if self.dp is None or self.world_size == 1:
            return m
        from rlvr.distributed.metrics import reduce_metric_dicts

        return reduce_metric_dicts(self.dp.gather(m), loss_is_partial=self.cfg.loss_norm_scope == "global")

    def _after_step(self, m: dict[str, float]) -> None:
        cfg, logger = self.cfg, self._logger
        assert logger is not None
        if self.global_step % cfg.logging.logging_steps == 0 or self.global_step == cfg.max_steps:
            logger.log(self.global_step, m)
        every = cfg.logging.log_completions_steps
        if every and (self.global_step - 1) % every == 0:  # steps 1, 1 + every, ...
            logger.log_completions(self.global_step, getattr(self, "_last_samples", []))
        for cb in self.callbacks:
            cb(self, m)
        if self.consecutive_nonfinite >= cfg.max_consecutive_nonfinite:
            self.save(self.output_dir / f"checkpoint-{self.global_step}")
            raise TrainingError(
                f"{self.consecutive_nonfinite} consecutive updates had a non-finite loss or gradient "
                f"(max_consecutive_nonfinite={cfg.max_consecutive_nonfinite}); stopped at step "
                f"{self.global_step} and wrote a checkpoint. Try a lower learning_rate or max_grad_norm."
            )
        if cfg.save_steps and self.global_step % cfg.save_steps == 0:
            self.save(self.output_dir / f"checkpoint-{self.global_step}")

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

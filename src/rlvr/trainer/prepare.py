"""The top half of a training iteration: one generation batch prepared for the updates.

:class:`BatchPreparation` holds the :class:`~rlvr.trainer.trainer.Trainer` methods from the weight
push to the batch filters (sample → score → shape rewards → behaviour / reference log-probs →
advantages → filters). It is its own module because it is its own seam: the overlap pipeline
(:mod:`rlvr.trainer.overlap`) runs exactly this half in a background thread, ahead of the updates,
and it changes with samplers, estimators and reward shaping, not with the loop, the optimizer step
or checkpointing. A mixin (not free functions) so the methods keep their ``self`` code and the
``Trainer`` attributes they read and write stay where ``Trainer.__init__`` sets them.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from rlvr.core.kl import canonical_kl_estimator, kl_penalty
from rlvr.errors import TrainingError
from rlvr.lora import iter_merged, reference_policy
from rlvr.trainer.forward import batch_logprobs
from rlvr.trainer.idle import RoundSignal
from rlvr.trainer.metrics import rollout_metrics
from rlvr.parts import compute_advantages
from rlvr.trainer.rollout import collect_generation_batch
from rlvr.types import RolloutBatch, SamplingParams

REWARD_COUNTERS = ("calls_total", "errors_total", "timeouts_total")
"""The scorer's cumulative counters a generation round's :attr:`RoundResult.reward_counts` is the change of."""


@dataclass(frozen=True)
class RoundResult:
    """What one generation round hands to the loop (the overlap thread's queue holds these).

    Attributes:
        batch: the prepared batch (advantages set, filters applied; possibly empty).
        metrics: the round's scalars (rollout, reward, timing, sampler and estimator metrics).
        signal: counts over every row sampled in the round, for the idle-round stop
            (:class:`rlvr.trainer.idle.RoundSignal`).
        reward_counts: this round's reward calls, errors and timeouts (:data:`REWARD_COUNTERS`), for the
            job-wide failure rule of the loop (:meth:`rlvr.trainer.trainer.Trainer._check_reward_failures`).
    """

    batch: RolloutBatch
    metrics: dict[str, float] = field(default_factory=dict)
    signal: RoundSignal | None = None
    reward_counts: tuple[int, ...] | None = None


class BatchPreparation:
    """Mixin of :class:`~rlvr.trainer.trainer.Trainer`: drawing prompts, sampling, scoring, reward
    shaping, behaviour / reference log-probs and advantages of one generation batch
    (:meth:`generate_batch`), and the weight push before it (:meth:`sync_weights`).

    It reads the state ``Trainer.__init__`` sets (``cfg``, ``model``, ``ref_model``, ``engine``,
    ``sampler``, ``scorer``, ``loader``, ``schedule``, ``dp``, the round counters) and is not used on
    its own.
    """

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
        """:meth:`prepare_round`'s ``(batch, metrics)``; in the synchronous loop its signal becomes the
        round's (``_round_signal``, read by the idle-round stop)."""
        r = self.prepare_round(policy_version)
        if policy_version is None:
            self._round_signal = r.signal
        return r.batch, r.metrics

    def prepare_round(self, policy_version: int | None = None) -> RoundResult:
        """The one preparation path of a generation batch: sample → score → shape rewards (overlong
        penalty; KL in the reward) → advantages → batch filters.

        This is the only writer of ``old_logp`` / ``ref_logp`` of a generation batch and the only place
        advantages are computed (the estimator of :data:`rlvr.parts.ADV_ESTIMATORS`), so shaping reaches
        every sampler's advantages.

        Args:
            policy_version: ``None`` (synchronous): push the current weights to the engine if needed
                (:meth:`sync_weights`) and stamp the rows with ``global_step``. An int (the overlap
                pipeline, running this in a background thread): the engine already holds that version;
                nothing here reads the module being trained, and behaviour log-probs are the engine's
                (``sampler_logp``).

        Returns:
            The :class:`RoundResult`: the prepared batch (possibly empty), its per-round scalars and
            the round's signal.
        """
        timings: dict[str, float] = {}
        overlapped = policy_version is not None
        batch, cstats, reward_counts, timeouts_before = self._generate_round(policy_version, timings)
        self.rollout_round += 1
        signal_ = RoundSignal.of(cstats.raw_batches)  # handed to the loop with the round (RoundResult)
        if not overlapped:
            self.generation_round = self.rollout_round
        if len(batch) == 0:
            if self.dp is not None and self.dp.fsdp:  # sharded forwards are collectives: join them with no rows
                if self._needs_trainer_old_logp():
                    self._logprobs(self.model, batch)
                if self.ref_model is not None:
                    self._logprobs(self.ref_model, batch)
            self._advantages(batch)  # joins the estimator's collectives (scale_rewards=batch), with no rows
            return RoundResult(batch, {**timings, "dynamic_sampling/shortfall": float(cstats.shortfall)}, signal_,
                               reward_counts)
        self._behaviour_logprobs(batch, timings, overlapped=overlapped)
        self._advantages(batch)
        sampled = batch  # rollout metrics describe what was sampled, before filters (which may drop every row)
        for f in self.batch_filters:
            batch = f(batch)
        metrics = self._round_metrics(batch, sampled, cstats, timings, timeouts_before)
        if not overlapped:
            self._last_samples = self._sample_rows(batch)
        return RoundResult(batch, metrics, signal_, reward_counts)

    def _generate_round(self, policy_version: int | None, timings: dict[str, float]) -> tuple[RolloutBatch, Any, tuple, int]:
        """Sample and score one generation batch (:func:`rlvr.trainer.rollout.collect_generation_batch`, dynamic
        sampling included), after the weight push when synchronous (``policy_version`` None); under torchrun
        every rank's prompt loader then skips to the same place. Adds the weight-sync, reward and generation
        seconds to ``timings``.

        Returns:
            ``(batch, cstats, reward_counts, timeouts_before)``: the scored batch, the collection's
            statistics, this round's reward calls / errors / timeouts (:data:`REWARD_COUNTERS` deltas) and
            the scorer's timeout total before the round.
        """
        cfg = self.cfg
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
        counts_before = [getattr(self.scorer, k, 0) for k in REWARD_COUNTERS]
        if self.weight_sync is not None and not overlapped:  # the engine samples from a separate copy (e.g. merged LoRA weights)
            self.weight_sync(self.global_step)

        def score(b: RolloutBatch):
            nonlocal score_time
            t = time.perf_counter()
            s = self.scorer.score(b)
            score_time += time.perf_counter() - t
            return s

        if hasattr(self.loader, "set_step"):  # a mixture: weights_by_step reads the policy's step
            self.loader.set_step(self._gen_version)
        gathered = self.dp.inference(self.model) if self._gather_for_generation else contextlib.nullcontext()
        with gathered:  # generation_weights=gathered: the shards are gathered once for the whole round
            batch, cstats, self._carry = collect_generation_batch(
                self._draw, score, cfg, pad_token_id=self.pad_token_id, carry=self._carry
            )
        if self.world_size > 1:  # ranks that drew fewer times (dynamic sampling) skip their slices of the
            n = int(self.dp.max([self._draw_count])[0])  # others' draws: every rank's loader stays identical
            for _ in range(n - self._draw_count):
                self.loader.next(cfg.prompts_per_generation)
        if hasattr(self.loader, "observe"):  # a mixture's curriculum: this round's pass rate per source (job-wide)
            from rlvr.trainer.mixture import round_counts

            self.loader.observe(round_counts(cstats.raw_batches, self.loader.labels,
                                             self.dp if self.world_size > 1 else None))
        timings["timing/reward_s"] = score_time
        # this round's reward calls (calls, errors, timeouts), for the job-wide failure rule (Trainer.train)
        reward_counts = tuple(getattr(self.scorer, k, 0) - b for k, b in zip(REWARD_COUNTERS, counts_before))
        timings["timing/generate_s"] = time.perf_counter() - t0 - score_time
        return batch, cstats, reward_counts, timeouts_before

    def _round_metrics(self, batch: RolloutBatch, sampled: RolloutBatch, cstats: Any, timings: dict[str, float],
                       timeouts_before: int) -> dict[str, float]:
        """The round's scalars: rollout metrics of what was sampled (every raw batch when dynamic sampling
        merged several), the parts' ``batch.metrics``, the advantages after the filters, ``timings``, the
        verifier's errors and timeouts, truncated prompts and the dynamic-sampling counts."""
        cfg = self.cfg
        metrics: dict[str, float] = {}
        all_rows = RolloutBatch.concat(cstats.raw_batches, self.pad_token_id) if len(cstats.raw_batches) > 1 else None
        metrics.update(rollout_metrics(sampled if all_rows is None else all_rows,
                                       tuple(getattr(self.sampler, "view_only_kinds", ()))))  # seam: second views
        metrics.update(batch.metrics)  # seam: samplers, estimators and filters report scalars here
        if hasattr(self.loader, "round_metrics"):  # a mixture: reward/<source>/mean, pass rate, weight
            metrics.update(self.loader.round_metrics(sampled if all_rows is None else all_rows))
        if all_rows is not None:
            metrics["advantages/mean"] = float(batch.advantages.mean())
            metrics["advantages/abs_mean"] = float(batch.advantages.abs().mean())
        metrics.update(timings)
        if hasattr(self.scorer, "round_metrics"):  # rewards: list: judge/reward-model counters since the last round
            metrics.update(self.scorer.round_metrics())
        metrics["reward/verifier_errors"] = float(cstats.score.errors)
        metrics["reward/verifier_timeouts"] = float(getattr(self.scorer, "timeouts_total", 0) - timeouts_before)
        metrics["prompts/truncated_total"] = float(self.encoder.truncated)
        if cfg.dynamic_sampling.enable:
            metrics["dynamic_sampling/num_gen_batches"] = float(cstats.rounds)
            metrics["dynamic_sampling/kept_group_frac"] = cstats.groups_kept / max(cstats.groups_seen, 1)
            metrics["dynamic_sampling/shortfall"] = float(cstats.shortfall)
        return metrics

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
                knob = "streaming.enable" if cfg.streaming.enable else f"max_async_level={cfg.max_async_level}"
                raise TrainingError(f"{knob}: sampler {cfg.sampler!r} gives no behaviour log-probs (sampler_logp)")
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
                batch.rewards = batch.rewards - cfg.beta * (kl * batch.model_mask).sum(dim=1)
        if not need_old and not overlapped:
            batch.old_logp = None  # every row trained once, at once: ratio ≡ 1 via sg(logp)

    def _advantages(self, batch: RolloutBatch) -> None:
        """Advantages of the (shaped) batch from the run's estimator (:func:`rlvr.parts.compute_advantages`;
        job-wide statistics through :attr:`adv_ctx`); its metrics join ``batch.metrics``."""
        m = compute_advantages(self.adv_fn, batch, self.adv_ctx)
        batch.metrics.update(m)

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

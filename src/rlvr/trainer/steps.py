"""The bottom half of a training iteration: one optimizer update and what follows it.

:class:`OptimizerSteps` holds the :class:`~rlvr.trainer.trainer.Trainer` methods that run one
planned :class:`~rlvr.schedules.OptimizerStep` (``policy_update``, learning-rate step, the
non-finite counter, the step's metrics), reduce its metrics over ranks, and act on them afterwards
(log, completions, callbacks, the ``max_consecutive_nonfinite`` stop, ``save_steps``). Separate
from the loop in :mod:`rlvr.trainer.trainer` (rounds, stopping, resume) because it changes with the
update and its metrics, not with how rounds are scheduled or a run is stopped. A mixin so the
methods keep their ``self`` code.
"""

from __future__ import annotations

import time

from rlvr.errors import TrainingError
from rlvr.schedules import OptimizerStep
from rlvr.trainer.update import policy_update


class OptimizerSteps:
    """Mixin of :class:`~rlvr.trainer.trainer.Trainer`: one optimizer update (:meth:`_update`), the
    metric reduction over ranks and the per-step actions after it (:meth:`_after_step`).

    It reads the state ``Trainer.__init__`` sets (``cfg``, ``model``, ``optimizer``, ``scheduler``,
    ``plan_ctx``, ``dp``, ``callbacks``, the step counters) and is not used on its own.
    """

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
            step_guard=getattr(self._pipeline, "step_guard", None),  # streaming: the producer sees whole updates
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

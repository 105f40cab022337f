"""FBOS-RL's schedule: split one generation batch by context kind into the EPA and ECC optimizer
batches, alternately (default) or jointly (``specs/fbos_rl.md`` §2.9).

* ``fbos.combine_mode=alternate``: per pass, one optimizer step on the EPA view (original context,
  ``POLICY_LOSSES["fbos_epa"]``) and one on the ECC view (FAP context, the run's ``policy_loss``),
  in ``fbos.update_order``. ``fbos.ecc_weight`` multiplies the ECC advantages (the policy term is
  linear in ``Â``); ``ecc_weight=0`` skips the ECC step (EPA-only ablation). The ECC step is also
  skipped when no prompt received FAP rollouts — then ``fbos/optimizer_steps_per_step`` logs 1.
* ``fbos.combine_mode=joint``: one optimizer step on both views with
  ``L = agg_EPA(ℓ) + λ_ECC·agg_ECC(ℓ)``, each view normalised over its own tokens/sequences
  (per-view token weights, :func:`rlvr.core.fbos.view_normalised_weights`, summed with
  ``loss_agg_mode=token-sum``).

Step accounting: the trainer counts ``max_steps`` in optimizer updates, so one FBOS training step
(one generation batch) is 2 trainer steps in ``alternate`` mode and 1 in ``joint`` mode: set
``max_steps = 2 × training steps`` for alternate (the GRPO equal-updates control is the on-policy
schedule with ``steps_per_generation=2``).

``π_old`` log-probs of both views are computed once, before the first update, each row under its own
context (spec §2.9); the same no-grad pass gives the per-view entropies and the θ_old values of
``loss/epa`` and ``loss/ecc``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from rlvr.core.aggregation import aggregate
from rlvr.core.fbos import epa_policy_loss, offpolicy_weight, view_normalised_weights
from rlvr.core.policy_loss import get_policy_loss
from rlvr.errors import ConfigError
from rlvr.samplers.feedback import KIND_FEEDBACK, KIND_ORIGINAL, KIND_ORIGINAL_OFFPOLICY, is_epa_kind
from rlvr.trainer.forward import batch_logprobs
from rlvr.trainer.update import loss_weights
from rlvr.types import RolloutBatch


def _masked_mean(x: torch.Tensor, m: torch.Tensor) -> float:
    n = float(m.sum())
    return float((x * m).sum()) / n if n > 0 else 0.0


class AlternatingViews:
    """The ``fbos`` schedule (``SCHEDULES["fbos"]``).

    Args:
        cfg: the run config (reads ``fbos.*``, ``num_iterations``, ``per_device_train_batch_size``,
            ``logprob_chunk_size``, ``mask_truncated_completions`` and the aggregation settings).

    Raises:
        ConfigError: ``steps_per_generation > 1`` (each view is one optimizer batch; use
            ``num_iterations`` for more passes).
    """

    def __init__(self, cfg: Any) -> None:
        if cfg.steps_per_generation != 1:
            raise ConfigError(
                f"schedule=fbos: steps_per_generation={cfg.steps_per_generation} is not supported; each view is "
                "one optimizer batch (alternate: EPA then ECC). Use num_iterations for more passes"
            )
        self.cfg = cfg
        self.fbos = cfg.fbos

    # ----------------------------------------------------------------------------- helpers
    def loss_kwargs(self, micro: RolloutBatch) -> dict[str, Any]:
        """Inputs of ``POLICY_LOSSES["fbos_epa"]`` for one micro-batch: ``is_offpolicy`` ``[n]`` from the
        rows' ``context_kind``, ``behaviour_logp`` ``[n, T]`` (the sampler's ``log π_old(z | c_j)``) and
        the weighting switches."""
        kinds = micro.context_kind or [KIND_ORIGINAL] * len(micro)
        return {
            "is_offpolicy": torch.tensor([k == KIND_ORIGINAL_OFFPOLICY for k in kinds], dtype=torch.bool),
            "behaviour_logp": micro.sampler_logp,
            "offpolicy_weight_kind": self.fbos.epa_offpolicy_weight,
            "gamma": self.fbos.shaping_gamma,
            "cap": self.fbos.trunc_is_cap,
        }

    def prepass(self, trainer: Any, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(old_logp, entropy)``, each ``[N, T]``: every row under its own context, current weights."""
        return batch_logprobs(
            trainer.model, batch, pad_token_id=trainer.pad_token_id,
            rows_per_micro=self.cfg.per_device_train_batch_size, chunk_size=self.cfg.logprob_chunk_size,
            with_entropy=True,
        )

    def _metrics(self, trainer: Any, batch: RolloutBatch, ent: torch.Tensor, n_updates: int) -> dict[str, float]:
        cfg, f = self.cfg, self.fbos
        kinds = batch.context_kind or [KIND_ORIGINAL] * len(batch)
        W = loss_weights(batch, mask_truncated=cfg.mask_truncated_completions)
        M = batch.completion_mask
        row = lambda pred: torch.tensor([pred(k) for k in kinds], dtype=M.dtype)[:, None]  # noqa: E731
        init, off, ecc = row(lambda k: k == KIND_ORIGINAL), row(lambda k: k == KIND_ORIGINAL_OFFPOLICY), row(
            lambda k: k == KIND_FEEDBACK
        )
        epa = init + off
        old = batch.old_logp
        w_off = offpolicy_weight(
            old, f.epa_offpolicy_weight, gamma=f.shaping_gamma, cap=f.trunc_is_cap,
            behaviour_logp=batch.sampler_logp, old_logp=old,
        )
        s = trainer.settings

        def view_loss(mask: torch.Tensor, epa_view: bool) -> float:
            Wv = W * mask
            if float(Wv.sum()) == 0:
                return 0.0
            if epa_view:
                tok, _ = epa_policy_loss(
                    old, old, batch.advantages, M, epsilon=s.epsilon, epsilon_high=s.epsilon_high,
                    clip_ratio_c=s.clip_ratio_c, importance_sampling_level=s.importance_sampling_level,
                    **{k: v for k, v in self.loss_kwargs(batch).items()},
                )
            else:
                tok, _ = get_policy_loss(s.policy_loss)(
                    old, old, batch.advantages * f.ecc_weight, M, epsilon=s.epsilon, epsilon_high=s.epsilon_high,
                    clip_ratio_c=s.clip_ratio_c, importance_sampling_level=s.importance_sampling_level,
                )
            return float(aggregate(tok, Wv, s.loss_agg_mode, seq_denominator=s.seq_denominator,
                                   loss_scale_factor=s.loss_scale_factor))

        return {
            "entropy/x_initial": _masked_mean(ent, M * init),
            "entropy/epa": _masked_mean(ent, M * epa),
            "entropy/ecc": _masked_mean(ent, M * ecc),
            "entropy/epa_offpolicy": _masked_mean(ent, M * off),
            "fbos/offpolicy_weight_mean": _masked_mean(w_off, M * off),
            "loss/epa": view_loss(epa, True),
            "loss/ecc": view_loss(ecc, False),
            "fbos/optimizer_steps_per_step": float(n_updates),
            "fbos/epa_rows": float(epa.sum()),
            "fbos/ecc_rows": float(ecc.sum()),
        }

    # ----------------------------------------------------------------------------- plan
    def plan(self, trainer: Any, batch: RolloutBatch) -> list[RolloutBatch]:
        """EPA and ECC optimizer batches for one generation batch (see the module docstring)."""
        cfg, f = self.cfg, self.fbos
        kinds = batch.context_kind or [KIND_ORIGINAL] * len(batch)
        old, ent = self.prepass(trainer, batch)
        if not (batch.meta.get("fbos_old_logp") and batch.old_logp is not None):
            batch.old_logp = old  # a re-planned (resumed) batch keeps the π_old of its first planning
            batch.meta["fbos_old_logp"] = True
        epa_idx = [i for i, k in enumerate(kinds) if is_epa_kind(k)]
        ecc_idx = [i for i, k in enumerate(kinds) if k == KIND_FEEDBACK]
        epa_settings = dataclasses.replace(trainer.settings, policy_loss="fbos_epa")
        out: list[RolloutBatch] = []
        if f.combine_mode == "joint":
            W = loss_weights(batch, mask_truncated=cfg.mask_truncated_completions)
            view = torch.tensor([0 if is_epa_kind(k) else 1 for k in kinds], dtype=torch.long)
            s = trainer.settings
            joint = batch.select(range(len(batch)))
            u = view_normalised_weights(
                W, view, s.loss_agg_mode, seq_denominator=s.seq_denominator, loss_scale_factor=s.loss_scale_factor,
                view_scale={1: f.ecc_weight},
            )
            joint.token_weights = u[:, : joint.completion_mask.shape[1]]
            joint.meta = {
                "phase": "joint",
                "loss_settings": dataclasses.replace(epa_settings, loss_agg_mode="token-sum"),
                "loss_kwargs_fn": self.loss_kwargs,
            }
            steps = [joint]
        else:
            steps = []
            if epa_idx:
                epa = batch.select(epa_idx)
                epa.meta = {"phase": "epa", "loss_settings": epa_settings, "loss_kwargs_fn": self.loss_kwargs}
                steps.append(epa)
            if ecc_idx and f.ecc_weight > 0:
                ecc = batch.select(ecc_idx)
                ecc.advantages = ecc.advantages * f.ecc_weight
                ecc.meta = {"phase": "ecc", "loss_settings": trainer.settings}
                steps.append(ecc)
            if f.update_order == "ecc_first":
                steps.reverse()
        if not steps:
            return []
        steps[0].meta["update_metrics"] = self._metrics(trainer, batch, ent, len(steps) * cfg.num_iterations)
        for _ in range(cfg.num_iterations):
            out.extend(steps)
        return out

    def state_dict(self) -> dict[str, Any]:
        """No state: each generation batch is planned on its own."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (see :meth:`state_dict`)."""

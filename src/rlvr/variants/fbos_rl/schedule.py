"""FBOS-RL's schedule, ``SCHEDULES["fbos"]``: split one generation batch by context kind into the EPA and ECC optimizer
batches, alternately (default) or jointly (``docs/fbos_rl.md`` §2.9).

* ``fbos.combine_mode=alternate``: per pass, one optimizer step on the EPA view (original context,
  ``POLICY_LOSSES["fbos_epa"]``) and one on the ECC view (FAP context, the run's ``policy_loss``),
  in ``fbos.update_order``. ``fbos.ecc_weight`` multiplies the ECC advantages (the policy term is
  linear in ``Â``); ``ecc_weight=0`` skips the ECC step (EPA-only ablation). The ECC step is also
  skipped when it has no signal on any rank — no prompt received FAP rollouts, or every FAP rollout's
  advantage is 0 (all ``G2`` of a prompt scored alike, e.g. none passed) and the loss has no KL or
  entropy term — then ``fbos/ecc_skipped`` logs 1 and ``fbos/optimizer_steps_per_step`` 1.
  Interpretation, because the gradient of such a step is exactly 0 but AdamW would still move the
  weights (the first moment left by the EPA step, and decoupled weight decay) and count a step in its
  bias correction: an update on a batch that carries no signal. Skipping it costs no forward/backward
  and keeps the weights bit-identical; ``max_steps`` counts the updates taken, as with no FAP rows.
* ``fbos.combine_mode=joint``: one optimizer step on both views with
  ``L = agg_EPA(ℓ) + λ_ECC·agg_ECC(ℓ)``, each view normalised over its own tokens/sequences
  (per-view token weights, :func:`rlvr.core.fbos.view_normalised_weights`, summed with
  ``loss_agg_mode=token-sum``).

Step accounting: the trainer counts ``max_steps`` in optimizer updates, so one FBOS training step
(one generation batch) is 2 trainer steps in ``alternate`` mode and 1 in ``joint`` mode: set
``max_steps = 2 × training steps`` for alternate (the GRPO equal-updates control is the on-policy
schedule with ``steps_per_generation=2``).

``π_old`` log-probs of both views are computed once, before the first update, each row under its own
context (spec §2.9), by the trainer's preparation path (``needs_old_logp``); a no-grad pass through the
plan context gives the per-view entropies, and the θ_old values of ``loss/epa`` and ``loss/ecc`` are
computed from the stored ``old_logp``. The EPA step's per-row inputs (``is_offpolicy``,
``behaviour_logp``) travel as the step's ``loss_inputs``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from rlvr.core.aggregation import aggregate
from rlvr.core.fbos import epa_policy_loss, offpolicy_weight, view_normalised_weights
from rlvr.core.policy_loss import get_policy_loss
from rlvr.errors import ConfigError
from rlvr.core.masks import loss_weights
from rlvr.schedules.base import SCHEDULES, OptimizerStep, PlanContext
from rlvr.types import KIND_FEEDBACK, KIND_ORIGINAL, KIND_ORIGINAL_OFFPOLICY, RolloutBatch, is_epa_kind
from rlvr.variants.fbos_rl.config import FBOSConfig


def _masked_mean(x: torch.Tensor, m: torch.Tensor) -> float:
    n = float(m.sum())
    return float((x * m).sum()) / n if n > 0 else 0.0


class AlternatingViews:
    """The ``fbos`` schedule (``SCHEDULES["fbos"]``).

    Args:
        cfg: the run config (reads ``fbos.*``, ``num_iterations``, ``mask_truncated_completions``).

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

    needs_old_logp = True  # the second view's step runs after the first moved the policy (spec §2.9)

    @property
    def primary_phase(self) -> str:
        """The phase whose ``actor/*`` metrics stand for the run's in summaries (``rlvr compare``):
        ``"epa"`` in alternate mode — the update on the task's own prompt ``x``; the ECC step's entropy is
        on the FAP context and its gradient is 0 when no FAP rollout passes — and ``"joint"`` in joint
        mode (its only phase)."""
        return "joint" if self.fbos.combine_mode == "joint" else "epa"

    # ----------------------------------------------------------------------------- helpers
    def loss_inputs(self, batch: RolloutBatch) -> dict[str, Any]:
        """Inputs of ``POLICY_LOSSES["fbos_epa"]`` for ``batch``: ``is_offpolicy`` ``[N]`` from the rows'
        ``context_kind``, ``behaviour_logp`` ``[N, T]`` (the sampler's ``log π_old(z | c_j)``) and the
        weighting switches (row-aligned tensors are cut per micro-batch by the trainer)."""
        kinds = batch.context_kind or [KIND_ORIGINAL] * len(batch)
        return {
            "is_offpolicy": torch.tensor([k == KIND_ORIGINAL_OFFPOLICY for k in kinds], dtype=torch.bool),
            "behaviour_logp": batch.sampler_logp,
            "offpolicy_weight_kind": self.fbos.epa_offpolicy_weight,
            "gamma": self.fbos.shaping_gamma,
            "cap": self.fbos.trunc_is_cap,
        }

    def _metrics(self, ctx: PlanContext, batch: RolloutBatch, ent: torch.Tensor, n_updates: int) -> dict[str, float]:
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
        s = ctx.settings

        def view_loss(mask: torch.Tensor, epa_view: bool) -> float:
            Wv = W * mask
            if float(Wv.sum()) == 0:
                return 0.0
            if epa_view:
                tok, _ = epa_policy_loss(
                    old, old, batch.advantages, M, epsilon=s.epsilon, epsilon_high=s.epsilon_high,
                    clip_ratio_c=s.clip_ratio_c, importance_sampling_level=s.importance_sampling_level,
                    **self.loss_inputs(batch),
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

    def _has_signal(self, batch: RolloutBatch, settings: Any) -> bool:
        """Whether an update on ``batch`` under ``settings`` can have a non-zero gradient: some token with
        loss weight > 0 has a non-zero advantage, or the loss has a KL (``beta > 0``) or entropy
        (``entropy_coef != 0``) term, which pull on every weighted token. ``False`` for an empty batch."""
        if len(batch) == 0:
            return False
        W = loss_weights(batch, mask_truncated=self.cfg.mask_truncated_completions)
        if not bool((W > 0).any()):
            return False
        if settings.beta > 0 or settings.entropy_coef != 0:
            return True
        A = batch.advantages if batch.advantages.dim() == 2 else batch.advantages[:, None]
        return bool(((A[:, : W.shape[1]] != 0) & (W > 0)).any())

    # ----------------------------------------------------------------------------- plan
    def plan(self, batch: RolloutBatch, ctx: PlanContext) -> list[OptimizerStep]:
        """EPA and ECC optimizer steps for one generation batch (see the module docstring). The first
        step's ``metrics`` carry the ``fbos/*``, ``entropy/*`` and ``loss/*`` values of the round,
        ``fbos/ecc_skipped`` (1.0: alternate mode left the ECC step out for lack of signal) among them.
        Under ``torchrun`` every rank calls it (:meth:`PlanContext.any_rank` is a collective).

        Raises:
            ValueError: the batch has no ``old_logp`` (the trainer's preparation path sets it).
        """
        cfg, f = self.cfg, self.fbos
        if batch.old_logp is None:
            raise ValueError("schedule=fbos: the prepared batch has no old_logp (needs_old_logp is True)")
        if f.epa_fb_positive_only:  # the EPA view keeps only feedback-guided rollouts with Â ≥ 0 (spec §3)
            off = torch.tensor([k == KIND_ORIGINAL_OFFPOLICY for k in batch.context_kind or []], dtype=torch.bool)
            if off.numel():
                batch = batch.select((~(off & (batch.advantages < 0))).nonzero(as_tuple=True)[0])
        kinds = batch.context_kind or [KIND_ORIGINAL] * len(batch)
        _, ent = ctx.logprobs(batch, with_entropy=True)
        assert ent is not None
        epa_idx = [i for i, k in enumerate(kinds) if is_epa_kind(k)]
        ecc_idx = [i for i, k in enumerate(kinds) if k == KIND_FEEDBACK]
        epa_settings = dataclasses.replace(ctx.settings, policy_loss="fbos_epa")
        steps: list[dict[str, Any]] = []
        ecc_skipped = 0.0
        if f.combine_mode == "joint":
            W = loss_weights(batch, mask_truncated=cfg.mask_truncated_completions)
            view = torch.tensor([0 if is_epa_kind(k) else 1 for k in kinds], dtype=torch.long)
            s = ctx.settings
            joint = batch.select(range(len(batch)))
            u = view_normalised_weights(
                W, view, s.loss_agg_mode, seq_denominator=s.seq_denominator, loss_scale_factor=s.loss_scale_factor,
                view_scale={1: f.ecc_weight},
            )
            joint.token_weights = u[:, : joint.completion_mask.shape[1]]
            steps.append({"batch": joint, "phase": "joint", "loss_inputs": self.loss_inputs(joint),
                          "loss_settings": dataclasses.replace(epa_settings, loss_agg_mode="token-sum")})
        else:
            if epa_idx:
                epa = batch.select(epa_idx)
                steps.append({"batch": epa, "phase": "epa", "loss_settings": epa_settings,
                              "loss_inputs": self.loss_inputs(epa)})
            ecc = batch.select(ecc_idx)
            ecc.advantages = ecc.advantages * f.ecc_weight
            # one decision for the whole job: every rank plans the same steps in the same order (a rank
            # without FAP rows, or without signal in them, takes the ECC step with what it has)
            ecc_on = f.ecc_weight > 0 and ctx.any_rank(self._has_signal(ecc, ctx.settings))
            ecc_skipped = float(f.ecc_weight > 0 and not ecc_on)
            if ecc_on:
                steps.append({"batch": ecc, "phase": "ecc", "loss_settings": ctx.settings})
            if f.update_order == "ecc_first":
                steps.reverse()
        if not steps:
            return []
        steps[0]["metrics"] = {**self._metrics(ctx, batch, ent, len(steps) * cfg.num_iterations),
                               "fbos/ecc_skipped": ecc_skipped}
        return [OptimizerStep(**st) for st in steps] * cfg.num_iterations  # metrics logged in every pass

    def state_dict(self) -> dict[str, Any]:
        """No state: each generation batch is planned on its own."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (see :meth:`state_dict`)."""


@SCHEDULES.register("fbos", config=FBOSConfig, section="fbos")
def make_fbos_schedule(cfg: Any) -> AlternatingViews:
    """``SCHEDULES["fbos"]``: :class:`AlternatingViews`."""
    return AlternatingViews(cfg)

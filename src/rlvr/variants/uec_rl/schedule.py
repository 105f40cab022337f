"""The UEC-RL schedule, ``SCHEDULES["uec_replay"]``: update accumulation plus a periodic replay stabiliser.

Both buffers are the generic :class:`~rlvr.schedules.buffer.TrajectoryBuffer` (a FIFO of rollout rows with an
admission predicate, reusable by any schedule). :class:`UECReplaySchedule` wraps :class:`~rlvr.schedules.base.OnPolicySchedule`:

1. **accumulation** (``uec.accumulate = pending``): retained rows go into a FIFO ``pending`` buffer
   (capacity ``uec.pending_capacity``, default 4·N_upd); an update runs only when it holds at least
   ``N_upd = uec.update_size`` (default ``generation_batch_size`` = B·G) rows, and then takes the
   oldest ``⌊|pending|/N_upd⌋·N_upd`` rows. Leftovers carry over to the next step; a step without
   enough rows makes no update. ``accumulate = none`` trains on each retained batch as it comes.
2. **replay admission**: of the rows actually trained, those with ``Â > A_0`` (``uec.replay_admission``,
   ``uec.replay_adv_threshold``) enter a FIFO replay buffer of capacity ``s′`` (``uec.replay_capacity``
   or ``uec.replay_capacity_factor``·N_upd; the newest are kept), with their advantages, ``ref_logp``
   and the ``old_logp`` of the policy that is about to train on them (computed at admission when the
   run does not store behaviour log-probs, i.e. μ = 1).
3. **replay**: at generation round ``t`` with ``t mod uec.replay_every == 0`` and at least
   ``uec.replay_min_size`` rows stored, extra optimizer steps (``phase = "replay"``, metrics
   logged as ``replay/...``) replay the whole buffer when full, else a random subset of
   ``⌊|replay|/N_upd⌋·N_upd`` rows (all rows when ``uec.replay_min_size < N_upd`` makes that 0); the stored ``old_logp`` and ``Â`` are reused unchanged, so the PPO
   clip acts as a "stop consolidating" brake. Replayed rows stay in the buffer unless
   ``uec.replay_remove_after_use``.

Source: docs/uec_rl.md §2.4, §2.5, §2.7 [code-precedent: ICR/EFRame ``buffer.py``, ``ray_trainer.py``].
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rlvr.core.uec import low_prob_positive_fraction, replay_admission_mask, tempered_is_weights
from rlvr.schedules.base import SCHEDULES, OnPolicySchedule, OptimizerStep, PlanContext, split_groups
from rlvr.schedules.buffer import TrajectoryBuffer
from rlvr.types import KIND_EXPLORE, KIND_REGULAR, RolloutBatch
from rlvr.variants.uec_rl.config import UECConfig

def mean_token_entropy(ctx: PlanContext, batch: RolloutBatch) -> float:
    """Mean full-distribution entropy (nats, a float) over ``batch``'s completion tokens under the
    current policy (``ctx.logprobs``).

    Source: docs/uec_rl.md §4 (``uec/entropy_before_replay`` / ``after``; the probe entropy of the
    comparison script).
    """
    _, ent = ctx.logprobs(batch, with_entropy=True)
    assert ent is not None
    m = batch.completion_mask
    return float((ent * m).sum() / m.sum().clamp(min=1))


def _is_explore(batch: RolloutBatch) -> torch.Tensor:
    if batch.context_kind is None:
        return torch.zeros(len(batch), dtype=torch.bool)
    return torch.tensor([k == KIND_EXPLORE for k in batch.context_kind], dtype=torch.bool)


class UECReplaySchedule:
    """On-policy updates on accumulated retained rows, plus a periodic replay update (UEC-RL).

    Args:
        cfg: the run config (reads ``steps_per_generation``, ``num_iterations``, ``seed``,
            ``generation_batch_size`` and ``uec.*``).

    Attributes:
        pending: the accumulation buffer (``None`` when ``uec.accumulate = none``).
        replay: the replay buffer.
        n_upd: N_upd, rows per (non-replay) update round.
        log: one dict of ``uec/*`` schedule metrics per :meth:`plan` call (for analysis scripts).

    The first optimizer step it returns carries the round's metrics (logged with that update): ``uec/pending_size``, ``uec/update_skipped``, ``uec/replay_size``, ``uec/replay_admitted``,
    ``uec/replay_fired``, ``uec/entropy_before_replay`` / ``uec/entropy_after_replay`` (mean token entropy
    of a fixed probe of ``uec.probe_rows`` replayed rows, measured when the replay is planned — before
    that step's updates — and at the next step, after them), ``uec/low_prob_positive_frac/replay``; with
    ``uec.token_diagnostics`` also ``uec/low_prob_positive_frac/{regular,explore}``,
    ``uec/nll_entropy_proxy/{regular,explore}`` and ``uec/token_entropy/{regular,explore}`` of the trained rows.

    Source: docs/uec_rl.md §2.4, §2.5, §2.7, §4.
    """

    def __init__(self, cfg: Any) -> None:
        u = cfg.uec
        self.cfg = cfg
        self.inner = OnPolicySchedule.from_config(cfg)
        self.n_upd = int(u.update_size or cfg.generation_batch_size)
        self.pad_token_id = 0  # set from the plan context on first use
        pending_cap = int(u.pending_capacity or 4 * self.n_upd)
        self.pending = TrajectoryBuffer(pending_cap, 0) if u.accumulate == "pending" else None
        replay_cap = int(u.replay_capacity or max(1, math.floor(u.replay_capacity_factor * self.n_upd)))
        self.replay = TrajectoryBuffer(
            replay_cap, 0, admit=lambda b: replay_admission_mask(b.advantages, u.replay_admission, u.replay_adv_threshold)
        )
        self.replay_min = int(u.replay_min_size or self.n_upd)
        self._probe: RolloutBatch | None = None
        self.log: list[dict[str, float]] = []

    @property
    def needs_old_logp(self) -> bool:
        """As the inner on-policy schedule (μ > 1); replayed rows carry the ``old_logp`` stored at admission."""
        return self.inner.needs_old_logp

    # ------------------------------------------------------------------------------ helpers
    def _apply_is_correction(self, ctx: PlanContext, batch: RolloutBatch) -> None:
        """``uec.explore_is_correction = tempered_is``: token weights π/q_t′ on exploration rows, 1 elsewhere."""
        exp = _is_explore(batch)
        w = batch.completion_mask.clone() if batch.token_weights is None else batch.token_weights.clone()
        if bool(exp.any()) and batch.sampler_logp is not None:
            rows = exp.nonzero(as_tuple=True)[0]
            sub = batch.select(rows)
            logp, _ = ctx.logprobs(sub)
            wt = tempered_is_weights(logp, sub.sampler_logp, sub.completion_mask, self.cfg.uec.explore_is_max_weight)
            w[rows] = 0.0
            w[rows, : wt.shape[1]] = wt
        batch.token_weights = w

    def _token_diagnostics(self, ctx: PlanContext, trained: RolloutBatch) -> dict[str, float]:
        """``uec.token_diagnostics``: one no-grad forward over the rows about to be trained giving, per kind
        (regular / explore), the share of positive-advantage tokens with ``π(a) < exp(−H)`` and the NLL
        entropy proxy ``−mean log π(sampled token)`` (spec §4)."""
        logp, ent = ctx.logprobs(trained, with_entropy=True)
        assert ent is not None
        exp = _is_explore(trained)
        out: dict[str, float] = {}
        for kind, rows in ((KIND_REGULAR, ~exp), (KIND_EXPLORE, exp)):
            if not bool(rows.any()):
                continue
            idx = rows.nonzero(as_tuple=True)[0]
            mask = trained.completion_mask[idx]
            out[f"uec/low_prob_positive_frac/{kind}"] = low_prob_positive_fraction(
                logp[idx], ent[idx], trained.advantages[idx], mask)
            out[f"uec/nll_entropy_proxy/{kind}"] = float(-(logp[idx] * mask).sum() / mask.sum().clamp(min=1))
            out[f"uec/token_entropy/{kind}"] = float((ent[idx] * mask).sum() / mask.sum().clamp(min=1))
        return out

    def _admit(self, ctx: PlanContext, trained: RolloutBatch) -> int:
        u = self.cfg.uec
        mask = replay_admission_mask(trained.advantages, u.replay_admission, u.replay_adv_threshold)
        if not bool(mask.any()):
            return 0
        sub = trained.select(mask.nonzero(as_tuple=True)[0])
        if sub.old_logp is None:  # μ = 1: store the log-probs of the policy about to train on them
            sub.old_logp, _ = ctx.logprobs(sub)
        return self.replay.push(sub, torch.ones(len(sub), dtype=torch.bool))

    # ------------------------------------------------------------------------------ plan
    def plan(self, batch: RolloutBatch, ctx: PlanContext) -> list[OptimizerStep]:
        """Optimizer steps for this generation round: accumulated regular updates, then replay.

        ``t = ctx.generation_round`` (1-based, counted by the trainer) drives the replay cadence.
        Returns ``[]`` when the pending buffer holds fewer than N_upd rows and no replay is due.

        Raises:
            ValueError: the batch's rows do not match the buffered ones (a field set on some rows only).

        Source: docs/uec_rl.md §2.7 (per-step procedure).
        """
        u = self.cfg.uec
        self.pad_token_id = ctx.pad_token_id
        for b in (self.pending, self.replay):
            if b is not None:
                b.pad_token_id = ctx.pad_token_id
        t = int(ctx.generation_round)
        m: dict[str, float] = {}
        if self._probe is not None:  # entropy on the last replay probe, after that replay update
            m["uec/entropy_after_replay"] = mean_token_entropy(ctx, self._probe)
            self._probe = None
        if u.explore_is_correction == "tempered_is":
            self._apply_is_correction(ctx, batch)
        if self.pending is not None:
            self.pending.push(batch)
            k = (len(self.pending) // self.n_upd) * self.n_upd
            trained = self.pending.pop_oldest(k) if k > 0 else None
            m["uec/pending_size"] = float(len(self.pending))
        else:
            trained = batch
        m["uec/update_skipped"] = 0.0 if trained is not None else 1.0
        out: list[OptimizerStep] = []
        admitted = 0
        if trained is not None and len(trained):
            if u.token_diagnostics:
                m.update(self._token_diagnostics(ctx, trained))
            admitted = self._admit(ctx, trained)
            n_batches = self.inner.steps_per_generation * max(1, len(trained) // self.n_upd)
            out = [OptimizerStep(b) for b in split_groups(
                trained, n_batches, seed=self.cfg.seed * 31 + t, passes=self.inner.num_iterations)]
        m["uec/replay_admitted"] = float(admitted)
        fire = u.replay_every > 0 and t % u.replay_every == 0 and len(self.replay) >= self.replay_min
        m["uec/replay_fired"] = float(fire)
        if fire:
            out += self._replay_steps(ctx, t, m)
        m["uec/replay_size"] = float(len(self.replay))
        self.log.append({"generation_round": float(t), **m})
        if out:
            out[0] = OptimizerStep(out[0].batch, phase=out[0].phase, metrics={**out[0].metrics, **m})
        return out

    def _replay_steps(self, ctx: PlanContext, t: int, m: dict[str, float]) -> list[OptimizerStep]:
        u = self.cfg.uec
        if self.replay.full:
            rb, pos = self.replay.all(), list(range(len(self.replay)))
        else:
            k = (len(self.replay) // self.n_upd) * self.n_upd or len(self.replay)  # min size < N_upd: all rows
            gen = torch.Generator().manual_seed(self.cfg.seed * 7919 + t)
            rb, pos = self.replay.sample(k, gen)
        if u.replay_recompute_old_logprob:
            rb.old_logp, _ = ctx.logprobs(rb)
        if u.replay_remove_after_use:
            self.replay.remove(pos)
        n_probe = min(u.probe_rows, len(rb))
        if n_probe:
            probe = rb.select(list(range(n_probe)))
            logp, ent = ctx.logprobs(probe, with_entropy=True)
            mask = probe.completion_mask
            m["uec/entropy_before_replay"] = float((ent * mask).sum() / mask.sum().clamp(min=1))
            m["uec/low_prob_positive_frac/replay"] = low_prob_positive_fraction(logp, ent, probe.advantages, mask)
            self._probe = probe
        n_batches = self.inner.steps_per_generation * max(1, len(rb) // self.n_upd)
        rb.metrics = {}
        return [OptimizerStep(b, phase="replay") for b in split_groups(rb, n_batches, seed=self.cfg.seed * 131 + t, passes=1)]

    # ------------------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """Both buffers: tensors under ``"tensors"`` (``pending/<field>``, ``replay/<field>``), the rest JSON."""
        out: dict[str, Any] = {"tensors": {}}
        for name, buf in (("pending", self.pending), ("replay", self.replay)):
            if buf is None:
                continue
            st = buf.state_dict()
            for k, v in st.pop("tensors").items():
                out["tensors"][f"{name}/{k}"] = v
            out[name] = st
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        tensors = state.get("tensors", {})
        for name, buf in (("pending", self.pending), ("replay", self.replay)):
            if buf is None or name not in state:
                continue
            st = dict(state[name])
            st["tensors"] = {k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith(name + "/")}
            buf.load_state_dict(st)


SCHEDULES.register("uec_replay", config=UECConfig, section="uec")(UECReplaySchedule)

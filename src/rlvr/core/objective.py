"""The GRPO objective of one micro-batch, and its metrics (``docs/grpo.md`` §10, §11).

::

    L = agg(L_pg, W) + beta · agg(KL, W) − entropy_coef · agg(H, W)      # one loss_agg_mode for all terms

**A policy loss near 0 is expected.** With ``ρ ≈ 1`` and group-centred advantages the surrogate's
*value* is about ``−mean(A) ≈ 0`` even while its *gradient* ``−agg(A·∇logp)`` is not; judge learning by
rewards, KL, clip fractions and the gradient norm, not by ``loss/policy`` (grpo_core.md §11,
complaint 3).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from rlvr.core.aggregation import (
    LOSS_AGG_MODES,
    SEQ_DENOMINATORS,
    AggDenominators,
    aggregate,
    compute_denominators,
)
from rlvr.core.kl import canonical_kl_estimator, check_kl_is_correction, kl_is_corrected, kl_penalty
from rlvr.core.masks import combine_masks
from rlvr.core.policy_loss import IMPORTANCE_SAMPLING_LEVELS, get_policy_loss
from rlvr.core.rollout_is import ROLLOUT_IS_MODES, rollout_is_weights

__all__ = ["SUM_METRICS", "LossMetricAccumulator", "LossSettings", "policy_objective", "reduce_objective_metrics"]

SUM_METRICS: tuple[str, ...] = (
    "ratio",
    "clip_ratio/low",
    "clip_ratio/high",
    "clip_ratio/region",
    "clip_ratio/dual",
    "kl",
    "entropy",
    "approx_kl_old",
    "rollout_logp_diff",
    "rollout_is_ratio",
    "rollout_is_changed",
)
"""Metrics returned by :func:`policy_objective` as sums over loss tokens (divide by ``_tokens``)."""



@dataclass(frozen=True)
class LossSettings:
    """The loss knobs of grpo_core.md §5–§8 and §10, validated (names as in §12).

    Attributes:
        epsilon: lower clip, ``0 < epsilon <= 1``. epsilon_high: upper clip ``>= 0`` or ``None``
            (= ``epsilon``). clip_ratio_c: dual clip ``> 1`` or ``None``.
        importance_sampling_level: ``"token"``, ``"sequence"`` (GSPO) or ``"sequence_token"``.
        loss_agg_mode: one of :data:`rlvr.core.aggregation.LOSS_AGG_MODES`.
        seq_denominator: ``"nonempty"`` or ``"all"`` (§6).
        loss_scale_factor: ``C`` for ``seq-mean-token-sum-norm`` (required for that mode), ``> 0``.
        beta: KL coefficient ``>= 0``. kl_estimator: any name accepted by
            :func:`rlvr.core.kl.canonical_kl_estimator`; stored in canonical form (``"low_var_kl"`` →
            ``"k3"``). kl_is_correction: correct the per-token KL for sampling from ``π_old`` so that
            its expected gradient is the reverse-KL gradient exactly (:func:`rlvr.core.kl.kl_is_corrected`:
            ``ρ·k`` with the gradient through ``ρ`` for ``k1``/``k3``, as DeepSeek-V3.2 §3.1 and TRL
            ``use_bias_correction_kl``; ``sg(ρ)·k`` for ``k2`` and ``+``); refused for ``abs``.
        entropy_coef: entropy bonus coefficient (the loss subtracts ``entropy_coef · agg(H)``).
        policy_loss: key of :data:`rlvr.core.policy_loss.POLICY_LOSSES` (checked when used, so variants
            may register theirs later).
        rollout_is_mode: rollout/training mismatch correction (:mod:`rlvr.core.rollout_is`): ``None``
            (off) or one of :data:`rlvr.core.rollout_is.ROLLOUT_IS_MODES`; rollout_is_clip_max /
            rollout_is_clip_min: its bounds (TRL ``vllm_importance_sampling_clip_max`` / ``_min``).

    Raises:
        ValueError: on construction, for any value outside the ranges above, or ``kl_is_correction``
            with ``kl_estimator=abs`` (no unbiased correction exists).

    Source: grpo_core.md §5–§8, §12, §13 (validation rules).
    """

    epsilon: float = 0.2
    epsilon_high: float | None = None
    clip_ratio_c: float | None = None
    importance_sampling_level: str = "token"
    loss_agg_mode: str = "token-mean"
    seq_denominator: str = "nonempty"
    loss_scale_factor: float | None = None
    beta: float = 0.0
    kl_estimator: str = "k3"
    kl_is_correction: bool = False
    entropy_coef: float = 0.0
    policy_loss: str = "clipped"
    rollout_is_mode: str | None = None
    rollout_is_clip_max: float | None = 3.0
    rollout_is_clip_min: float | None = None

    def __post_init__(self) -> None:
        errs = []
        if not 0 < self.epsilon <= 1:
            errs.append(f"epsilon must be in (0, 1], got {self.epsilon}")
        if self.epsilon_high is not None and not self.epsilon_high >= 0:
            errs.append(f"epsilon_high must be >= 0 or None, got {self.epsilon_high}")
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1:
            errs.append(f"clip_ratio_c must be > 1 or None, got {self.clip_ratio_c}")
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            errs.append(
                f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, "
                f"got {self.importance_sampling_level!r}"
            )
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            errs.append(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {self.loss_agg_mode!r}")
        if self.seq_denominator not in SEQ_DENOMINATORS:
            errs.append(f"seq_denominator must be one of {SEQ_DENOMINATORS}, got {self.seq_denominator!r}")
        if self.loss_scale_factor is not None and not self.loss_scale_factor > 0:
            errs.append(f"loss_scale_factor must be > 0, got {self.loss_scale_factor}")
        if self.loss_agg_mode == "seq-mean-token-sum-norm" and self.loss_scale_factor is None:
            errs.append(
                "loss_agg_mode=seq-mean-token-sum-norm needs loss_scale_factor (e.g. max_completion_length)"
            )
        if not self.beta >= 0:
            errs.append(f"beta must be >= 0, got {self.beta}")
        if self.rollout_is_mode is not None and self.rollout_is_mode not in ROLLOUT_IS_MODES:
            errs.append(f"rollout_is_mode must be None or one of {ROLLOUT_IS_MODES}, got {self.rollout_is_mode!r}")
        if not math.isfinite(self.entropy_coef):
            errs.append(f"entropy_coef must be finite, got {self.entropy_coef}")
        try:
            object.__setattr__(self, "kl_estimator", canonical_kl_estimator(self.kl_estimator))
        except ValueError as e:
            errs.append(str(e))
        else:
            if self.kl_is_correction:
                try:
                    check_kl_is_correction(self.kl_estimator)
                except ValueError as e:
                    errs.append(str(e))
        if errs:
            raise ValueError("LossSettings: " + "; ".join(errs))

    def denominators(self, W: torch.Tensor | Sequence[torch.Tensor]) -> AggDenominators:
        """:func:`compute_denominators` of a whole optimizer batch's ``W`` with these settings."""
        return compute_denominators(
            W,
            self.loss_agg_mode,
            seq_denominator=self.seq_denominator,
            loss_scale_factor=self.loss_scale_factor,
        )


def _masked_sum(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    x = x.detach()
    return torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum()


def policy_objective(
    logp: torch.Tensor,
    old_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    weight: torch.Tensor,
    settings: LossSettings,
    denominators: AggDenominators | None,
    *,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    extra_masks: Sequence[torch.Tensor | None] = (),
    completion_mask: torch.Tensor | None = None,
    loss_kwargs: Mapping[str, Any] | None = None,
    rollout_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total loss of one (micro-)batch and its summable metrics.

    ``L = agg(L_pg, W) + beta·agg(KL, W) − entropy_coef·agg(H, W)`` with ``W = weight ⊙ Π extra_masks``
    and ``agg`` the :func:`rlvr.core.aggregation.aggregate` of ``settings.loss_agg_mode``. A near-zero
    ``loss/policy`` is expected (see the module docstring).

    Args:
        logp: ``[n, T]`` current log-probs of the sampled tokens (requires grad).
        old_logp: ``[n, T]`` stored behaviour log-probs, or ``None`` for ``μ = 1``: then ``sg(logp)`` is
            used and ``ρ ≡ 1`` (no extra forward pass, grpo_core.md §4).
        advantages: ``[n]`` or ``[n, T]``, computed once per generation batch.
        weight: ``[n, T]`` ``M ⊙ w`` (completion mask times optional token weights).
        settings: :class:`LossSettings`.
        denominators: global normalisers of the whole optimizer batch (``settings.denominators(W_full)``,
            computed with the same extra masks), or ``None`` for micro scope.
        ref_logp: ``[n, T]`` reference log-probs; required when ``beta > 0``; when given with
            ``beta == 0`` the KL is computed for the ``kl`` metric only (no gradient).
        entropy: ``[n, T]`` per-token entropy (nats); required when ``entropy_coef != 0``; must carry
            gradient for the bonus to act (``entropy_grad=True`` in
            :func:`rlvr.core.logprobs.selective_log_softmax_and_entropy`).
        extra_masks: further ``[n, T]`` masks (truncation, variant masks); ``None`` entries are skipped.
        completion_mask: ``[n, T]`` mask ``M`` over which the sequence-level IS ratio averages; default
            ``weight != 0`` (interpretation: ``weight`` is ``M ⊙ w``, and variant masks should not
            change the sequence ratio, GSPO defines it over the whole completion).
        loss_kwargs: extra keyword arguments for the registered policy loss of this micro-batch (e.g.
            FBOS-RL's per-row ``is_offpolicy`` ``[n]`` and ``behaviour_logp`` ``[n, T]``); ``None``
            passes none (the ``clipped`` loss takes none).
        rollout_logp: ``[n, T]`` the engine's behaviour log-probs of the same tokens. When given, the
            rollout/training mismatch is measured against ``old`` (``old_logp``, or ``sg(logp)`` at
            ``μ = 1``); with ``settings.rollout_is_mode`` set, the policy-gradient term of each token is
            multiplied by :func:`rlvr.core.rollout_is.rollout_is_weights` (required then).

    Returns:
        ``(loss, metrics)``. ``loss`` is a 0-d tensor. ``metrics`` are detached 0-d tensors, designed to
        be **summed** over micro-batches (see :func:`reduce_objective_metrics`):

        * ``"_tokens"``: number of tokens with ``W > 0``;
        * sums over those tokens: ``"ratio"``, ``"clip_ratio/low"``, ``"clip_ratio/high"``,
          ``"clip_ratio/region"``, ``"clip_ratio/dual"``, ``"approx_kl_old"`` (``old_logp − logp``),
          ``"kl"`` (the estimator's value, only when ``ref_logp`` is given) and ``"entropy"`` (only when
          ``entropy`` is given);
        * with ``rollout_logp``: sums ``"rollout_logp_diff"`` (``|old − rollout_logp|``),
          ``"rollout_is_ratio"`` (the raw ``exp(old − rollout_logp)``, token level) and
          ``"rollout_is_changed"`` (tokens whose weight truncation or masking changed; 0 when off), and
          ``"rollout_logp_diff/max"``, ``"rollout_is_ratio/min"``, ``"rollout_is_ratio/max"``;
        * ``"ratio/min"``, ``"ratio/max"`` over those tokens (``+inf`` / ``−inf`` when there are none, the
          neutral elements of min / max);
        * ``"loss/policy"`` = ``agg(L_pg)``, ``"loss/kl"`` = ``beta·agg(KL)``, ``"loss/entropy"`` =
          ``−entropy_coef·agg(H)``, ``"loss/total"`` = their sum = ``loss`` (the terms as they enter
          ``L``, interpretation of §11 "aggregated terms of §10", so that they add up to the total).

    Raises:
        ValueError: shapes differ, ``beta > 0`` without ``ref_logp``, ``entropy_coef != 0`` without
            ``entropy``, or any error of the aggregation / loss functions.
        UnknownNameError: ``settings.policy_loss`` is not registered.

    Source: grpo_core.md §10 (total loss), §7 (KL placement; ``kl_is_correction`` follows issue 12 and
    DeepSeek-V3.2 §3.1 rather than §7's ``sg(ρ)``, which biases k3), §8 (entropy
    bonus), §11 (metrics), §4 (``old_logp = sg(logp)`` when ``μ = 1``).
    """
    W, M, old = _checked_inputs(logp, old_logp, weight, settings, ref_logp, entropy, extra_masks,
                                completion_mask, rollout_logp)
    pg_tok, info, is_changed = _policy_gradient_tokens(logp, old, advantages, M, settings, loss_kwargs, rollout_logp)

    def agg(x: torch.Tensor) -> torch.Tensor:
        return aggregate(
            x,
            W,
            settings.loss_agg_mode,
            denominators,
            seq_denominator=settings.seq_denominator,
            loss_scale_factor=settings.loss_scale_factor,
        )

    zero = logp.new_zeros(())
    loss_pg = agg(pg_tok)
    kl_tok, loss_kl, loss_ent = _regularisers(logp, old, ref_logp, entropy, settings, agg, zero)
    total = loss_pg + loss_kl + loss_ent
    metrics = _objective_metrics(W > 0, info, logp, old, kl_tok, entropy, rollout_logp, is_changed, zero)
    metrics["loss/policy"] = loss_pg.detach()
    metrics["loss/kl"] = loss_kl.detach()
    metrics["loss/entropy"] = loss_ent.detach()
    metrics["loss/total"] = total.detach()
    return total, metrics


def _checked_inputs(
    logp: torch.Tensor, old_logp: torch.Tensor | None, weight: torch.Tensor, settings: LossSettings,
    ref_logp: torch.Tensor | None, entropy: torch.Tensor | None, extra_masks: Sequence[torch.Tensor | None],
    completion_mask: torch.Tensor | None, rollout_logp: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`policy_objective`'s argument checks, then ``(W, M, old)``: the loss weight ``[n, T]``
    (``weight ⊙ Π extra_masks`` in ``logp``'s dtype), the mask ``[n, T]`` the sequence IS ratio averages
    over, and the detached behaviour log-probs ``[n, T]`` (``sg(logp)`` when ``old_logp`` is None).

    Raises:
        ValueError: see :func:`policy_objective`.
    """
    fn = "policy_objective"
    if logp.dim() != 2:
        raise ValueError(f"{fn}: logp must be [n, T], got shape {tuple(logp.shape)}")
    shape = tuple(logp.shape)
    for name, t in (("old_logp", old_logp), ("weight", weight), ("ref_logp", ref_logp), ("entropy", entropy),
                    ("completion_mask", completion_mask), ("rollout_logp", rollout_logp)):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{fn}: {name} must have the shape of logp {shape}, got {tuple(t.shape)}")
    W = combine_masks(weight, *extra_masks).to(logp.dtype)
    if tuple(W.shape) != shape:
        raise ValueError(f"{fn}: weight ⊙ extra_masks has shape {tuple(W.shape)}, expected {shape}")
    if settings.beta > 0 and ref_logp is None:
        raise ValueError(f"{fn}: beta={settings.beta} > 0 needs ref_logp (the reference model's log-probs)")
    if settings.entropy_coef != 0 and entropy is None:
        raise ValueError(f"{fn}: entropy_coef={settings.entropy_coef} != 0 needs the per-token entropy")
    if settings.rollout_is_mode is not None and rollout_logp is None:
        raise ValueError(f"{fn}: rollout_is_mode={settings.rollout_is_mode!r} needs rollout_logp (the engine's log-probs)")
    M = (weight != 0) if completion_mask is None else completion_mask
    old = logp.detach() if old_logp is None else old_logp.detach()
    return W, M, old


def _policy_gradient_tokens(
    logp: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, M: torch.Tensor, settings: LossSettings,
    loss_kwargs: Mapping[str, Any] | None, rollout_logp: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None]:
    """``(pg_tok, info, is_changed)``: the registered policy loss ``[n, T]`` of ``settings.policy_loss``
    and its ``info``, each token's term multiplied by the rollout IS weight when ``settings.rollout_is_mode``
    is set (``is_changed`` ``[n, T]``: the tokens that weight truncated or masked; None when off).

    Raises:
        UnknownNameError: ``settings.policy_loss`` is not registered.
    """
    loss_fn = get_policy_loss(settings.policy_loss)
    pg_tok, info = loss_fn(
        logp,
        old,
        advantages,
        M,
        epsilon=settings.epsilon,
        epsilon_high=settings.epsilon_high,
        clip_ratio_c=settings.clip_ratio_c,
        importance_sampling_level=settings.importance_sampling_level,
        **dict(loss_kwargs or {}),
    )
    is_changed = None
    if rollout_logp is not None and settings.rollout_is_mode is not None:
        is_w, is_changed = rollout_is_weights(
            old, rollout_logp, M.to(logp.dtype), mode=settings.rollout_is_mode,
            clip_max=settings.rollout_is_clip_max, clip_min=settings.rollout_is_clip_min,
        )
        pg_tok = pg_tok * is_w.to(pg_tok.dtype)
    return pg_tok, info, is_changed


def _regularisers(
    logp: torch.Tensor, old: torch.Tensor, ref_logp: torch.Tensor | None, entropy: torch.Tensor | None,
    settings: LossSettings, agg: Any, zero: torch.Tensor,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """``(kl_tok, loss_kl, loss_ent)``: the per-token KL estimate ``[n, T]`` to the reference (None without
    ``ref_logp``; without gradient when ``beta == 0``, for the metric only), ``beta·agg(KL)`` (the
    IS-corrected KL under ``kl_is_correction``) and ``−entropy_coef·agg(H)``, both 0-d (``zero`` when off).
    """
    kl_tok = None
    loss_kl = zero
    if ref_logp is not None:
        if settings.beta > 0:
            kl_tok = kl_penalty(logp, ref_logp.detach(), settings.kl_estimator)
            kl_term = (kl_is_corrected(logp, old, ref_logp, settings.kl_estimator) if settings.kl_is_correction
                       else kl_tok)
            loss_kl = settings.beta * agg(kl_term)
        else:
            with torch.no_grad():
                kl_tok = kl_penalty(logp, ref_logp, settings.kl_estimator)
    loss_ent = zero
    if entropy is not None and settings.entropy_coef != 0:
        loss_ent = -settings.entropy_coef * agg(entropy)
    return kl_tok, loss_kl, loss_ent


def _objective_metrics(
    keep: torch.Tensor, info: Mapping[str, torch.Tensor], logp: torch.Tensor, old: torch.Tensor,
    kl_tok: torch.Tensor | None, entropy: torch.Tensor | None, rollout_logp: torch.Tensor | None,
    is_changed: torch.Tensor | None, zero: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """:func:`policy_objective`'s metrics before the ``loss/*`` terms: the token count, sums and extrema
    over the loss tokens ``keep`` (``W > 0``, ``[n, T]``) of the ratio, the clip indicators, the KLs, the
    entropy and (with ``rollout_logp``) the rollout/training mismatch, in the order they are logged."""
    ratio = info["ratio"].detach()
    metrics: dict[str, torch.Tensor] = {"_tokens": keep.sum().to(logp.dtype)}
    metrics["ratio"] = _masked_sum(ratio, keep)
    for key, name in (("clip_low", "clip_ratio/low"), ("clip_high", "clip_ratio/high"),
                      ("clip_region", "clip_ratio/region"), ("clip_dual", "clip_ratio/dual")):
        ind = info.get(key)
        metrics[name] = _masked_sum(ind, keep) if ind is not None else zero.detach().clone()
    metrics["approx_kl_old"] = _masked_sum(old - logp.detach(), keep)
    if kl_tok is not None:
        metrics["kl"] = _masked_sum(kl_tok, keep)
    if entropy is not None:
        metrics["entropy"] = _masked_sum(entropy, keep)
    inf = torch.tensor(math.inf, dtype=ratio.dtype, device=ratio.device)
    if rollout_logp is not None:
        d = (old - rollout_logp.detach().to(old.dtype)).nan_to_num(0.0)
        raw = d.clamp(max=80.0).exp()
        metrics["rollout_logp_diff"] = _masked_sum(d.abs(), keep)
        metrics["rollout_is_ratio"] = _masked_sum(raw, keep)
        metrics["rollout_is_changed"] = (
            _masked_sum(is_changed.to(logp.dtype), keep) if is_changed is not None else zero.detach().clone()
        )
        metrics["rollout_logp_diff/max"] = torch.where(keep, d.abs(), -inf).max() if d.numel() else -inf
        metrics["rollout_is_ratio/min"] = torch.where(keep, raw, inf).min() if raw.numel() else inf
        metrics["rollout_is_ratio/max"] = torch.where(keep, raw, -inf).max() if raw.numel() else -inf
    metrics["ratio/min"] = torch.where(keep, ratio, inf).min() if ratio.numel() else inf
    metrics["ratio/max"] = torch.where(keep, ratio, -inf).max() if ratio.numel() else -inf
    return metrics


class LossMetricAccumulator:
    """The one reducer of :func:`policy_objective`'s metrics over the micro-batches of an optimizer step.

    Sums the token-weighted sums and turns them into means over the step's masked tokens: keys ending
    in ``/min`` or ``/max`` are reduced by min/max; ``loss/*`` values are summed (each micro-batch
    contributes its share of a globally normalised loss; with ``loss_norm_scope=micro`` the caller
    divides each micro-batch's loss by their number first); every other key is divided by the total
    token count ``_tokens`` (``0`` tokens: divided by 1). ``_tokens`` is reported as
    ``actor/num_loss_tokens``.

    Source: grpo_core.md §11 (metric names), §6 (normalisation scope).
    """

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.mins: dict[str, float] = {}
        self.maxs: dict[str, float] = {}

    def add(self, metrics: Mapping[str, Any]) -> None:
        """Add one micro-batch's metrics (scalars or 0-d tensors)."""
        for k, v in metrics.items():
            x = float(v.detach()) if torch.is_tensor(v) else float(v)
            if k.endswith("/min"):
                self.mins[k] = min(self.mins.get(k, math.inf), x)
            elif k.endswith("/max"):
                self.maxs[k] = max(self.maxs.get(k, -math.inf), x)
            else:
                self.sums[k] += x

    def result(self, prefix: str = "actor/") -> dict[str, float]:
        """Means per masked token under ``prefix``; ``loss/*`` as summed; min/max as reduced."""
        tokens = max(self.sums.get("_tokens", 0.0), 1.0)
        out: dict[str, float] = {}
        for k, v in self.sums.items():
            if k == "_tokens":
                out["actor/num_loss_tokens"] = v
            elif k.startswith("loss/"):
                out[k] = v
            else:
                out[prefix + k] = v / tokens
        out.update({prefix + k: v for k, v in self.mins.items()})
        out.update({prefix + k: v for k, v in self.maxs.items()})
        return out


def reduce_objective_metrics(per_micro: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """:class:`LossMetricAccumulator` over ``per_micro`` (the logged ``actor/*`` and ``loss/*`` names).

    Raises:
        ValueError: empty input.
    """
    if not per_micro:
        raise ValueError("reduce_objective_metrics: no micro-batch metrics given")
    acc = LossMetricAccumulator()
    for m in per_micro:
        acc.add(m)
    return acc.result()

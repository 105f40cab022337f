"""Loss aggregation ``agg(X, W, mode) → scalar`` (``docs/grpo.md`` §6).

Notation: ``X[i,t]`` any per-token term (policy loss, KL, entropy), ``W[i,t]`` the effective loss
weight, ``n_i = Σ_t W[i,t]``, ``S`` the sequences counted in sequence means (``seq_denominator``:
``nonempty`` = rows with ``n_i > 0``, ``all`` = every row), ``B_eff = |S|``.

========================== ================================================= =========================
mode                       value                                             source
========================== ================================================= =========================
``token-mean``             ``Σ_{i,t} W·X / Σ_{i,t} W``                         DAPO §3.3; TRL ``dapo``
``token-sum``              ``Σ_{i,t} W·X``                                     custom normalisers
``seq-mean-token-sum``     ``(1/B_eff) Σ_{i∈S} Σ_t W·X``                       verl
``seq-mean-token-mean``    ``(1/B_eff) Σ_{i∈S} (Σ_t W·X) / n_i``               GRPO (Shao et al. Eq. 3)
``seq-mean-token-sum-norm`` ``(1/B_eff) Σ_{i∈S} (Σ_t W·X) / C``                Dr.GRPO (Liu et al. §3.1)
========================== ================================================= =========================

**Normalisation scope.** :func:`compute_denominators` reduces ``Σ W`` and ``B_eff`` over a whole
optimizer batch (all micro-batches, and — after :func:`merge_denominators` — all ranks). Passing the
result to :func:`aggregate` on each micro-batch makes every micro-batch contribute its partial
numerator over the global denominator, so the micro-batch losses (and gradients) add up to the
full-batch value ("global" scope, verl's DP-invariant ``agg_loss``). ``denominators=None`` normalises
each call locally ("micro" scope; TRL ``bnpo`` when averaged over micro-batches).

Masked tokens (``W == 0``) are dropped from numerators with ``torch.where``, so ``inf``/``NaN`` values
of ``X`` on padding never leak into the loss or its gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = [
    "LOSS_AGG_MODES",
    "SEQ_DENOMINATORS",
    "AggDenominators",
    "aggregate",
    "compute_denominators",
    "merge_denominators",
]

LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
"""The five ``loss_agg_mode`` names (verl vocabulary), default first. Source: grpo_core.md §6."""

SEQ_DENOMINATORS: tuple[str, ...] = ("nonempty", "all")

_SUM_NORM = "seq-mean-token-sum-norm"


@dataclass(frozen=True)
class AggDenominators:
    """Normalisers of one optimizer batch, shared by all of its micro-batches.

    Attributes:
        token_weight: ``Σ_{i,t} W[i,t]`` over the whole batch (tokens, weighted). Divides ``token-mean``.
        num_seqs: ``B_eff``, the number of sequences in ``S`` (see ``seq_denominator``). Divides the
            three ``seq-mean-*`` modes.
        scale: the constant ``C`` (``loss_scale_factor``) for ``seq-mean-token-sum-norm``; ``1.0`` for
            the other modes.
        mode: the ``loss_agg_mode`` they were computed for (``None``: unchecked). :func:`aggregate`
            refuses denominators computed for another mode.

    Source: grpo_core.md §6 "Normalisation scope" (global).
    """

    token_weight: float
    num_seqs: float
    scale: float
    mode: str | None = None


def _check_mode(mode: str, fn: str) -> None:
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"{fn}: unknown loss_agg_mode {mode!r}; expected one of {LOSS_AGG_MODES}")


def _scale_for(mode: str, loss_scale_factor: float | None, fn: str) -> float:
    if mode != _SUM_NORM:
        return 1.0
    if loss_scale_factor is None:
        raise ValueError(
            f"{fn}: loss_agg_mode={_SUM_NORM} needs loss_scale_factor (a constant such as "
            "max_completion_length; it must not depend on the batch)"
        )
    if not loss_scale_factor > 0:
        raise ValueError(f"{fn}: loss_scale_factor must be > 0, got {loss_scale_factor}")
    return float(loss_scale_factor)


def compute_denominators(
    W: torch.Tensor | Sequence[torch.Tensor],
    mode: str,
    *,
    seq_denominator: str = "nonempty",
    loss_scale_factor: float | None = None,
) -> AggDenominators:
    """Global normalisers of an optimizer batch.

    Args:
        W: ``[N, T]`` effective loss weights of the **whole** optimizer batch, or a sequence of
            ``[n_k, T_k]`` tensors (its micro-batches, widths may differ).
        mode: one of :data:`LOSS_AGG_MODES`.
        seq_denominator: ``"nonempty"`` (default, interpretation: a fully masked sequence carries no
            signal and should not dilute the mean) counts rows with ``n_i > 0``; ``"all"`` counts every
            row (TRL's behaviour).
        loss_scale_factor: ``C`` for ``seq-mean-token-sum-norm`` (e.g. ``max_completion_length``).

    Returns:
        :class:`AggDenominators` (python floats; no gradient flows through denominators).

    Raises:
        ValueError: unknown ``mode`` / ``seq_denominator``, ``W`` not 2-D, or ``mode`` is
            ``seq-mean-token-sum-norm`` and ``loss_scale_factor`` is ``None`` (or ``<= 0``).

    Source: grpo_core.md §6; verl ``agg_loss`` with global token / sequence counts (code-precedent).
    """
    _check_mode(mode, "compute_denominators")
    if seq_denominator not in SEQ_DENOMINATORS:
        raise ValueError(
            f"compute_denominators: seq_denominator must be one of {SEQ_DENOMINATORS}, "
            f"got {seq_denominator!r}"
        )
    scale = _scale_for(mode, loss_scale_factor, "compute_denominators")
    parts = [W] if torch.is_tensor(W) else list(W)
    token_weight, num_seqs = 0.0, 0.0
    for w in parts:
        w = torch.as_tensor(w)
        if w.dim() != 2:
            raise ValueError(f"compute_denominators: W must be 2-D [N, T], got shape {tuple(w.shape)}")
        w = w.detach().to(torch.float64)
        n_i = w.sum(dim=1)
        token_weight += float(n_i.sum())
        num_seqs += float((n_i > 0).sum()) if seq_denominator == "nonempty" else float(w.shape[0])
    return AggDenominators(token_weight=token_weight, num_seqs=num_seqs, scale=scale, mode=mode)


def merge_denominators(*denominators: AggDenominators) -> AggDenominators:
    """Combine the denominators of disjoint parts of one optimizer batch (e.g. data-parallel ranks).

    ``token_weight`` and ``num_seqs`` add up; ``scale`` and ``mode`` must agree. This is what an
    all-reduce (sum) of the per-rank values computes. Note for DDP: DDP *averages* gradients over
    ``world_size`` ranks, so each rank's loss must then be multiplied by ``world_size`` to obtain the
    gradient of the global objective.

    Raises:
        ValueError: nothing given, or the parts disagree on ``scale`` or ``mode``.

    Source: grpo_core.md §6 (global scope across data-parallel ranks); derived.
    """
    if not denominators:
        raise ValueError("merge_denominators: at least one AggDenominators is required")
    scales = {d.scale for d in denominators}
    modes = {d.mode for d in denominators}
    if len(scales) > 1 or len(modes) > 1:
        raise ValueError(f"merge_denominators: parts disagree (scales {scales}, modes {modes})")
    return AggDenominators(
        token_weight=sum(d.token_weight for d in denominators),
        num_seqs=sum(d.num_seqs for d in denominators),
        scale=denominators[0].scale,
        mode=denominators[0].mode,
    )


def aggregate(
    X: torch.Tensor,
    W: torch.Tensor,
    mode: str,
    denominators: AggDenominators | None = None,
    *,
    seq_denominator: str = "nonempty",
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate a per-token term to a scalar, ``agg(X, W, mode)``.

    Args:
        X: ``[n, T]`` per-token values (any unit; the result has the same unit, or unit×tokens for the
            sum modes).
        W: ``[n, T]`` effective loss weights (``W = M ⊙ w ⊙ masks``), non-negative.
        mode: one of :data:`LOSS_AGG_MODES` (formulas in the module docstring).
        denominators: global normalisers from :func:`compute_denominators` on the whole optimizer
            batch; the micro-batch values then sum to the full-batch value. ``None`` normalises over
            this ``X`` alone (micro scope). In ``seq-mean-token-mean`` each row's ``n_i`` is always
            its own (local to the row), only ``B_eff`` is global.
        seq_denominator: used only when ``denominators`` is ``None`` (see :func:`compute_denominators`).
        loss_scale_factor: ``C``; required for ``seq-mean-token-sum-norm`` when ``denominators`` is
            ``None``; if given together with ``denominators`` it must equal their ``scale``.

    Returns:
        0-d tensor in ``X``'s dtype, differentiable w.r.t. ``X`` (and ``W`` through the numerator). If
        the denominator is 0 (no weighted token / no counted sequence) the result is ``0`` — still
        attached to the graph, with zero gradient — instead of ``NaN``.

    Raises:
        ValueError: unknown ``mode``; shapes of ``X`` and ``W`` differ or are not 2-D; sum-norm without
            ``loss_scale_factor``; ``denominators`` computed for another mode or another scale.

    Source: grpo_core.md §6; GRPO (Shao et al. 2024, Eq. 3), DAPO (Yu et al. 2025, Eq. 12), Dr.GRPO
    (Liu et al. 2025, Eq. 3 / §3.1), verl ``core_algos.agg_loss``.
    """
    _check_mode(mode, "aggregate")
    if X.dim() != 2 or tuple(W.shape) != tuple(X.shape):
        raise ValueError(
            f"aggregate: X and W must both be [n, T] of one shape, got {tuple(X.shape)} and {tuple(W.shape)}"
        )
    if denominators is None:
        denominators = compute_denominators(
            W, mode, seq_denominator=seq_denominator, loss_scale_factor=loss_scale_factor
        )
    else:
        if denominators.mode is not None and denominators.mode != mode:
            raise ValueError(
                f"aggregate: denominators were computed for loss_agg_mode={denominators.mode!r}, not {mode!r}"
            )
        lsf = loss_scale_factor
        if lsf is not None and mode == _SUM_NORM and float(lsf) != denominators.scale:
            raise ValueError(
                f"aggregate: loss_scale_factor={loss_scale_factor} differs from denominators.scale="
                f"{denominators.scale}"
            )
    Wx = W.to(X.dtype)
    weighted = torch.where(Wx != 0, Wx * X, torch.zeros((), dtype=X.dtype, device=X.device))  # [n, T]
    row = weighted.sum(dim=1)  # [n]
    if mode == "token-sum":
        return row.sum()
    if mode == "token-mean":
        denom = denominators.token_weight
        num = row.sum()
    else:
        denom = denominators.num_seqs * denominators.scale
        if mode == "seq-mean-token-mean":
            n_i = Wx.detach().sum(dim=1)  # [n], each row's own token weight
            safe = torch.where(n_i > 0, n_i, torch.ones_like(n_i))
            row = torch.where(n_i > 0, row / safe, torch.zeros_like(row))
        num = row.sum()
    if denom == 0:
        return num * 0.0
    return num / denom

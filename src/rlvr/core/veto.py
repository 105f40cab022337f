"""μ-GRPO's negative-advantage veto: a pure mask over the post-trigger suffix (``docs/mu_grpo.md`` §2.3).

A **trigger** is a masked-in token of a negative-advantage response whose current/behaviour ratio has
collapsed, ``ρ[i,t] < δ``. The current policy essentially never reaches the prefix after a trigger
again (the prefix occupancy ratio is at most about ``ρ_κ``), yet token-level GRPO keeps pushing the
suffix tokens down with full strength. The veto removes them from the loss::

    neg   = (A < 0)[:, None]                                  # [B, 1]
    trig  = M & neg & (log_ρ < log δ)                         # [B, T]
    excl  = cumsum(trig, -1) − trig                           # triggers strictly before t
    S     = (excl > 0) & M                                    # suffix after the first trigger (κ excluded)
    scope = {none: 0, trigger_only: trig, suffix: S, nontrigger_suffix: S & ~trig,
             sequence: any(trig, -1)[:, None] & M}
    veto_mask = 1 − scope[veto_scope]                         # [B, T], multiplies W

The mask is recomputed from the current forward at every update (ratios move during a stage) and
carries no gradient. Positive-advantage responses are never vetoed.

``trigger`` (``mu_grpo.veto_trigger``) chooses the ratio the trigger tests: ``token`` (default, the
rule above) or ``prefix``, the cumulative log-ratio of the masked-in tokens up to and including ``t``::

    log_ρ_prefix[i, t] = Σ_{s ≤ t} M[i, s] · log_ρ[i, s]       # log of the prefix occupancy ratio

interpretation: the veto's rationale (§2.3) is that the current policy no longer reaches the *prefix*
after κ, whose probability ratio is the product of the per-token ratios; a run of moderately unlikely
tokens can push that product below δ with no single token below δ, so ``prefix`` tests the product
itself. The paper states the trigger on the token ratio, hence ``token`` stays the default.
"""

from __future__ import annotations

import math

import torch

__all__ = ["VETO_SCOPES", "VETO_TRIGGERS", "neg_veto_mask", "veto_metrics", "veto_triggers"]

VETO_SCOPES: tuple[str, ...] = ("suffix", "nontrigger_suffix", "sequence", "trigger_only", "none")
"""``veto_scope`` values, default first. Source: mu_grpo.md §2.3 (Fig. 3 scopes) and §3."""

VETO_TRIGGERS: tuple[str, ...] = ("token", "prefix")
"""``veto_trigger`` values, default first: the per-token ratio (mu_grpo.md §2.3) or the cumulative prefix
ratio (interpretation, see the module docstring)."""


def _trigger_log_ratio(lr: torch.Tensor, M: torch.Tensor, trigger: str, fn: str) -> torch.Tensor:
    """The ``[B, T]`` log-ratio the trigger compares with ``log δ``: per token, or its masked prefix sum."""
    if trigger not in VETO_TRIGGERS:
        raise ValueError(f"{fn}: unknown veto_trigger {trigger!r}; expected one of {VETO_TRIGGERS}")
    return lr if trigger == "token" else torch.where(M, lr, torch.zeros_like(lr)).cumsum(dim=-1)


def _check(log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, threshold: float, fn: str):
    if log_ratio.dim() != 2:
        raise ValueError(f"{fn}: log_ratio must be [B, T], got shape {tuple(log_ratio.shape)}")
    if tuple(mask.shape) != tuple(log_ratio.shape):
        raise ValueError(f"{fn}: mask must have the shape of log_ratio {tuple(log_ratio.shape)}, got {tuple(mask.shape)}")
    if not (isinstance(threshold, (int, float)) and math.isfinite(threshold) and threshold > 0):
        raise ValueError(f"{fn}: threshold (veto_ratio_threshold δ) must be a finite number > 0, got {threshold!r}")
    B, T = log_ratio.shape
    A = advantages.detach()
    if A.dim() == 2 and A.shape[1] == 1:
        A = A[:, 0]
    if A.dim() == 1:
        if A.shape[0] != B:
            raise ValueError(f"{fn}: advantages must be [B] or [B, T] with B={B}, got {tuple(advantages.shape)}")
        A = A[:, None].expand(B, T)
    elif tuple(A.shape) != (B, T):
        raise ValueError(f"{fn}: advantages must be [B] or [B, T] with B, T = {(B, T)}, got {tuple(advantages.shape)}")
    return log_ratio.detach(), A, mask.detach() > 0


def veto_triggers(
    log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, threshold: float = 1e-4,
    trigger: str = "token",
) -> torch.Tensor:
    """Trigger tokens: masked-in, negative advantage, ``ρ < δ`` (``trigger="prefix"``: ``Π_{s≤t} ρ_s < δ``).

    Args:
        log_ratio: ``[B, T]`` ``log π_θ − log π_behav`` per token (nats); detached here.
        advantages: ``[B]`` response advantages (or ``[B, T]`` per-token advantages; then "negative"
            is decided per token — interpretation: with per-token advantages, e.g. tree advantages, a
            token belongs to a negative response exactly where its own advantage is negative).
        mask: ``[B, T]`` completion mask ``M`` (bool or 0/1 float; ``> 0`` is masked in).
        threshold: ``δ`` (``mu_grpo.veto_ratio_threshold``), a ratio (not a log), ``> 0``.
        trigger: one of :data:`VETO_TRIGGERS`: ``token`` tests ``ρ[i, t]``; ``prefix`` tests the
            product of the masked-in ratios up to and including ``t`` (padding counts as ``ρ = 1``).

    Returns:
        ``[B, T]`` bool.

    Raises:
        ValueError: shapes that do not match, ``threshold <= 0`` / not finite, or an unknown ``trigger``.

    Source: mu_grpo.md §2.3 (trigger definition; project page illustration ``ρ < 1e-4``); ``prefix``:
    interpretation (module docstring).
    """
    lr, A, M = _check(log_ratio, advantages, mask, threshold, "veto_triggers")
    return M & (A < 0) & (_trigger_log_ratio(lr, M, trigger, "veto_triggers") < math.log(threshold))


def neg_veto_mask(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    threshold: float = 1e-4,
    scope: str = "suffix",
    trigger: str = "token",
) -> torch.Tensor:
    """The veto mask ``[B, T]``: 0 on vetoed tokens, 1 elsewhere (multiplies the loss weight ``W``).

    Args:
        log_ratio: ``[B, T]`` current-vs-behaviour log-ratio (nats), recomputed at every update; it is
            detached (the mask carries no gradient).
        advantages: ``[B]`` (or ``[B, T]``, see :func:`veto_triggers`).
        mask: ``[B, T]`` completion mask ``M``.
        threshold: ``δ > 0`` (default ``1e-4``).
        scope: one of :data:`VETO_SCOPES`:
            ``suffix`` (default) masks every masked-in token strictly after the first trigger κ,
            later triggers included; ``nontrigger_suffix`` that set minus trigger tokens;
            ``sequence`` every masked-in token of a response with any trigger; ``trigger_only`` the
            trigger tokens only; ``none`` nothing.
        trigger: one of :data:`VETO_TRIGGERS` (see :func:`veto_triggers`); the scope then applies to
            the triggers it finds.

    Returns:
        ``[B, T]`` float (``log_ratio``'s dtype) in ``{0, 1}``. Rows with ``A >= 0`` are all 1; padding
        positions (``M == 0``) are 1 (``W`` already drops them).

    Raises:
        ValueError: unknown ``scope`` or ``trigger``, mismatched shapes, or an invalid ``threshold``.

    Source: mu_grpo.md §2.3 ("Exact rule used by rlvr"), scopes of Fig. 3; applies to ``A < 0`` only
    [paper]. ``trigger="prefix"``: interpretation (module docstring).
    """
    if scope not in VETO_SCOPES:
        raise ValueError(f"neg_veto_mask: unknown veto_scope {scope!r}; expected one of {VETO_SCOPES}")
    trig = veto_triggers(log_ratio, advantages, mask, threshold, trigger)  # [B, T] bool
    _, A, M = _check(log_ratio, advantages, mask, threshold, "neg_veto_mask")
    if scope == "none":
        vetoed = torch.zeros_like(trig)
    elif scope == "trigger_only":
        vetoed = trig
    elif scope == "sequence":
        vetoed = trig.any(dim=-1, keepdim=True) & M
    else:
        c = trig.long().cumsum(dim=-1)
        excl = c - trig.long()  # triggers strictly before t
        suffix = (excl > 0) & M
        if A.dim() == 2:
            suffix = suffix & (A < 0)  # per-token advantages: positive tokens are never vetoed
        vetoed = suffix if scope == "suffix" else suffix & ~trig
    if scope == "sequence":
        vetoed = vetoed & (A < 0)
    return (~vetoed).to(log_ratio.dtype)


def veto_metrics(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    veto_mask: torch.Tensor,
    threshold: float = 1e-4,
    trigger: str = "token",
) -> dict[str, tuple[float, float]]:
    """The §4 veto metrics of one (micro-)batch as ``name → (numerator, denominator)`` pairs.

    Pairs, not ratios, so micro-batches can be summed before dividing (the trainer reports
    ``Σ num / Σ den`` per optimizer update and omits a metric whose denominator is 0).

    Args:
        log_ratio: ``[B, T]`` log-ratio (nats). advantages: ``[B]`` or ``[B, T]``. mask: ``[B, T]`` ``M``.
        veto_mask: ``[B, T]`` the output of :func:`neg_veto_mask` (0 = vetoed).
        threshold: ``δ``, used to find triggers. trigger: as in :func:`veto_triggers`.

    Returns:
        * ``mu_grpo/veto_response_rate``: responses with ``A < 0`` and at least one trigger / responses
          with ``A < 0`` (with ``[B, T]`` advantages: rows with a negative masked-in token);
        * ``mu_grpo/veto_token_frac``: vetoed masked-in tokens / masked-in tokens;
        * ``mu_grpo/trigger_pos_frac``: ``Σ κ_i / L_i`` over responses with a trigger / their count
          (``κ`` the 0-based index of the first trigger among the masked-in tokens, ``L`` the response's
          masked-in length);
        * ``mu_grpo/ratio_neg_mean``: ``Σ ρ`` over masked-in tokens with ``A < 0`` / their count (Fig. 3's
          collapse indicator ``E[ρ_t | A_t < 0]``);
        * ``mu_grpo/ratio_pos_mean``: the same over ``A > 0``.

    Raises:
        ValueError: mismatched shapes, an invalid ``threshold`` or an unknown ``trigger``.

    Source: mu_grpo.md §4 (metric definitions).
    """
    lr, A, M = _check(log_ratio, advantages, mask, threshold, "veto_metrics")
    if tuple(veto_mask.shape) != tuple(lr.shape):
        raise ValueError(f"veto_metrics: veto_mask must be {tuple(lr.shape)}, got {tuple(veto_mask.shape)}")
    trig = veto_triggers(log_ratio, advantages, mask, threshold, trigger)
    neg_tok = M & (A < 0)
    pos_tok = M & (A > 0)
    neg_rows = neg_tok.any(dim=-1)
    trig_rows = trig.any(dim=-1)
    rho = lr.double().exp()
    L = M.sum(dim=-1).double()
    pos = M.long().cumsum(dim=-1) - 1  # index among masked-in tokens (= t for a mask starting at 0; a
    # multi-turn row's environment tokens, M = 0, are not counted)
    first = torch.where(trig, pos, lr.shape[1]).min(dim=-1).values.double()
    pos_frac = torch.where(trig_rows, first / L.clamp_min(1), torch.zeros_like(L))
    vetoed = M & (veto_mask.detach() == 0)
    return {
        "mu_grpo/veto_response_rate": (float((neg_rows & trig_rows).sum()), float(neg_rows.sum())),
        "mu_grpo/veto_token_frac": (float(vetoed.sum()), float(M.sum())),
        "mu_grpo/trigger_pos_frac": (float(pos_frac.sum()), float(trig_rows.sum())),
        "mu_grpo/ratio_neg_mean": (float(rho[neg_tok].sum()), float(neg_tok.sum())),
        "mu_grpo/ratio_pos_mean": (float(rho[pos_tok].sum()), float(pos_tok.sum())),
    }

"""Importance ratios and the clipped surrogate (``docs/grpo.md`` §5).

Shapes: ``N`` sequences (or ``n`` in a micro-batch), ``T`` padded completion length. Log-probs are
natural logs of the sampled tokens' probabilities, ``[N, T]``.

Policy losses are looked up by name in :data:`POLICY_LOSSES`. Every entry has the signature::

    fn(logp[N,T], old_logp[N,T], advantages[N] | [N,T], mask[N,T], *, epsilon, epsilon_high,
       clip_ratio_c, importance_sampling_level) -> (per_token_loss[N,T], info: dict[str, Tensor[N,T]])

``info`` must contain ``"ratio"`` (detached) and may contain the clip indicators ``"clip_low"``,
``"clip_high"``, ``"clip_region"``, ``"clip_dual"`` (detached, 0/1 float).
"""

from __future__ import annotations

from typing import Callable

import torch

from rlvr.registry import Registry

__all__ = [
    "IMPORTANCE_SAMPLING_LEVELS",
    "LOG_RATIO_CLAMP",
    "POLICY_LOSSES",
    "clipped_surrogate",
    "get_policy_loss",
    "importance_log_ratio",
]

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence", "sequence_token")

LOG_RATIO_CLAMP = 20.0
"""Log-ratios are clamped to ``[−20, 20]`` before ``exp`` (verl; keeps ``ρ`` finite)."""


def _check_2d(name: str, x: torch.Tensor, shape: tuple[int, ...], fn: str) -> None:
    if tuple(x.shape) != shape:
        raise ValueError(f"{fn}: {name} must have shape {shape} (like logp), got {tuple(x.shape)}")


def importance_log_ratio(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    mask: torch.Tensor,
    level: str = "token",
) -> torch.Tensor:
    """Log importance ratio ``log ρ[i,t]`` of the current vs the behaviour policy.

    * ``"token"``: ``log ρ[i,t] = clamp(logp − old_logp, −20, 20)`` (verl clamps before ``exp``).
    * ``"sequence"`` (GSPO): ``log s_i = Σ_t M·(logp − old_logp) / Σ_t M`` broadcast to every token of
      row ``i``; the gradient flows through all masked tokens of the row (each gets ``1/Σ_t M``).
    * ``"sequence_token"`` (GSPO-token): ``log ρ[i,t] = sg(log s_i) + logp[i,t] − sg(logp[i,t])``. Its
      value equals ``log s_i`` and its gradient w.r.t. ``logp[i,t]`` is 1, which permits per-token
      advantages.

    The sequence mean is also clamped to ``[−20, 20]`` (interpretation: the same overflow guard as
    the token level). Rows with ``Σ_t M = 0`` get ``log s_i = 0``.

    Args:
        logp: ``[N, T]`` current log-probs (requires grad during training).
        old_logp: ``[N, T]`` behaviour log-probs (treated as constants).
        mask: ``[N, T]`` completion mask ``M`` (0/1, or weights: only ``M != 0`` matters for
            ``"token"``; the sequence levels weight by ``M``). Masked entries of the inputs may hold any
            finite or non-finite value for the sequence levels.
        level: one of :data:`IMPORTANCE_SAMPLING_LEVELS`.

    Returns:
        ``[N, T]`` log-ratios (nats). For the sequence levels every token of a row holds the row's value,
        masked positions included.

    Raises:
        ValueError: unknown ``level`` or mismatched shapes.

    Source: grpo_core.md §5.1; GSPO (Zheng et al. 2025) §4.1 Eq. 7 (sequence) and §4.2 Eq. 13
    (GSPO-token); token clamp: verl ``compute_policy_loss`` (code-precedent).
    """
    fn = "importance_log_ratio"
    if level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(
            f"{fn}: importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, got {level!r}"
        )
    if logp.dim() != 2:
        raise ValueError(f"{fn}: logp must be [N, T], got shape {tuple(logp.shape)}")
    _check_2d("old_logp", old_logp, tuple(logp.shape), fn)
    _check_2d("mask", mask, tuple(logp.shape), fn)
    diff = logp - old_logp.detach()
    if level == "token":
        return diff.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    m = mask.detach().to(logp.dtype)
    masked = torch.where(m != 0, m * diff, torch.zeros((), dtype=logp.dtype, device=logp.device))
    n = m.sum(dim=1)  # [N]
    safe_n = torch.where(n > 0, n, torch.ones_like(n))
    log_s = torch.where(n > 0, masked.sum(dim=1) / safe_n, torch.zeros_like(n))
    log_s = log_s.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)[:, None]  # [N, 1]
    if level == "sequence":
        return log_s.expand_as(logp)
    return log_s.detach() + logp - logp.detach()


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    clip_ratio_c: float | None = None,
    importance_sampling_level: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO clipped surrogate with decoupled bounds and optional dual clip.

    ::

        L_pg[i,t] = max( −A·ρ , −A·clip(ρ, 1 − epsilon, 1 + epsilon_high) )
        if A < 0 and clip_ratio_c is set:  L_pg = min( L_pg , −A·clip_ratio_c )

    Implemented in the equivalent form ``L_pg = −A·ρ`` outside the clipped regions and a constant
    (zero gradient) inside them, so the gradient is zero exactly when (strict inequalities):
    ``A > 0 ∧ ρ > 1 + epsilon_high``, or ``A < 0 ∧ ρ < 1 − epsilon``, or
    ``A < 0 ∧ ρ > clip_ratio_c``. At a boundary (``ρ`` equal to a bound) the gradient flows.

    Args:
        logp: ``[N, T]`` current log-probs. old_logp: ``[N, T]`` behaviour log-probs (constants);
            ``None`` means ``sg(logp)`` (on-policy, ``ρ ≡ 1``).
        advantages: ``[N]`` (outcome rewards, broadcast over ``t``), ``[N, 1]`` or ``[N, T]``.
        mask: ``[N, T]`` completion mask; only the sequence IS levels use it (for the sequence mean).
            The caller applies the loss weight ``W`` in :func:`rlvr.core.aggregation.aggregate`.
        epsilon: lower clip, ``0 < epsilon <= 1``. epsilon_high: upper clip ``>= 0``; ``None`` = ``epsilon``
            (DAPO clip-higher: 0.2 / 0.28).
        clip_ratio_c: dual-clip constant ``> 1`` for ``A < 0``; ``None`` = off (TRL; verl uses 3.0).
        importance_sampling_level: see :func:`importance_log_ratio`.

    Returns:
        ``(loss, info)``: ``loss`` ``[N, T]`` per-token loss (advantage units; to be minimised) and
        ``info`` with detached ``[N, T]`` tensors ``"ratio"`` (``ρ``), ``"clip_low"``
        (``ρ < 1−ε ∧ A < 0``), ``"clip_high"`` (``ρ > 1+ε_high ∧ A > 0``), ``"clip_region"`` (low ∨ high)
        and ``"clip_dual"`` (``A < 0 ∧ ρ > c``; all 0 when dual clip is off), indicators as 0/1 floats.

    Raises:
        ValueError: ``epsilon`` not in ``(0, 1]``, ``epsilon_high < 0``, ``clip_ratio_c <= 1``, unknown
            level, or shapes that do not match.

    Source: grpo_core.md §5.2–5.5; PPO (Schulman et al. 2017, Eq. 7); DAPO (Yu et al. 2025, §3.1
    clip-higher); dual-clip PPO (Ye et al. 2020, Eq. 5) and verl ``compute_policy_loss``.
    """
    fn = "clipped_surrogate"
    eps_high = _checked_clip_bounds(fn, epsilon, epsilon_high, clip_ratio_c)
    if logp.dim() != 2:
        raise ValueError(f"{fn}: logp must be [N, T], got shape {tuple(logp.shape)}")
    if old_logp is None:
        old_logp = logp.detach()
    A = _token_advantages(fn, advantages, logp)

    log_ratio = importance_log_ratio(logp, old_logp, mask, importance_sampling_level)
    ratio = torch.exp(log_ratio)  # [N, T]
    r = ratio.detach()
    rho_eff, low, high, dual = _clipped_ratio(ratio, r, A, 1.0 - epsilon, 1.0 + eps_high, clip_ratio_c)
    loss = -A * rho_eff  # [N, T]

    f = logp.dtype
    info = {
        "ratio": r,
        "clip_low": low.to(f),
        "clip_high": high.to(f),
        "clip_region": (low | high).to(f),
        "clip_dual": dual.to(f),
    }
    return loss, info


def _checked_clip_bounds(fn: str, epsilon: float, epsilon_high: float | None, clip_ratio_c: float | None) -> float:
    """The upper clip ``epsilon_high`` (``epsilon`` when None) after checking the three bounds.

    Raises:
        ValueError: ``epsilon`` not in ``(0, 1]``, ``epsilon_high < 0`` or ``clip_ratio_c <= 1``.
    """
    if not 0 < epsilon <= 1:
        raise ValueError(f"{fn}: epsilon must be in (0, 1], got {epsilon}")
    eps_high = epsilon if epsilon_high is None else epsilon_high
    if eps_high < 0:
        raise ValueError(f"{fn}: epsilon_high must be >= 0, got {epsilon_high}")
    if clip_ratio_c is not None and not clip_ratio_c > 1:
        raise ValueError(f"{fn}: clip_ratio_c must be > 1 (or None), got {clip_ratio_c}")
    return eps_high


def _token_advantages(fn: str, advantages: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """``advantages`` (``[N]``, ``[N, 1]`` or ``[N, T]``) detached, in ``logp``'s dtype and expanded to
    ``logp``'s ``[N, T]``.

    Raises:
        ValueError: any other shape.
    """
    A = advantages.detach().to(logp.dtype)
    if A.dim() == 1:
        A = A[:, None]
    if A.dim() != 2 or A.shape[0] != logp.shape[0] or A.shape[1] not in (1, logp.shape[1]):
        raise ValueError(
            f"{fn}: advantages must be [N], [N, 1] or [N, T] with N, T = {tuple(logp.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    return A.expand_as(logp)


def _clipped_ratio(
    ratio: torch.Tensor, r: torch.Tensor, A: torch.Tensor, lo: float, hi: float, clip_ratio_c: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(rho_eff, low, high, dual)``: the ratio each token's loss uses ``[N, T]`` — the constant bound
    where a clip binds (no gradient), else ``ratio`` — and the boolean ``[N, T]`` regions where the lower
    (``r < lo ∧ A < 0``), upper (``r > hi ∧ A > 0``) and dual (``A < 0 ∧ r > c``) clips bind
    (``r`` = the detached ``ratio``; source: :func:`clipped_surrogate`)."""
    low = (r < lo) & (A < 0)
    high = (r > hi) & (A > 0)
    if clip_ratio_c is not None:
        dual = (A < 0) & (r > clip_ratio_c)
    else:
        dual = torch.zeros_like(low)
    # value of ρ used by each token: the constant bound where a clip binds (no gradient), else ρ
    const = torch.where(low, torch.full_like(r, lo), torch.full_like(r, hi))
    if clip_ratio_c is not None:
        const = torch.where(dual, torch.full_like(r, float(clip_ratio_c)), const)
    frozen = low | high | dual
    return torch.where(frozen, const, ratio), low, high, dual


POLICY_LOSSES: Registry[Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]] = Registry(
    "policy_loss", "rlvr.core.policy_loss.POLICY_LOSSES",
    "Other objectives are registered with @POLICY_LOSSES.register(name).", {"clipped": clipped_surrogate},
)
"""Registry ``policy_loss`` name → per-token loss function (signature in the module docstring).
Source: grpo_core.md §12 (``policy_loss`` registry, default ``clipped``)."""


def get_policy_loss(name: str) -> Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """Look up a per-token policy loss in :data:`POLICY_LOSSES`.

    Raises:
        UnknownNameError: (a ``KeyError`` and ``ValueError``) the name is not registered. TRL loss
            types that are separate objectives (``cispo``, ``sapo``, ``luspo``, ``vespo``) get a message
            naming the registry where such an objective must be added.

    Source: grpo_core.md §12 (TRL ``loss_type`` translation).
    """
    hint = ""
    if name in ("cispo", "sapo", "luspo", "vespo"):
        hint = (
            f"{name!r} is a separate objective, not part of the GRPO core; register it in "
            "rlvr.core.policy_loss.POLICY_LOSSES"
        )
    elif name in ("grpo", "dapo", "bnpo", "dr_grpo"):
        hint = (
            f"TRL loss_type {name!r} is an aggregation choice in rlvr: use policy_loss='clipped' with the "
            "loss_agg_mode/seq_denominator of grpo_core.md §12"
        )
    return POLICY_LOSSES.lookup(name, hint)

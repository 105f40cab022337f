"""FBOS-RL tensor math: the EPA off-policy weights, the EPA per-token loss, the view advantages and
the per-view normalisation of the joint objective (``docs/fbos_rl.md`` §2.7–§2.9).

Shapes: ``N`` completions, ``T`` padded completion length. Log-probs are natural logs of the sampled
tokens' probabilities, ``[N, T]``. Pure functions on tensors: no model, no config object, no I/O.

Vocabulary: in the EPA view (context = the original prompt ``x``) a row is *on-policy* when it was
sampled from ``x`` (initial and fill rollouts) and *off-policy* (``is_offpolicy = 1``) when it was
sampled from a feedback-augmented prompt ``c_j`` and is re-scored under ``x``. The ECC view (context
``c_j``) holds only on-policy rows and uses the core clipped surrogate unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rlvr.core.advantages import grpo_advantages
from rlvr.core.aggregation import LOSS_AGG_MODES, SEQ_DENOMINATORS
from rlvr.core.policy_loss import LOG_RATIO_CLAMP, POLICY_LOSSES, clipped_surrogate

__all__ = [
    "OFFPOLICY_WEIGHTS",
    "ecc_advantages",
    "epa_policy_loss",
    "offpolicy_weight",
    "shaped_offpolicy",
    "shaped_weight",
    "trunc_is_offpolicy",
    "trunc_is_weight",
    "view_advantages",
    "view_normalised_weights",
]

OFFPOLICY_WEIGHTS = ("shaping", "trunc_is", "plain")
"""Values of ``fbos.epa_offpolicy_weight`` (spec §2.7 table)."""


def _adv_2d(advantages: torch.Tensor, like: torch.Tensor, fn: str) -> torch.Tensor:
    A = advantages.detach().to(like.dtype)
    if A.dim() == 1:
        A = A[:, None]
    if A.dim() != 2 or A.shape[0] != like.shape[0] or A.shape[1] not in (1, like.shape[1]):
        raise ValueError(
            f"{fn}: advantages must be [N], [N, 1] or [N, T] with N, T = {tuple(like.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    return A.expand_as(like)


def _check_logp(logp: torch.Tensor, fn: str) -> None:
    if logp.dim() != 2:
        raise ValueError(f"{fn}: logp must be [N, T], got shape {tuple(logp.shape)}")


def shaped_weight(logp: torch.Tensor, gamma: float = 0.1) -> torch.Tensor:
    """Policy-shaping weight ``w = p / (p + γ)`` of each token, with ``p = exp(logp)``.

    Computed as ``sigmoid(logp − log γ)`` (the same value, stable for any ``logp``). The gradient
    flows through ``p``: ``∂w/∂log p = γ·p / (p + γ)²``, at most ``1/4`` (at ``p = γ``).

    Args:
        logp: ``[N, T]`` log-probs (nats) of the tokens under the current policy in the loss context.
        gamma: ``γ > 0`` (``fbos.shaping_gamma``, default 0.1).

    Returns:
        ``[N, T]`` weights in ``(0, 1)``, differentiable w.r.t. ``logp``.

    Raises:
        ValueError: ``gamma <= 0`` or ``logp`` not 2-D.

    Source: docs/fbos_rl.md §2.7 (``shaping``), code-precedent: LUFFY (Yan et al. 2025, policy
    shaping ``f(p) = p/(p+γ)``) and Critique-GRPO's off-policy branch; derivative [derived].
    """
    _check_logp(logp, "shaped_weight")
    if not gamma > 0:
        raise ValueError(f"shaped_weight: gamma must be > 0, got {gamma}")
    return torch.sigmoid(logp - math.log(gamma))


def shaped_offpolicy(logp: torch.Tensor, advantages: torch.Tensor, gamma: float = 0.1) -> torch.Tensor:
    """Per-token shaped off-policy loss ``ℓ = −Â · p/(p+γ)``: no ratio, no behaviour denominator, no clip.

    Its gradient is ``−Â · γp/(p+γ)² · ∇log p``.

    Args:
        logp: ``[N, T]`` current log-probs in the original context ``x``.
        advantages: ``[N]``, ``[N, 1]`` or ``[N, T]`` (treated as constants).
        gamma: ``γ > 0``.

    Returns:
        ``[N, T]`` per-token loss (advantage units).

    Raises:
        ValueError: bad shapes or ``gamma <= 0``.

    Source: docs/fbos_rl.md §2.7 and "Implementation notes" (``shaped_offpolicy(logp, A, γ)``).
    """
    w = shaped_weight(logp, gamma)
    return -_adv_2d(advantages, logp, "shaped_offpolicy") * w


def trunc_is_weight(logp: torch.Tensor, behaviour_logp: torch.Tensor, cap: float = 2.0) -> torch.Tensor:
    """Truncated importance weight ``w = min(p / π_old(o | c), C)`` with the gradient through ``p`` only.

    ``π_old(o | c)`` is the behaviour probability of the token in the context it was sampled from
    (the feedback-augmented prompt). Where the cap binds, ``w = C`` is a constant and passes no
    gradient (interpretation: the literal reading of "gradient only through ``p_t``" of
    ``min(p_t/π_old, C)``; it acts like the upper PPO clip). The log-ratio is also clamped below at
    ``−20`` (the core's overflow guard).

    Args:
        logp: ``[N, T]`` current log-probs in ``x``.
        behaviour_logp: ``[N, T]`` behaviour log-probs in ``c`` (constants).
        cap: ``C > 0`` (``fbos.trunc_is_cap``, default 2).

    Returns:
        ``[N, T]`` weights in ``(0, C]``.

    Raises:
        ValueError: shapes differ or ``cap <= 0``.

    Source: docs/fbos_rl.md §2.7 (``trunc_is``, interpretation).
    """
    _check_logp(logp, "trunc_is_weight")
    if tuple(behaviour_logp.shape) != tuple(logp.shape):
        raise ValueError(
            f"trunc_is_weight: behaviour_logp must have the shape of logp {tuple(logp.shape)}, "
            f"got {tuple(behaviour_logp.shape)}"
        )
    if not cap > 0:
        raise ValueError(f"trunc_is_weight: cap must be > 0, got {cap}")
    log_ratio = (logp - behaviour_logp.detach()).clamp(min=-LOG_RATIO_CLAMP, max=math.log(cap))
    return torch.exp(log_ratio)


def trunc_is_offpolicy(
    logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor, cap: float = 2.0
) -> torch.Tensor:
    """Per-token truncated-IS off-policy loss ``ℓ = −Â · min(p/π_old(o | c), C)`` ``[N, T]``.

    Raises:
        ValueError: as :func:`trunc_is_weight`, or bad advantage shape.

    Source: docs/fbos_rl.md §2.7 (``trunc_is``, interpretation; the spec's mitigation switch for
    the off-policy collapse of peers.md complaint 21).
    """
    w = trunc_is_weight(logp, behaviour_logp, cap)
    return -_adv_2d(advantages, logp, "trunc_is_offpolicy") * w


def offpolicy_weight(
    logp: torch.Tensor,
    kind: str,
    *,
    gamma: float = 0.1,
    cap: float = 2.0,
    behaviour_logp: torch.Tensor | None = None,
    old_logp: torch.Tensor | None = None,
) -> torch.Tensor:
    """The weight ``w_t`` an off-policy EPA token gets under ``kind`` (the ``fbos/offpolicy_weight_mean``
    monitor): ``shaping`` → ``p/(p+γ)``, ``trunc_is`` → ``min(p/π_old(o|c), C)``, ``plain`` → the
    ratio ``ρ = p/π_old(o|x)`` (1 when ``old_logp`` is ``None``).

    Args:
        logp: ``[N, T]`` log-probs in ``x``. behaviour_logp: ``[N, T]`` in ``c`` (``trunc_is``).
        old_logp: ``[N, T]`` in ``x`` (``plain``).

    Returns:
        ``[N, T]`` weights.

    Raises:
        ValueError: unknown ``kind``, or ``trunc_is`` without ``behaviour_logp``.

    Source: docs/fbos_rl.md §2.7, §4 (``fbos/offpolicy_weight_mean``).
    """
    if kind == "shaping":
        return shaped_weight(logp, gamma)
    if kind == "trunc_is":
        if behaviour_logp is None:
            raise ValueError("offpolicy_weight: trunc_is needs behaviour_logp (log π_old(o | c))")
        return trunc_is_weight(logp, behaviour_logp, cap)
    if kind == "plain":
        if old_logp is None:
            return torch.ones_like(logp)
        return torch.exp((logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    raise ValueError(f"offpolicy_weight: kind must be one of {OFFPOLICY_WEIGHTS}, got {kind!r}")


def epa_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    clip_ratio_c: float | None = None,
    importance_sampling_level: str = "token",
    is_offpolicy: torch.Tensor | None = None,
    offpolicy_weight_kind: str = "shaping",
    gamma: float = 0.1,
    cap: float = 2.0,
    behaviour_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """EPA per-token loss: the core clipped surrogate on on-policy tokens, the off-policy rule on the
    feedback-guided ones, selected per row by ``is_offpolicy`` (registered as
    ``POLICY_LOSSES["fbos_epa"]``).

    ::

        ℓ_t = (1 − off)·clipped(ρ_t = p_t/π_old(o_t|x), Â)  +  off·ℓ_off,t
        ℓ_off = −Â·p/(p+γ)                 (shaping: no ratio, never clipped)
              = −Â·min(p/π_old(o|c), C)    (trunc_is: never clipped, cap only)
              = clipped(ρ = p/π_old(o|x))  (plain: treated as on-policy)

    Args:
        logp: ``[N, T]`` current log-probs in the original context ``x`` (requires grad).
        old_logp: ``[N, T]`` behaviour log-probs in ``x`` (``None``: ``sg(logp)``, ``ρ ≡ 1``).
        advantages: ``[N]``, ``[N, 1]`` or ``[N, T]``.
        mask: ``[N, T]`` completion mask (used by the sequence IS levels of the clipped part).
        epsilon, epsilon_high, clip_ratio_c, importance_sampling_level: as
            :func:`rlvr.core.policy_loss.clipped_surrogate` (applied to on-policy rows).
        is_offpolicy: ``[N]`` or ``[N, T]`` 0/1 (bool or float); ``None``: every row on-policy (the
            result then equals the clipped surrogate exactly).
        offpolicy_weight_kind: one of :data:`OFFPOLICY_WEIGHTS` (``fbos.epa_offpolicy_weight``).
        gamma: ``γ`` of ``shaping``. cap: ``C`` of ``trunc_is``.
        behaviour_logp: ``[N, T]`` ``log π_old(o | c)`` for ``trunc_is``; ignored otherwise.

    Returns:
        ``(loss [N, T], info)``; ``info`` as the clipped surrogate's (``ratio`` is ``p/π_old(o|x)``
        everywhere), with the clip indicators forced to 0 on off-policy tokens for ``shaping`` and
        ``trunc_is`` (they are never clipped), plus ``"offpolicy_weight"`` ``[N, T]`` (detached ``w``
        on off-policy tokens, 0 elsewhere).

    Raises:
        ValueError: unknown kind, ``trunc_is`` with off-policy rows but no ``behaviour_logp``, bad
            shapes, or any error of the clipped surrogate.

    Source: docs/fbos_rl.md §2.7 (per-token surrogate, weighting table) and the implementation notes
    (selection by the ``is_offpolicy`` mask, both parts feed the same ``agg``); LUFFY / Critique-GRPO
    (code-precedent).
    """
    fn = "epa_policy_loss"
    if offpolicy_weight_kind not in OFFPOLICY_WEIGHTS:
        raise ValueError(f"{fn}: offpolicy_weight_kind must be one of {OFFPOLICY_WEIGHTS}, got {offpolicy_weight_kind!r}")
    _check_logp(logp, fn)
    loss, info = clipped_surrogate(
        logp, old_logp, advantages, mask, epsilon=epsilon, epsilon_high=epsilon_high,
        clip_ratio_c=clip_ratio_c, importance_sampling_level=importance_sampling_level,
    )
    zeros = torch.zeros_like(logp).detach()
    if is_offpolicy is None:
        info["offpolicy_weight"] = zeros
        return loss, info
    off = _offpolicy_tokens(is_offpolicy, logp, fn)
    if offpolicy_weight_kind == "plain":
        w = offpolicy_weight(logp.detach(), "plain", old_logp=None if old_logp is None else old_logp.detach())
        info["offpolicy_weight"] = torch.where(off, w, zeros)
        return loss, info
    off_loss, w = _offpolicy_term(offpolicy_weight_kind, logp, advantages, off, gamma, cap, behaviour_logp, fn)
    loss = torch.where(off, off_loss, loss)
    for k in ("clip_low", "clip_high", "clip_region", "clip_dual"):
        if k in info:
            info[k] = torch.where(off, zeros, info[k])
    info["offpolicy_weight"] = torch.where(off, w, zeros)
    return loss, info


def _offpolicy_tokens(is_offpolicy: torch.Tensor, logp: torch.Tensor, fn: str) -> torch.Tensor:
    """``is_offpolicy`` (``[N]`` or ``[N, T]``, bool or 0/1) as an ``[N, T]`` bool mask of the off-policy tokens.

    Raises:
        ValueError: any other shape.
    """
    off = torch.as_tensor(is_offpolicy, device=logp.device)
    if off.dim() == 1:
        off = off[:, None]
    if off.dim() != 2 or off.shape[0] != logp.shape[0] or off.shape[1] not in (1, logp.shape[1]):
        raise ValueError(f"{fn}: is_offpolicy must be [N] or [N, T] with N, T = {tuple(logp.shape)}, got {tuple(off.shape)}")
    return off.expand_as(logp) != 0  # [N, T] bool


def _offpolicy_term(kind: str, logp: torch.Tensor, advantages: torch.Tensor, off: torch.Tensor, gamma: float,
                    cap: float, behaviour_logp: torch.Tensor | None, fn: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ℓ_off [N, T], w [N, T])`` of :func:`epa_policy_loss` for ``kind`` ``shaping`` (``−Â·p/(p+γ)``)
    or ``trunc_is`` (``−Â·min(p/π_old(o|c), C)``), and the detached weight ``w`` each uses.

    Raises:
        ValueError: ``trunc_is`` with off-policy tokens (``off``) but no ``behaviour_logp``.
    """
    if kind == "shaping":
        return shaped_offpolicy(logp, advantages, gamma), shaped_weight(logp.detach(), gamma)
    if behaviour_logp is None:
        if bool(off.any()):
            raise ValueError(f"{fn}: offpolicy_weight_kind=trunc_is needs behaviour_logp (log π_old(o | c))")
        behaviour_logp = logp.detach()
    return trunc_is_offpolicy(logp, behaviour_logp, advantages, cap), trunc_is_weight(logp.detach(), behaviour_logp, cap)


POLICY_LOSSES.register("fbos_epa")(epa_policy_loss)


def view_advantages(
    rewards: torch.Tensor,
    group_id: torch.Tensor,
    include: torch.Tensor,
    **grpo_kwargs: Any,
) -> torch.Tensor:
    """Core GRPO advantages computed over the rows ``include`` only (one view's groups); 0 elsewhere.

    EPA calls it with ``include`` = initial + fill + feedback-guided rows (the union group ``U(x)``, or
    initial + fill only for ``fbos.epa_group=initial_only``); ECC with the feedback-guided rows.

    Args:
        rewards: ``[N]`` rewards. group_id: ``[N]`` integer group ids (rows of one prompt and view share
            one id). include: ``[N]`` bool.
        **grpo_kwargs: ``scale_rewards``, ``adv_eps``, ``std_unbiased`` of
            :func:`rlvr.core.advantages.grpo_advantages`.

    Returns:
        ``[N]`` advantages (0 outside ``include``; a group whose included rewards are all equal gets 0).

    Raises:
        ValueError: shapes differ, or any error of :func:`grpo_advantages`.

    Source: docs/fbos_rl.md §2.7 (``Â_k`` on the union group, unbiased std, eps 1e-6) and the
    implementation notes ("the core grpo estimator runs on two group assignments").
    """
    include = torch.as_tensor(include, dtype=torch.bool)
    if include.shape != rewards.shape or group_id.shape != rewards.shape:
        raise ValueError(
            f"view_advantages: rewards, group_id and include must all be [N]; got {tuple(rewards.shape)}, "
            f"{tuple(group_id.shape)}, {tuple(include.shape)}"
        )
    dt = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
    out = torch.zeros(rewards.shape, dtype=dt)
    idx = include.nonzero(as_tuple=True)[0]
    if idx.numel():
        out[idx] = grpo_advantages(rewards[idx], group_id[idx], **grpo_kwargs).to(dt)
    return out


def ecc_advantages(
    rewards: torch.Tensor,
    group_id: torch.Tensor,
    include: torch.Tensor,
    *,
    baseline: str = "group",
    parent_rewards: torch.Tensor | None = None,
    **grpo_kwargs: Any,
) -> torch.Tensor:
    """ECC advantages over the feedback-guided rows of each prompt.

    * ``baseline="group"``: ``Â_j = (s_j − mean(s)) / (std(s) + eps)`` over the prompt's ``G2``
      feedback-guided rollouts (core GRPO estimator).
    * ``baseline="parent"``: the improvement ``d_j = s_j − r_parent(j)`` goes through the same core
      estimator (so the group mean is subtracted and, with ``scale_rewards=group``, its std divides).
      With failed parents scoring 0 it equals the ``group`` advantage.

    Args:
        rewards: ``[N]`` ``s_j`` (scored as answers to the original problem). group_id: ``[N]``.
        include: ``[N]`` bool, the ECC rows.
        baseline: ``"group"`` or ``"parent"`` (``fbos.ecc_baseline``).
        parent_rewards: ``[N]`` reward of each row's parent attempt (required for ``parent``).
        **grpo_kwargs: as :func:`view_advantages`.

    Returns:
        ``[N]`` advantages, 0 outside ``include``.

    Raises:
        ValueError: unknown baseline, or ``parent`` without ``parent_rewards`` of shape ``[N]``.

    Source: docs/fbos_rl.md §2.8 (interpretation; ``parent`` is the improvement-style option).
    """
    if baseline == "group":
        return view_advantages(rewards, group_id, include, **grpo_kwargs)
    if baseline != "parent":
        raise ValueError(f"ecc_advantages: baseline must be 'group' or 'parent', got {baseline!r}")
    if parent_rewards is None or parent_rewards.shape != rewards.shape:
        raise ValueError("ecc_advantages: baseline='parent' needs parent_rewards of shape [N]")
    return view_advantages(rewards.float() - parent_rewards.float(), group_id, include, **grpo_kwargs)


def view_normalised_weights(
    W: torch.Tensor,
    view: torch.Tensor,
    mode: str,
    *,
    seq_denominator: str = "nonempty",
    loss_scale_factor: float | None = None,
    view_scale: dict[int, float] | None = None,
) -> torch.Tensor:
    """Token weights ``u [N, T]`` such that ``Σ_{i,t} u·X = Σ_v scale_v · agg_v(X, W, mode)``.

    This lets one ``token-sum`` pass compute a sum of per-view aggregated losses (the ``joint``
    combination ``L = L_EPA + λ·L_ECC``, each view normalised over its own tokens/sequences) with a
    single backward pass. For row ``i`` of view ``v`` with ``n_i = Σ_t W[i,t]`` and ``B_v`` the
    counted sequences of the view:

    ===========================  =========================================
    ``token-mean``               ``u = W / Σ_{i∈v,t} W``
    ``token-sum``                ``u = W``
    ``seq-mean-token-sum``       ``u = W / B_v``
    ``seq-mean-token-mean``      ``u = W / (n_i · B_v)`` (0 where ``n_i = 0``)
    ``seq-mean-token-sum-norm``  ``u = W / (C · B_v)``
    ===========================  =========================================

    Args:
        W: ``[N, T]`` effective loss weights (non-negative). view: ``[N]`` integer view id per row.
        mode: a ``loss_agg_mode``. seq_denominator: ``nonempty`` (``B_v`` counts rows with
            ``n_i > 0``) or ``all``. loss_scale_factor: ``C`` (sum-norm only).
        view_scale: optional ``view id → multiplier`` (default 1).

    Returns:
        ``[N, T]`` float64-accurate weights in ``W``'s floating dtype (a view with no weighted token
        gets 0).

    Raises:
        ValueError: unknown mode / seq_denominator, shapes, or sum-norm without ``C > 0``.

    Source: derived from grpo_core.md §6 (the five aggregation formulas); used for docs/fbos_rl.md
    §2.9 ``combine_mode=joint``.
    """
    fn = "view_normalised_weights"
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"{fn}: mode must be one of {LOSS_AGG_MODES}, got {mode!r}")
    if seq_denominator not in SEQ_DENOMINATORS:
        raise ValueError(f"{fn}: seq_denominator must be one of {SEQ_DENOMINATORS}, got {seq_denominator!r}")
    if W.dim() != 2 or view.dim() != 1 or view.shape[0] != W.shape[0]:
        raise ValueError(f"{fn}: W must be [N, T] and view [N]; got {tuple(W.shape)} and {tuple(view.shape)}")
    if mode == "seq-mean-token-sum-norm" and not (loss_scale_factor and loss_scale_factor > 0):
        raise ValueError(f"{fn}: seq-mean-token-sum-norm needs loss_scale_factor > 0")
    w = W.detach().to(torch.float64)
    n_i = w.sum(dim=1)  # [N]
    row_factor = torch.zeros_like(n_i)
    for v in torch.unique(view).tolist():
        rows = view == v
        scale = float((view_scale or {}).get(int(v), 1.0))
        B = float((n_i[rows] > 0).sum()) if seq_denominator == "nonempty" else float(rows.sum())
        if mode == "token-mean":
            tot = float(n_i[rows].sum())
            f = torch.full_like(n_i[rows], scale / tot if tot > 0 else 0.0)
        elif mode == "token-sum":
            f = torch.full_like(n_i[rows], scale)
        elif mode == "seq-mean-token-sum":
            f = torch.full_like(n_i[rows], scale / B if B > 0 else 0.0)
        elif mode == "seq-mean-token-mean":
            n = n_i[rows]
            f = torch.where(n > 0, scale / (n.clamp(min=1e-300) * max(B, 1.0)), torch.zeros_like(n))
            if B == 0:
                f = torch.zeros_like(n)
        else:
            f = torch.full_like(n_i[rows], scale / (float(loss_scale_factor) * B) if B > 0 else 0.0)
        row_factor[rows] = f
    dt = W.dtype if W.is_floating_point() else torch.get_default_dtype()
    return (w * row_factor[:, None]).to(dt)

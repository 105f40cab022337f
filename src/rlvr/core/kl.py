"""Per-token KL estimators to a reference policy (``specs/grpo_core.md`` §7).

With ``Δ[i,t] = ref_logp[i,t] − logp[i,t]`` (nats):

=========== ============================== ====================================================
estimator   value                          expected on-policy gradient (context fixed)
=========== ============================== ====================================================
``k1``      ``−Δ``                          zero in expectation
``k2``      ``½·Δ²``                        ``∇ KL(π_θ ‖ π_ref)`` (reverse KL)
``k3``      ``exp(Δ) − Δ − 1`` in [−10, 10]  ``∇ KL(π_ref ‖ π_θ)`` (forward KL)
``abs``     ``|Δ|``                         heuristic
=========== ============================== ====================================================

A ``+`` suffix keeps the named value but takes ``k2``'s gradient (straight-through):
``KL = k2 − sg(k2) + sg(k_named)``.
"""

from __future__ import annotations

import torch

__all__ = ["KL_ESTIMATORS", "canonical_kl_estimator", "kl_penalty"]

KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3", "abs")
_ALIASES = {"k1": "k1", "kl": "k1", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3", "abs": "abs"}

K3_CLAMP = 10.0
"""``k3`` values are clamped to ``[−10, 10]`` (verl ``low_var_kl``)."""
_DELTA_CLAMP = 20.0  # Δ is clamped before exp in k3 (verl), so exp never overflows


def canonical_kl_estimator(name: str) -> str:
    """Canonical estimator name: ``"k1" | "k2" | "k3" | "abs"``, with ``"+"`` kept if present.

    Aliases (verl vocabulary): ``kl → k1``, ``mse → k2``, ``low_var_kl → k3``; case and surrounding
    whitespace are ignored. E.g. ``"low_var_kl+" → "k3+"``.

    Raises:
        ValueError: not one of the names or aliases (with at most one ``+``); the message lists them.

    Source: grpo_core.md §7, §12; verl ``kl_penalty`` names (code-precedent).
    """
    if not isinstance(name, str):
        raise ValueError(f"kl_estimator must be a string, got {name!r}")
    key = name.strip().lower()
    plus = key.endswith("+")
    base = key[:-1] if plus else key
    if base not in _ALIASES:
        allowed = ", ".join(sorted(_ALIASES))
        raise ValueError(
            f"unknown kl_estimator {name!r}: expected one of {allowed} (aliases of k1, k2, k3, abs), "
            "each optionally followed by '+' (k2 gradient, straight-through)"
        )
    return _ALIASES[base] + ("+" if plus else "")


def _kl_value(logp: torch.Tensor, ref_logp: torch.Tensor, base: str) -> torch.Tensor:
    delta = ref_logp - logp
    if base == "k1":
        return -delta
    if base == "k2":
        return 0.5 * delta * delta
    if base == "k3":
        d = delta.clamp(-_DELTA_CLAMP, _DELTA_CLAMP)
        return (torch.exp(d) - d - 1.0).clamp(-K3_CLAMP, K3_CLAMP)
    return delta.abs()


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL estimate between the current and the reference policy.

    Args:
        logp: ``[N, T]`` current log-probs of the sampled tokens (nats; requires grad in training).
        ref_logp: ``[N, T]`` reference log-probs of the same tokens (normally detached). Any shape
            equal to ``logp``'s works.
        estimator: a name accepted by :func:`canonical_kl_estimator`.

    Returns:
        ``[N, T]`` per-token KL estimate (nats). For ``k3``, ``Δ`` is clamped to ``[−20, 20]`` before
        ``exp`` and the value to ``[−10, 10]`` (the gradient is zero where a clamp binds). With ``+``
        the value is the named estimator's and ``∂KL/∂logp = logp − ref_logp`` (``k2``'s gradient).

    Raises:
        ValueError: unknown estimator, or shapes differ.

    Source: Schulman, "Approximating KL Divergence" (2020) for k1/k2/k3; grpo_core.md §7; the ``+``
    straight-through and the clamps: verl ``kl_penalty`` (code-precedent, verl PR #2953).
    """
    name = canonical_kl_estimator(estimator)
    if tuple(logp.shape) != tuple(ref_logp.shape):
        raise ValueError(
            f"kl_penalty: logp and ref_logp must have one shape, got {tuple(logp.shape)} and "
            f"{tuple(ref_logp.shape)}"
        )
    plus = name.endswith("+")
    base = name.rstrip("+")
    value = _kl_value(logp, ref_logp, base)
    if not plus:
        return value
    k2 = _kl_value(logp, ref_logp, "k2")
    return k2 - k2.detach() + value.detach()

"""Per-token KL estimators to a reference policy (``docs/grpo.md`` §7).

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

**Off-policy correction** (``kl_is_correction``, :func:`kl_is_corrected`). Tokens are sampled from
``π_old``, not ``π``; the correction makes the expected gradient, over ``y ~ π_old``, equal to the
reverse-KL gradient ``∇ KL(π ‖ π_ref)`` exactly, for every estimator it accepts. Two forms are needed
because the estimators are of two kinds:

* ``k1``, ``k3`` estimate the KL's *value* (``E_π[k] = KL(π ‖ π_ref)``): the importance-weighted value
  ``ρ·k`` with the gradient kept through ``ρ = π/π_old`` has ``E_old[∇(ρ·k)] = ∇ E_π[k] = ∇KL``
  (DeepSeek-V3.2 §3.1 "unbiased KL estimate"; TRL ``use_bias_correction_kl`` multiplies by the
  undetached ratio). Detaching ``ρ`` instead gives ``E_π[(1 − π_ref/π)∇log π]`` for ``k3`` — the
  *forward*-KL gradient — and 0 for ``k1``.
* ``k2`` and every ``+`` estimator are *gradient* estimators (``E_π[∇k] = ∇KL`` on-policy, their value
  is not the KL): ``sg(ρ)·k`` re-weights that gradient, ``E_old[sg(ρ)∇k] = E_π[∇k] = ∇KL``; keeping the
  gradient through ``ρ`` would add ``E_π[k·∇log π] ≠ 0``.
* ``abs`` is neither (a heuristic): no unbiased correction exists, and the combination is refused.
"""

from __future__ import annotations

import torch

__all__ = ["KL_ESTIMATORS", "check_kl_is_correction", "canonical_kl_estimator", "kl_is_corrected", "kl_penalty"]

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


_RATIO_CLAMP = 20.0  # log ρ is clamped before exp, as in the policy loss (grpo_core.md §5.1)
_VALUE_ESTIMATORS = ("k1", "k3")  # E_π[k] = KL(π‖π_ref): the correction keeps the gradient through ρ


def check_kl_is_correction(estimator: str) -> str:
    """The canonical estimator name if ``kl_is_correction`` can be made unbiased for it.

    Raises:
        ValueError: unknown estimator, or ``abs`` (no unbiased off-policy form: its expected gradient is
            no KL's gradient to begin with); the message names the estimators that work.

    Source: the module docstring (derived).
    """
    name = canonical_kl_estimator(estimator)
    if name == "abs":
        raise ValueError(
            "kl_is_correction=true cannot be made unbiased for kl_estimator=abs (a heuristic whose gradient "
            "is no KL's gradient); use k1, k2, k3 (or low_var_kl) or a '+' estimator such as abs+, or set "
            "kl_is_correction=false"
        )
    return name


def kl_is_corrected(
    logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3"
) -> torch.Tensor:
    """Per-token KL term corrected for sampling from ``π_old`` (``kl_is_correction``).

    With ``ρ[i,t] = exp(clamp(logp − old_logp, −20, 20))`` (the per-token ratio, whatever the policy
    loss's ``importance_sampling_level``: the KL is a per-token term):

    * ``k1``, ``k3``: ``ρ · k`` with the gradient through ``ρ``;
    * ``k2`` and ``+`` estimators: ``sg(ρ) · k``.

    Either way ``E_{y~π_old}[∇ term] = ∇ KL(π ‖ π_ref)`` exactly (per token, context fixed; see the module
    docstring), and the value is an unbiased estimate of the estimator's on-policy expectation. On
    policy (``old_logp = sg(logp)``) the value is the plain estimator's; for ``k1``/``k3`` the gradient
    then is the reverse-KL gradient too, which ``k3`` alone does not give (its gradient is the forward KL's).

    Args:
        logp: ``[N, T]`` current log-probs (requires grad in training).
        old_logp: ``[N, T]`` behaviour log-probs the tokens were sampled with (detached here).
        ref_logp: ``[N, T]`` reference log-probs (detached here).
        estimator: a name accepted by :func:`check_kl_is_correction`.

    Returns:
        ``[N, T]`` corrected per-token KL term (nats).

    Raises:
        ValueError: ``abs``, an unknown estimator, or shapes differ.

    Source: DeepSeek-V3.2 (2025) §3.1 "unbiased KL estimate" (k3 with the undetached ratio); TRL
    ``use_bias_correction_kl`` (code-precedent); the ``sg(ρ)`` form for gradient estimators: derived.
    """
    name = check_kl_is_correction(estimator)
    if tuple(old_logp.shape) != tuple(logp.shape):
        raise ValueError(
            f"kl_is_corrected: old_logp must have the shape of logp {tuple(logp.shape)}, got {tuple(old_logp.shape)}"
        )
    kl = kl_penalty(logp, ref_logp.detach(), name)
    ratio = torch.exp((logp - old_logp.detach()).clamp(-_RATIO_CLAMP, _RATIO_CLAMP))
    return ratio * kl if name in _VALUE_ESTIMATORS else ratio.detach() * kl

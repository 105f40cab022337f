"""UEC-RL tensor math: the hard-prompt gate, retention filters, replay admission and entropy helpers.

Pure functions on tensors (no config objects, no models). Shapes: ``N`` completions, ``T`` padded
completion length, ``V`` vocabulary. Advantages here are per-sequence ``[N]`` (UEC-RL uses plain GRPO
advantages, ``docs/uec_rl.md`` §1).

Source: ``docs/uec_rl.md`` (UEC-RL, Wang et al., arXiv 2604.14646; EFRame, arXiv 2506.22200, and the
authors' EasyR1 forks) — §2.1 gate, §2.4 retention, §2.5 admission, §2.3 entropy identity.
"""

from __future__ import annotations

import torch

__all__ = [
    "EXPLORE_FILTERS",
    "REPLAY_ADMISSIONS",
    "entropy_logit_gradient",
    "explore_retention_mask",
    "group_pass_rates",
    "hard_group_mask",
    "low_prob_positive_fraction",
    "regular_retention_mask",
    "replay_admission_mask",
    "retention_mask",
    "softmax_entropy",
    "success_advantage",
    "tempered_is_weights",
    "truncated_positive_mask",
]

EXPLORE_FILTERS = ("positive", "abs", "none")
REPLAY_ADMISSIONS = ("positive", "abs")


def _adv_1d(adv: torch.Tensor, fn: str) -> torch.Tensor:
    adv = torch.as_tensor(adv)
    if adv.dim() != 1:
        raise ValueError(f"{fn}: advantages must be per-sequence [N], got shape {tuple(adv.shape)}")
    return adv


def group_pass_rates(passed: torch.Tensor, group_id: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass rate of each group.

    Args:
        passed: ``[N]`` bool (or 0/1 float): the verifier's pass/fail per completion.
        group_id: ``[N]`` integer group ids.

    Returns:
        ``(ids [G], rate [G])``: the sorted distinct group ids and the share of passing members, in ``[0, 1]``.

    Raises:
        ValueError: shapes differ or are not 1-D.

    Source: docs/uec_rl.md §2.1 (pass rate of a prompt's G regular samples).
    """
    passed = torch.as_tensor(passed)
    group_id = torch.as_tensor(group_id)
    if passed.dim() != 1 or passed.shape != group_id.shape:
        raise ValueError(
            f"group_pass_rates: passed and group_id must both be [N], got {tuple(passed.shape)} and "
            f"{tuple(group_id.shape)}"
        )
    ids, inv, counts = torch.unique(group_id, return_inverse=True, return_counts=True)
    hits = torch.zeros(ids.numel(), dtype=torch.float64).index_add_(0, inv, passed.to(torch.float64))
    return ids, hits / counts.to(torch.float64)


def hard_group_mask(passed: torch.Tensor, group_id: torch.Tensor, max_pass_rate: float = 0.0) -> torch.Tensor:
    """``[N]`` bool: True for rows whose group is *hard* (pass rate ≤ ``max_pass_rate``).

    With the default 0 a group is hard iff none of its members passed (``max_i r_i = 0`` for binary
    rewards). The gate is binary: there is no graded difficulty.

    Args:
        passed: ``[N]`` bool pass/fail. group_id: ``[N]`` integer ids.
        max_pass_rate: threshold in ``[0, 1)`` (``uec.hard_pass_rate_max``).

    Raises:
        ValueError: as :func:`group_pass_rates`, or ``max_pass_rate`` outside ``[0, 1)``.

    Source: docs/uec_rl.md §2.1 [paper via note; code-precedent]. The threshold knob is interpretation
    (0 reproduces the paper).
    """
    if not 0.0 <= max_pass_rate < 1.0:
        raise ValueError(f"hard_group_mask: max_pass_rate must be in [0, 1), got {max_pass_rate}")
    ids, rate = group_pass_rates(passed, group_id)
    _, inv = torch.unique(torch.as_tensor(group_id), return_inverse=True)
    return (rate <= max_pass_rate + 1e-12)[inv]


def regular_retention_mask(adv: torch.Tensor, floor: float | None = 0.05) -> torch.Tensor:
    """``[N]`` bool: keep a regular sample iff ``|Â| > floor`` (``None`` keeps all).

    Drops every member of an all-0 or all-1 group (their Â is exactly 0).

    Raises:
        ValueError: ``adv`` not ``[N]`` or ``floor < 0``.

    Source: docs/uec_rl.md §2.4, τ_R = 0.05 [code-precedent].
    """
    adv = _adv_1d(adv, "regular_retention_mask")
    if floor is None:
        return torch.ones(adv.shape, dtype=torch.bool)
    if floor < 0:
        raise ValueError(f"regular_retention_mask: floor must be >= 0, got {floor}")
    return adv.abs() > floor


def explore_retention_mask(adv: torch.Tensor, mode: str = "positive", floor: float = 0.0) -> torch.Tensor:
    """``[N]`` bool: which exploration samples are kept.

    * ``positive``: ``Â > floor`` (τ_H; default 0 keeps positive-advantage samples only);
    * ``abs``: ``|Â| > floor`` (the authors' code, with 0.5 or 1.0; also keeps strongly negative samples);
    * ``none``: keep all (including zero-advantage ones).

    Raises:
        ValueError: unknown ``mode``, ``floor < 0`` or ``adv`` not ``[N]``.

    Source: docs/uec_rl.md §2.4 — ``positive`` follows the paper [interpretation, the rlvr default];
    ``abs`` is [code-precedent] (EFRame/ICR/EasyR1 branches).
    """
    adv = _adv_1d(adv, "explore_retention_mask")
    if mode not in EXPLORE_FILTERS:
        raise ValueError(f"explore_retention_mask: mode must be one of {EXPLORE_FILTERS}, got {mode!r}")
    if floor < 0:
        raise ValueError(f"explore_retention_mask: floor must be >= 0, got {floor}")
    if mode == "positive":
        return adv > floor
    if mode == "abs":
        return adv.abs() > floor
    return torch.ones(adv.shape, dtype=torch.bool)


def truncated_positive_mask(adv: torch.Tensor, is_truncated: torch.Tensor) -> torch.Tensor:
    """``[N]`` bool: True for samples to *drop*: cut at the length cap and with ``Â > 0``.

    Raises:
        ValueError: shapes differ or ``adv`` not ``[N]``.

    Source: docs/uec_rl.md §2.4 "overlong-positive filter" [code-precedent].
    """
    adv = _adv_1d(adv, "truncated_positive_mask")
    is_truncated = torch.as_tensor(is_truncated, dtype=torch.bool)
    if is_truncated.shape != adv.shape:
        raise ValueError(
            f"truncated_positive_mask: is_truncated {tuple(is_truncated.shape)} must match adv {tuple(adv.shape)}"
        )
    return is_truncated & (adv > 0)


def retention_mask(
    adv: torch.Tensor,
    is_explore: torch.Tensor,
    is_truncated: torch.Tensor,
    *,
    regular_floor: float | None = 0.05,
    explore_filter: str = "positive",
    explore_floor: float = 0.0,
    drop_truncated_positive: bool = True,
) -> torch.Tensor:
    """``[N]`` bool: the full UEC-RL retention rule ``S = (O_R ∪ O_H) \\ {truncated ∧ Â > 0}``.

    Args:
        adv: ``[N]`` stored advantages.
        is_explore: ``[N]`` bool, True for exploration (tempered) samples.
        is_truncated: ``[N]`` bool, no EOS within the token cap.
        regular_floor: τ_R for regular samples (:func:`regular_retention_mask`).
        explore_filter, explore_floor: rule and τ_H for exploration samples (:func:`explore_retention_mask`).
        drop_truncated_positive: apply :func:`truncated_positive_mask`.

    Raises:
        ValueError: as the component functions, or ``is_explore`` of another shape.

    Source: docs/uec_rl.md §2.4 and §2.7 (the per-step procedure).
    """
    adv = _adv_1d(adv, "retention_mask")
    is_explore = torch.as_tensor(is_explore, dtype=torch.bool)
    if is_explore.shape != adv.shape:
        raise ValueError(f"retention_mask: is_explore {tuple(is_explore.shape)} must match adv {tuple(adv.shape)}")
    keep = torch.where(
        is_explore, explore_retention_mask(adv, explore_filter, explore_floor), regular_retention_mask(adv, regular_floor)
    )
    if drop_truncated_positive:
        keep = keep & ~truncated_positive_mask(adv, is_truncated)
    return keep


def replay_admission_mask(adv: torch.Tensor, mode: str = "positive", threshold: float = 1.0) -> torch.Tensor:
    """``[N]`` bool: which trained samples enter the replay buffer.

    * ``positive``: ``Â > A_0`` (default A_0 = 1: successes from groups with few successes);
    * ``abs``: ``|Â| > A_0`` (released EFRame code; also admits strongly negative samples).

    Raises:
        ValueError: unknown ``mode``, ``threshold < 0`` or ``adv`` not ``[N]``.

    Source: docs/uec_rl.md §2.5 — ``positive`` [paper via note; code-precedent, ICR branch]; ``abs``
    [code-precedent, EFRame release].
    """
    adv = _adv_1d(adv, "replay_admission_mask")
    if mode not in REPLAY_ADMISSIONS:
        raise ValueError(f"replay_admission_mask: mode must be one of {REPLAY_ADMISSIONS}, got {mode!r}")
    if threshold < 0:
        raise ValueError(f"replay_admission_mask: threshold must be >= 0, got {threshold}")
    return adv > threshold if mode == "positive" else adv.abs() > threshold


def success_advantage(n: int, k: int) -> float:
    """GRPO advantage of one success in a binary-reward group of ``n`` with ``k`` successes (unbiased std).

    ``Â = (1 − k/n) / s_k``, ``s_k = sqrt(n·(k/n)(1 − k/n)/(n − 1))`` (no ``adv_eps``).

    Raises:
        ValueError: unless ``n ≥ 2`` and ``1 ≤ k < n``.

    Source: docs/uec_rl.md §2.5 [derived]; used to reason about ``A_0`` (e.g. Â > 1 iff k ≤ 2 for n = 5).
    """
    if n < 2 or not 1 <= k < n:
        raise ValueError(f"success_advantage: need n >= 2 and 1 <= k < n, got n={n}, k={k}")
    q = k / n
    return (1 - q) / (n * q * (1 - q) / (n - 1)) ** 0.5


def softmax_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy ``H = −Σ p log p`` (nats) of ``softmax(logits)`` over the last dim: ``[..., V] -> [...]``.

    Source: definition (docs/uec_rl.md §2.3).
    """
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def entropy_logit_gradient(logits: torch.Tensor) -> torch.Tensor:
    """Exact ``∂H/∂z_a = −p_a (log p_a + H)`` for ``p = softmax(z)``: ``[..., V] -> [..., V]``.

    Raising logit ``a`` raises entropy iff ``p_a < exp(−H)``.

    Source: docs/uec_rl.md §2.3 [derived].
    """
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    H = -(p * logp).sum(-1, keepdim=True)
    return -p * (logp + H)


def low_prob_positive_fraction(
    logp: torch.Tensor, entropy: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor
) -> float:
    """Share of positive-advantage tokens that are entropy-raising: ``π(a_t) < exp(−H_t)``.

    Args:
        logp: ``[N, T]`` log π(sampled token) at temperature 1 (nats).
        entropy: ``[N, T]`` full-distribution entropy H_t (nats).
        adv: ``[N]`` advantages.
        mask: ``[N, T]`` 1 on completion tokens.

    Returns:
        A float in ``[0, 1]``; NaN when there is no positive-advantage token.

    Raises:
        ValueError: shape mismatch.

    Source: docs/uec_rl.md §4 (``uec/low_prob_positive_frac``) and §2.3 [derived].
    """
    adv = _adv_1d(adv, "low_prob_positive_fraction")
    if logp.shape != entropy.shape or logp.shape != mask.shape or logp.shape[0] != adv.shape[0]:
        raise ValueError(
            f"low_prob_positive_fraction: logp {tuple(logp.shape)}, entropy {tuple(entropy.shape)}, mask "
            f"{tuple(mask.shape)} must be [N, T] with N = {adv.shape[0]}"
        )
    sel = (mask > 0) & (adv > 0)[:, None]
    if not bool(sel.any()):
        return float("nan")
    low = logp < -entropy
    return float(low[sel].float().mean())


def tempered_is_weights(
    target_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, max_weight: float = 5.0
) -> torch.Tensor:
    """Per-token importance weights ``w = min(π(a)/q_t′(a), max_weight)`` for tempered samples ``[N, T]``.

    Args:
        target_logp: ``[N, T]`` log π at temperature 1 (the training distribution), no gradient.
        behaviour_logp: ``[N, T]`` log q_t′ the token was drawn from (the sampler's log-probs).
        mask: ``[N, T]`` completion mask; weights are 0 outside it.
        max_weight: upper clip (> 0) against exploding ratios.

    Raises:
        ValueError: shape mismatch or ``max_weight <= 0``.

    Source: interpretation (docs/uec_rl.md §3/§5 ablation ``uec.explore_is_correction = tempered_is``):
    the paper trains tempered samples without correction; this switch removes that bias, clipped
    token-wise like truncated IS.
    """
    if target_logp.shape != behaviour_logp.shape or target_logp.shape != mask.shape:
        raise ValueError(
            f"tempered_is_weights: shapes differ: {tuple(target_logp.shape)}, {tuple(behaviour_logp.shape)}, "
            f"{tuple(mask.shape)}"
        )
    if max_weight <= 0:
        raise ValueError(f"tempered_is_weights: max_weight must be > 0, got {max_weight}")
    w = (target_logp.detach() - behaviour_logp.detach()).clamp(max=30.0).exp().clamp(max=max_weight)
    return w * (mask > 0).to(w.dtype)

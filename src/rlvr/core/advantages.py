"""Group-relative advantages, group statistics and reward shaping (``docs/grpo.md`` §3, §9.3, §11).

Shapes: ``N`` completions. ``rewards`` is ``[N]`` float, ``group_id`` is ``[N]`` integer. Groups are
identified by ``group_id`` only, never by position in the batch (§1): ids need not be contiguous,
sorted or start at 0, and permuting the batch permutes the result.

Numerics: statistics are computed in float64 and the result is returned in the rewards' dtype
(the default float dtype for integer or bool rewards). A group whose rewards are all equal gets an
advantage of exactly ``0.0`` (and a ``std`` of exactly ``0.0``), independent of rounding in its mean.
"""

from __future__ import annotations

import warnings

import torch

__all__ = [
    "SCALE_REWARDS_MODES",
    "check_group_sizes",
    "group_stats",
    "grpo_advantages",
    "mean_group_std",
    "overlong_penalty",
    "rloo_advantages",
    "zero_std_group_fraction",
]

SCALE_REWARDS_MODES = ("group", "batch", "none")


# --------------------------------------------------------------------------------------------------
# internal helpers


def _out_dtype(rewards: torch.Tensor) -> torch.dtype:
    return rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()


def _check_inputs(
    rewards: torch.Tensor, group_id: torch.Tensor, fn: str
) -> tuple[torch.Tensor, torch.Tensor]:
    rewards = torch.as_tensor(rewards)
    group_id = torch.as_tensor(group_id, device=rewards.device)
    if rewards.dim() != 1:
        raise ValueError(f"{fn}: rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_id.shape != rewards.shape:
        raise ValueError(
            f"{fn}: group_id must have the shape of rewards [N]={tuple(rewards.shape)}, "
            f"got {tuple(group_id.shape)}"
        )
    if group_id.is_floating_point() or group_id.is_complex():
        raise ValueError(f"{fn}: group_id must be an integer tensor, got dtype {group_id.dtype}")
    if rewards.is_floating_point() and not bool(torch.isfinite(rewards).all()):
        bad = torch.nonzero(~torch.isfinite(rewards)).flatten().tolist()
        raise ValueError(f"{fn}: rewards must be finite; non-finite at rows {bad[:10]}")
    return rewards, group_id


class _Groups:
    """Per-group float64 statistics, with ``inv`` mapping each sample to its group."""

    def __init__(self, rewards: torch.Tensor, group_id: torch.Tensor, unbiased: bool):
        r = rewards.to(torch.float64)
        self.ids, self.inv, counts = torch.unique(group_id, return_inverse=True, return_counts=True)
        g = self.ids.numel()
        self.counts = counts
        self.mean = torch.zeros(g, dtype=torch.float64, device=r.device).index_add_(0, self.inv, r) / counts
        gmax = torch.full((g,), -torch.inf, dtype=torch.float64, device=r.device)
        gmin = torch.full((g,), torch.inf, dtype=torch.float64, device=r.device)
        gmax = gmax.scatter_reduce(0, self.inv, r, "amax")
        gmin = gmin.scatter_reduce(0, self.inv, r, "amin")
        self.constant = gmax == gmin  # [G] zero-variance groups (includes size-1 groups)
        self.mean = torch.where(self.constant, gmax, self.mean)  # exact mean for constant groups
        dev = r - self.mean[self.inv]
        ss = torch.zeros(g, dtype=torch.float64, device=r.device).index_add_(0, self.inv, dev * dev)
        denom = (counts - 1) if unbiased else counts
        var = torch.where(denom > 0, ss / denom.clamp(min=1), torch.zeros_like(ss))
        self.std = torch.where(self.constant, torch.zeros_like(var), var.sqrt())
        self.r = r

    def warn_singletons(self, fn: str) -> torch.Tensor:
        single = self.counts == 1
        if bool(single.any()):
            ids = self.ids[single].tolist()
            warnings.warn(
                f"{fn}: {len(ids)} group(s) of size 1 (group_id {ids[:10]}) have no group baseline; "
                "their advantage is set to 0",
                UserWarning,
                stacklevel=3,
            )
        return single


def _unbiased_std_all(r: torch.Tensor, unbiased: bool) -> torch.Tensor:
    n = r.numel()
    d = n - 1 if unbiased else n
    if d <= 0:
        return torch.zeros((), dtype=torch.float64, device=r.device)
    return ((r - r.mean()) ** 2).sum().div(d).sqrt()


# --------------------------------------------------------------------------------------------------
# statistics


def group_stats(
    rewards: torch.Tensor, group_id: torch.Tensor, *, unbiased: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample mean and standard deviation of the sample's group.

    Args:
        rewards: ``[N]`` scalar rewards (reward units).
        group_id: ``[N]`` integer group identifiers.
        unbiased: ``True`` divides the squared deviations by ``n_g − 1`` (``torch.std``, as TRL and
            verl), ``False`` by ``n_g`` (population std).

    Returns:
        ``(mean, std)``, each ``[N]`` in reward units: ``mean[i] = mean_g``, ``std[i] = std_g`` for the
        group ``g`` of sample ``i``. A group of size 1 has std 0; a constant group has std exactly 0.

    Raises:
        ValueError: ``rewards`` is not 1-D or not finite, or ``group_id`` has another shape or a
            non-integer dtype.

    Source: grpo_core.md §3 (GRPO, Shao et al. 2024 §4.1.2; unbiased std is code-precedent, TRL/verl).
    """
    rewards, group_id = _check_inputs(rewards, group_id, "group_stats")
    gs = _Groups(rewards, group_id, unbiased)
    dt = _out_dtype(rewards)
    return gs.mean[gs.inv].to(dt), gs.std[gs.inv].to(dt)


def zero_std_group_fraction(rewards: torch.Tensor, group_id: torch.Tensor) -> float:
    """Share of groups whose rewards are all equal (metric ``frac_reward_zero_std``).

    Args:
        rewards: ``[N]`` rewards. group_id: ``[N]`` integer group ids.

    Returns:
        A float in ``[0, 1]``: (number of zero-variance groups) / (number of groups). Size-1 groups
        count as zero-variance. ``0.0`` for an empty batch.

    Raises:
        ValueError: as :func:`group_stats`.

    Source: grpo_core.md §11 (TRL ``frac_reward_zero_std``).
    """
    rewards, group_id = _check_inputs(rewards, group_id, "zero_std_group_fraction")
    if rewards.numel() == 0:
        return 0.0
    gs = _Groups(rewards, group_id, True)
    return float(gs.constant.to(torch.float64).mean())


def mean_group_std(rewards: torch.Tensor, group_id: torch.Tensor, *, unbiased: bool = True) -> float:
    """Mean over groups of the within-group reward std (metric ``reward_std``).

    Args:
        rewards: ``[N]`` rewards. group_id: ``[N]`` integer group ids.
        unbiased: as :func:`group_stats`.

    Returns:
        A float in reward units; each group counts once whatever its size. ``0.0`` for an empty batch.

    Raises:
        ValueError: as :func:`group_stats`.

    Source: grpo_core.md §11 (``reward_std`` = mean over groups of the within-group std).
    """
    rewards, group_id = _check_inputs(rewards, group_id, "mean_group_std")
    if rewards.numel() == 0:
        return 0.0
    return float(_Groups(rewards, group_id, unbiased).std.mean())


def check_group_sizes(group_id: torch.Tensor, expected: int | None) -> None:
    """Assert that every group has the expected number of members.

    Runs on every batch to catch indexing bugs that silently turn GRPO into a batch baseline.

    Args:
        group_id: ``[N]`` integer group ids.
        expected: the required group size (``num_generations``). ``None`` requires only that all
            groups have the same size (interpretation: with no known size, a mislabelled group shows
            up as a size different from the others; the most common size is taken as the reference).

    Raises:
        ValueError: ``group_id`` is not a 1-D integer tensor, ``expected < 1``, or a group has the
            wrong size; the message names the group id, its size and the expected size.

    Source: grpo_core.md §1 ("A group-size assertion runs on every batch").
    """
    group_id = torch.as_tensor(group_id)
    if group_id.dim() != 1 or group_id.is_floating_point():
        raise ValueError(
            f"check_group_sizes: group_id must be a 1-D integer tensor, got shape {tuple(group_id.shape)} "
            f"dtype {group_id.dtype}"
        )
    if expected is not None and int(expected) < 1:
        raise ValueError(f"check_group_sizes: expected group size must be >= 1, got {expected}")
    if group_id.numel() == 0:
        return
    ids, counts = torch.unique(group_id, return_counts=True)
    if expected is None:
        values, freq = torch.unique(counts, return_counts=True)
        ref = int(values[freq.argmax()])  # most common size (ties: the smaller size)
        what = f"the most common group size {ref}"
    else:
        ref = int(expected)
        what = f"the expected group size {ref}"
    bad = counts != ref
    if bool(bad.any()):
        pairs = [f"group_id={int(g)} has {int(c)} completions" for g, c in zip(ids[bad], counts[bad])]
        raise ValueError(
            f"check_group_sizes: {len(pairs)} of {ids.numel()} groups differ from {what}: "
            + "; ".join(pairs[:10])
            + (" ..." if len(pairs) > 10 else "")
        )


# --------------------------------------------------------------------------------------------------
# estimators


def grpo_advantages(
    rewards: torch.Tensor,
    group_id: torch.Tensor,
    *,
    scale_rewards: str = "group",
    adv_eps: float = 1e-6,
    std_unbiased: bool = True,
) -> torch.Tensor:
    """Group-relative advantage of GRPO and its scalings.

    For sample ``i`` in group ``g``:

    * ``scale_rewards="group"``: ``A_i = (r_i − mean_g) / (std_g + adv_eps)`` (GRPO);
    * ``"batch"``: ``A_i = (r_i − mean_g) / (std_batch + adv_eps)``, ``std_batch`` the std of all ``N``
      rewards (Lite-PPO; TRL ``scale_rewards="batch"``);
    * ``"none"``: ``A_i = r_i − mean_g`` (Dr.GRPO).

    Zero-variance groups get exactly 0. Groups of size 1 get 0 and a ``UserWarning``.

    Args:
        rewards: ``[N]`` scalar rewards (reward units).
        group_id: ``[N]`` integer group ids.
        scale_rewards: one of :data:`SCALE_REWARDS_MODES`.
        adv_eps: added to the std before dividing (verl 1e-6, TRL 1e-4); ``>= 0``.
        std_unbiased: unbiased (``n − 1``) std if True, population std if False.

    Returns:
        ``[N]`` advantages, dimensionless for ``group``/``batch``, reward units for ``none``.

    Raises:
        ValueError: unknown ``scale_rewards``, ``adv_eps < 0``, or invalid inputs (see
            :func:`group_stats`).

    Source: grpo_core.md §3. GRPO: Shao et al. 2024 (DeepSeekMath) §4.1.2; Dr.GRPO: Liu et al. 2025
    §3.1; batch std: Lite-PPO (Liu et al. 2025, "Tricks or Traps") and TRL; ``std_unbiased=False``
    is interpretation (population std, for parity with implementations that use it).
    """
    if scale_rewards not in SCALE_REWARDS_MODES:
        raise ValueError(
            f"grpo_advantages: scale_rewards must be one of {SCALE_REWARDS_MODES}, got {scale_rewards!r}"
        )
    if adv_eps < 0:
        raise ValueError(f"grpo_advantages: adv_eps must be >= 0, got {adv_eps}")
    rewards, group_id = _check_inputs(rewards, group_id, "grpo_advantages")
    dt = _out_dtype(rewards)
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=dt, device=rewards.device)
    gs = _Groups(rewards, group_id, std_unbiased)
    single = gs.warn_singletons("grpo_advantages")
    centred = gs.r - gs.mean[gs.inv]
    if scale_rewards == "group":
        adv = centred / (gs.std[gs.inv] + adv_eps)
    elif scale_rewards == "batch":
        adv = centred / (_unbiased_std_all(gs.r, std_unbiased) + adv_eps)
    else:
        adv = centred
    zero = (gs.constant | single)[gs.inv]
    adv = torch.where(zero, torch.zeros_like(adv), adv)  # also avoids 0/0 when adv_eps == 0
    return adv.to(dt)


def rloo_advantages(rewards: torch.Tensor, group_id: torch.Tensor, **ignored) -> torch.Tensor:
    """REINFORCE leave-one-out advantage: ``A_i = r_i − (1/(n_g − 1)) Σ_{j∈g, j≠i} r_j``.

    Equivalently ``A_i = n_g/(n_g − 1) · (r_i − mean_g)``. Zero-variance groups get exactly 0; groups
    of size 1 get 0 and a ``UserWarning``.

    Args:
        rewards: ``[N]`` rewards. group_id: ``[N]`` integer group ids.
        **ignored: GRPO's keywords (``scale_rewards``, ``adv_eps``, ``std_unbiased``) are
            accepted and ignored: RLOO does not scale.

    Returns:
        ``[N]`` advantages in reward units.

    Raises:
        ValueError: invalid inputs (see :func:`group_stats`).

    Source: grpo_core.md §3; Ahmadian et al. 2024 ("Back to Basics", RLOO) §3; verl ``rloo``.
    """
    rewards, group_id = _check_inputs(rewards, group_id, "rloo_advantages")
    dt = _out_dtype(rewards)
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=dt, device=rewards.device)
    gs = _Groups(rewards, group_id, True)
    single = gs.warn_singletons("rloo_advantages")
    n = gs.counts.to(torch.float64)[gs.inv]
    adv = (gs.r - gs.mean[gs.inv]) * n / (n - 1).clamp(min=1)
    zero = (gs.constant | single)[gs.inv]
    adv = torch.where(zero, torch.zeros_like(adv), adv)
    return adv.to(dt)


# --------------------------------------------------------------------------------------------------
# reward shaping


def overlong_penalty(
    lengths: torch.Tensor,
    *,
    max_completion_length: int,
    buffer_len: int,
    factor: float = 1.0,
) -> torch.Tensor:
    """DAPO soft overlong punishment, to be added to the reward before advantages.

    With ``L_max = max_completion_length`` and ``L_cache = buffer_len``::

        R_len(L) = 0                                   if L ≤ L_max − L_cache
                 = ((L_max − L_cache) − L) / L_cache   if L_max − L_cache < L ≤ L_max
                 = −1                                  if L > L_max

    Args:
        lengths: ``[N]`` completion lengths in tokens (integer or float).
        max_completion_length: ``L_max`` in tokens, ``>= 1``.
        buffer_len: ``L_cache`` in tokens, ``1 <= buffer_len <= max_completion_length``.
        factor: ``overlong_penalty_factor``; the result is ``factor · R_len``.

    Returns:
        ``[N]`` float penalties in reward units, in ``[−factor, 0]`` for ``factor >= 0``.

    Raises:
        ValueError: ``lengths`` not 1-D or negative, or ``buffer_len`` / ``max_completion_length``
            out of range.

    Source: DAPO (Yu et al. 2025) §3.4, Eq. 13; grpo_core.md §9.3.
    """
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1:
        raise ValueError(f"overlong_penalty: lengths must be 1-D [N], got shape {tuple(lengths.shape)}")
    if max_completion_length < 1:
        raise ValueError(f"overlong_penalty: max_completion_length must be >= 1, got {max_completion_length}")
    if not 1 <= buffer_len <= max_completion_length:
        raise ValueError(
            f"overlong_penalty: buffer_len must be in [1, max_completion_length={max_completion_length}], "
            f"got {buffer_len}"
        )
    if lengths.numel() and bool((lengths < 0).any()):
        raise ValueError("overlong_penalty: lengths must be >= 0")
    dt = lengths.dtype if lengths.is_floating_point() else torch.get_default_dtype()
    L = lengths.to(torch.float64)
    start = float(max_completion_length - buffer_len)
    ramp = (start - L) / float(buffer_len)
    r = torch.where(L <= start, torch.zeros_like(L), ramp)
    r = torch.where(L > max_completion_length, torch.full_like(L, -1.0), r)
    return (r * factor).to(dt)

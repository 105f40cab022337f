"""grpo_core.md §3, §9.3, §11, acceptance §14.1 and §14.6 (reward side).

Hand calculation used below (float64 rewards):

    group 0 (ids 0): r = [1, 2, 3]        mean 2, deviations [-1, 0, 1], Σd² = 2
        unbiased std = sqrt(2/2) = 1 ;  population std = sqrt(2/3) = 0.816496580927726
    group 1 (ids 1): r = [0, 0, 4, 4]     mean 2, deviations [-2, -2, 2, 2], Σd² = 16
        unbiased std = sqrt(16/3) = 4/√3 = 2.309401076758503 ; population std = 2
    whole batch (7 rewards): mean 14/7 = 2, Σd² = 1+0+1+4+4+4+4 = 18, unbiased std = sqrt(18/6) = √3
"""

import math
import random
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.core import (
    check_group_sizes,
    group_stats,
    grpo_advantages,
    mean_group_std,
    overlong_penalty,
    rloo_advantages,
    zero_std_group_fraction,
)

R = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 4.0, 4.0], dtype=torch.float64)
G = torch.tensor([0, 0, 0, 1, 1, 1, 1])


def close(a, b, tol=1e-7):
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.allclose(a, b, rtol=0, atol=tol), (a, b)


# ---------------------------------------------------------------- hand values, each scaling


def test_group_scaling_hand_values_no_eps():
    s3 = math.sqrt(3) / 2  # 2 / (4/√3)
    close(grpo_advantages(R, G, adv_eps=0.0), [-1, 0, 1, -s3, -s3, s3, s3])


def test_group_scaling_hand_values_with_eps():
    # (r - mean) / (std + 1e-6): group 0: ±1/1.000001 ; group 1: ±2/2.309402076758503
    a0 = 1 / 1.000001
    a1 = 2 / 2.309402076758503
    close(grpo_advantages(R, G, adv_eps=1e-6), [-a0, 0, a0, -a1, -a1, a1, a1], tol=1e-12)
    # the TRL epsilon
    close(grpo_advantages(R, G, adv_eps=1e-4)[0], -1 / 1.0001, tol=1e-12)


def test_group_scaling_population_std():
    # group 0 population std sqrt(2/3) -> ±1/0.816496580927726 = ±1.224744871391589; group 1 std 2 -> ±1
    a0 = 1.224744871391589
    close(grpo_advantages(R, G, adv_eps=0.0, std_unbiased=False), [-a0, 0, a0, -1, -1, 1, 1])


def test_batch_scaling_hand_values():
    # group mean, batch std √3 = 1.7320508075688772
    a = 0.5773502691896258  # 1/√3
    b = 1.1547005383792515  # 2/√3
    close(grpo_advantages(R, G, scale_rewards="batch", adv_eps=0.0), [-a, 0, a, -b, -b, b, b])


def test_none_scaling_is_dr_grpo_centering():
    close(grpo_advantages(R, G, scale_rewards="none"), [-1, 0, 1, -2, -2, 2, 2])


def test_rloo_hand_values():
    # group 0: 1-(2+3)/2=-1.5, 2-(1+3)/2=0, 3-(1+2)/2=1.5
    # group 1: 0-(0+4+4)/3=-8/3, 4-(0+0+4)/3=8/3
    e = 8 / 3
    close(rloo_advantages(R, G), [-1.5, 0, 1.5, -e, -e, e, e])
    # registry keywords are accepted and ignored
    close(rloo_advantages(R, G, scale_rewards="group", adv_eps=0.5, std_unbiased=False), rloo_advantages(R, G))


def test_group_stats_hand_values():
    mean, std = group_stats(R, G)
    close(mean, [2] * 7)
    close(std, [1, 1, 1] + [4 / math.sqrt(3)] * 4)
    _, pstd = group_stats(R, G, unbiased=False)
    close(pstd, [math.sqrt(2 / 3)] * 3 + [2] * 4)
    m1, s1 = group_stats(torch.tensor([5.0, 1.0, 3.0]), torch.tensor([0, 1, 1]))
    close(m1, [5, 2, 2])
    close(s1, [0, math.sqrt(2), math.sqrt(2)])  # size-1 group: std 0


def test_float32_and_int_rewards_dtype():
    a32 = grpo_advantages(R.float(), G, adv_eps=0.0)
    assert a32.dtype == torch.float32
    ai = grpo_advantages(torch.tensor([1, 2, 3]), torch.tensor([0, 0, 0]), adv_eps=0.0)
    assert ai.dtype == torch.get_default_dtype()
    close(ai, [-1, 0, 1])


# ---------------------------------------------------------------- zero variance, singletons


@pytest.mark.parametrize("value", [0.1, 0.7, 1 / 3, -2.5e7, 0.0])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_zero_variance_group_is_exactly_zero(value, scale):
    # 0.1 * 3 / 3 != 0.1 in floating point: exactness must not depend on the mean's rounding
    r = torch.tensor([value] * 5 + [0.0, 1.0], dtype=torch.float32)
    g = torch.tensor([4] * 5 + [9, 9])
    for est in (lambda: grpo_advantages(r, g, scale_rewards=scale, adv_eps=0.0), lambda: rloo_advantages(r, g)):
        a = est()
        assert torch.equal(a[:5], torch.zeros(5)), a
        assert (a[5:] != 0).all()


def test_all_constant_batch_with_zero_eps_has_no_nan():
    r = torch.ones(4)
    g = torch.tensor([0, 0, 1, 1])
    for scale in ("group", "batch", "none"):
        assert torch.equal(grpo_advantages(r, g, scale_rewards=scale, adv_eps=0.0), torch.zeros(4))


def test_singleton_group_zero_and_warns():
    r = torch.tensor([1.0, 0.0, 1.0, 5.0])
    g = torch.tensor([0, 0, 0, 7])
    with pytest.warns(UserWarning, match=r"size 1.*group_id \[7\]"):
        a = grpo_advantages(r, g)
    assert a[3] == 0.0
    assert a[0] > 0 and a[1] < 0
    with pytest.warns(UserWarning, match="size 1"):
        assert rloo_advantages(r, g)[3] == 0.0


def test_no_warning_without_singletons():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grpo_advantages(R, G)
        rloo_advantages(R, G)


# ---------------------------------------------------------------- group identity, not position


def test_interleaved_noncontiguous_ids_equal_contiguous():
    # the same two groups as R/G, interleaved and with arbitrary id values
    order = [3, 0, 4, 1, 5, 2, 6]
    r = R[order]
    g = torch.tensor([-5, 100, -5, 100, -5, 100, -5])
    expected = grpo_advantages(R, G)[order]
    close(grpo_advantages(r, g), expected, tol=0)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 5), min_size=1, max_size=5),
    seed=st.integers(0, 2**31 - 1),
    scale=st.sampled_from(["group", "batch", "none"]),
    est=st.sampled_from(["grpo", "rloo"]),
)
def test_shuffle_invariance(sizes, seed, scale, est):
    rng = random.Random(seed)
    g = torch.tensor([k for k, s in enumerate(sizes) for _ in range(s)])
    r = torch.tensor([float(rng.choice([0, 0.5, 1, 2])) for _ in range(len(g))], dtype=torch.float64)
    fn = {"grpo": grpo_advantages, "rloo": rloo_advantages}[est]
    a = fn(r, g, scale_rewards=scale, adv_eps=1e-6, std_unbiased=True)
    perm = list(range(len(g)))
    rng.shuffle(perm)
    p = torch.tensor(perm)
    a_perm = fn(r[p], g[p], scale_rewards=scale, adv_eps=1e-6, std_unbiased=True)
    assert torch.allclose(a_perm, a[p], rtol=0, atol=1e-12)
    # group-centred: every group's advantages sum to 0
    for k in range(len(sizes)):
        assert abs(float(a[g == k].sum())) < 1e-9


# ---------------------------------------------------------------- group-size assertion


def test_check_group_sizes_accepts_correct_batches():
    check_group_sizes(torch.tensor([3, 3, 8, 8, 1, 1]), 2)
    check_group_sizes(torch.tensor([3, 3, 8, 8]), None)
    check_group_sizes(torch.tensor([], dtype=torch.long), 4)


def test_check_group_sizes_names_bad_group():
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2])  # group 1 mislabelled: 3 members
    with pytest.raises(ValueError, match=r"group_id=1 has 3 completions.*") as e:
        check_group_sizes(g, 4)
    assert "4" in str(e.value)
    with pytest.raises(ValueError, match=r"group_id=1 has 3 completions"):
        check_group_sizes(g, None)  # most common size (4) is the reference


def test_check_group_sizes_rejects_bad_args():
    with pytest.raises(ValueError):
        check_group_sizes(torch.tensor([0.0, 0.0]), 2)
    with pytest.raises(ValueError):
        check_group_sizes(torch.tensor([0, 0]), 0)


# ---------------------------------------------------------------- registry and validation


def test_invalid_inputs_raise():
    with pytest.raises(ValueError, match="scale_rewards"):
        grpo_advantages(R, G, scale_rewards="std")
    with pytest.raises(ValueError, match="adv_eps"):
        grpo_advantages(R, G, adv_eps=-1.0)
    with pytest.raises(ValueError, match="shape"):
        grpo_advantages(R, G[:3])
    with pytest.raises(ValueError, match="finite"):
        grpo_advantages(torch.tensor([1.0, float("nan")]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="integer"):
        grpo_advantages(R, G.double())


def test_empty_batch():
    assert grpo_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)
    assert zero_std_group_fraction(torch.zeros(0), torch.zeros(0, dtype=torch.long)) == 0.0


# ---------------------------------------------------------------- §14.6: truncation keeps rewards in stats


def test_truncated_rewards_still_count_in_group_stats():
    # group [1, 0, 0, 1], the last completion truncated. Advantages are computed on all four:
    # mean 0.5, unbiased std sqrt(4*0.25/3) = 0.5773502691896258 -> A = ±0.8660254037844386.
    # Had the truncated row been dropped: [1, 0, 0] -> mean 1/3, std sqrt(1/3) -> A_0 = 1.1547005383792517
    r = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    g = torch.zeros(4, dtype=torch.long)
    a = grpo_advantages(r, g, adv_eps=0.0)
    close(a, [0.8660254037844386, -0.8660254037844386, -0.8660254037844386, 0.8660254037844386])
    assert abs(float(a[0]) - 1.1547005383792517) > 0.2


# ---------------------------------------------------------------- metrics


def test_zero_std_fraction_and_mean_group_std():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 2.0, 5.0])
    g = torch.tensor([0, 0, 1, 1, 2, 2, 2, 3])
    # groups: {1,1} const, {0,1} not, {2,2,2} const, {5} singleton (std 0) -> 3/4
    assert zero_std_group_fraction(r, g) == pytest.approx(0.75, abs=1e-12)
    # stds: 0, sqrt(0.5)=0.7071067811865476, 0, 0 -> mean 0.1767766952966369
    assert mean_group_std(r, g) == pytest.approx(0.1767766952966369, abs=1e-12)
    # R/G: stds 1 and 4/√3 -> (1 + 2.309401076758503)/2
    assert mean_group_std(R, G) == pytest.approx(1.6547005383792515, abs=1e-12)


# ---------------------------------------------------------------- DAPO soft overlong (§9.3)


def test_overlong_penalty_hand_values():
    # L_max = 20, L_cache = 4: ramp starts after 16 tokens
    L = torch.tensor([0, 10, 16, 17, 18, 19, 20, 21, 40])
    expected = [0, 0, 0, -0.25, -0.5, -0.75, -1, -1, -1]
    close(overlong_penalty(L, max_completion_length=20, buffer_len=4), expected)
    close(overlong_penalty(L, max_completion_length=20, buffer_len=4, factor=0.5), [x / 2 for x in expected])
    # DAPO's values: L_max 20480, L_cache 4096, L = 18432 -> (16384 - 18432)/4096 = -0.5
    close(overlong_penalty(torch.tensor([18432]), max_completion_length=20480, buffer_len=4096), [-0.5])
    assert overlong_penalty(L, max_completion_length=20, buffer_len=4).dtype == torch.get_default_dtype()


def test_overlong_penalty_validation():
    L = torch.tensor([3])
    with pytest.raises(ValueError):
        overlong_penalty(L, max_completion_length=20, buffer_len=0)
    with pytest.raises(ValueError):
        overlong_penalty(L, max_completion_length=20, buffer_len=21)
    with pytest.raises(ValueError):
        overlong_penalty(torch.tensor([-1]), max_completion_length=20, buffer_len=4)
    with pytest.raises(ValueError):
        overlong_penalty(torch.tensor([[1]]), max_completion_length=20, buffer_len=4)

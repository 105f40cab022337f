"""rlvr.compare.stats_rules against hand-computed values, closed forms and a fixed-seed simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlvr.compare import stats_rules as sr


def t2_cdf(t: float) -> float:
    """Student t CDF with 2 degrees of freedom in closed form: 1/2 + t / (2 √(2 + t²))."""
    return 0.5 + t / (2 * math.sqrt(2 + t * t))


def test_paired_t_by_hand_with_the_closed_form_df2_cdf():
    d = [0.0, 0.02, 0.04]  # mean 0.02, sd 0.02, se 0.02 / √3
    se = 0.02 / math.sqrt(3)
    t, p = sr.paired_t(d)
    assert t == pytest.approx(0.02 / se) and p == pytest.approx(1 - t2_cdf(0.02 / se))
    t, p = sr.paired_t(d, alternative="less", mu=0.05)
    assert t == pytest.approx(-0.03 / se) and p == pytest.approx(t2_cdf(-0.03 / se))
    assert sr.paired_t(d, alternative="two-sided")[1] == pytest.approx(2 * (1 - t2_cdf(0.02 / se)))
    # zero spread: a constant difference is certain, not NaN
    assert sr.paired_t([0.1, 0.1, 0.1]) == (math.inf, 0.0)
    assert sr.paired_t([0.1, 0.1], alternative="less")[1] == 1.0 and sr.paired_t([0.0, 0.0])[1] == 1.0
    with pytest.raises(ValueError, match="at least 2"):
        sr.paired_t([0.3])
    with pytest.raises(ValueError, match="alternative"):
        sr.paired_t([0.3, 0.4], alternative="up")


def test_tost_by_hand():
    d = [0.0, 0.02, 0.04]
    se = 0.02 / math.sqrt(3)
    p, p_lo, p_hi = sr.tost(d, 0.05)
    assert p_lo == pytest.approx(1 - t2_cdf(0.07 / se)) and p_hi == pytest.approx(t2_cdf(-0.03 / se))
    assert p == pytest.approx(0.0608, abs=5e-4) and p == max(p_lo, p_hi)
    assert sr.tost(d, 0.1)[0] < 0.05 < sr.tost(d, 0.03)[0]  # a wider margin is easier to show
    with pytest.raises(ValueError, match="margin"):
        sr.tost(d, 0.0)


def test_wilcoxon_exact_p_by_counting_sign_patterns():
    # W+ = 1 + 2 + 4 + 5 = 12; of the 2^5 = 32 equally likely sign patterns, those with W+ >= 12 are the
    # complements of the rank subsets summing to <= 3: {}, {1}, {2}, {3}, {1, 2} -> p = 5/32
    assert sr.wilcoxon_signed_rank([0.1, 0.2, -0.3, 0.4, 0.5]) == (12.0, pytest.approx(5 / 32))
    assert sr.wilcoxon_signed_rank([0.3, 0.1, 0.2, 0.5, 0.4])[1] == pytest.approx(1 / 32)  # all positive
    assert sr.wilcoxon_signed_rank([0.3, 0.1, 0.2, 0.5, 0.4], alternative="less")[1] == pytest.approx(1.0)
    assert sr.wilcoxon_signed_rank([0.0, 0.0, 0.0]) == (0.0, 1.0)


def test_bootstrap_interval_is_seeded_and_brackets_the_mean():
    d = [0.065, 0.003, 0.499, 0.054, 0.043, 0.02, 0.11, 0.07]
    a = sr.bootstrap_mean_ci(d, seed=3)
    assert a == sr.bootstrap_mean_ci(d, seed=3) and a[2] == "BCa"
    assert a[0] < float(np.mean(d)) < a[1]
    lo, hi, how = sr.bootstrap_mean_ci(d, method="percentile", n_resamples=2000)
    assert how == "percentile" and min(d) <= lo < hi <= max(d)
    assert sr.bootstrap_mean_ci([0.2, 0.2, 0.2]) == (0.2, 0.2, "constant")


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 (m = 4): 4·0.005 = 0.02, 3·0.01 = 0.03, 2·0.03 = 0.06, max(0.06, 1·0.04) = 0.06
    assert sr.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    out = sr.holm([0.3, math.nan, 0.6])  # NaN: not tested, not counted (m = 2)
    assert out[0] == pytest.approx(0.6) and math.isnan(out[1]) and out[2] == pytest.approx(0.6)
    assert sr.holm([0.9, 0.8]) == [1.0, 1.0]


def test_power_against_the_known_value_and_a_fixed_seed_simulation():
    # two-sided one-sample t, n = 10, standardised effect 1, α = 0.05: 0.8031 (R power.t.test: 0.8030962
    # without the opposite tail, which adds ~7e-7)
    assert sr.paired_t_power(1.0, 1.0, 10, alternative="two-sided") == pytest.approx(0.803097, abs=2e-6)
    # simulation: 8 seeds, true gain 0.05, sd of the differences 0.05, one-sided α 0.05
    rng = np.random.default_rng(0)
    x = rng.normal(0.05, 0.05, size=(40_000, 8))
    t = x.mean(1) / (x.std(1, ddof=1) / math.sqrt(8))
    crit = 1.894579  # t_{0.95, 7} (standard table)
    assert sr.paired_t_power(0.05, 0.05, 8) == pytest.approx(float((t > crit).mean()), abs=0.01)
    assert sr.paired_t_power(0.0, 0.05, 8) == pytest.approx(0.05)  # no effect: the test's size
    mde = sr.min_detectable_effect(0.05, 8)
    assert sr.paired_t_power(mde, 0.05, 8) == pytest.approx(0.8) and mde == pytest.approx(0.98 * 0.05, abs=1e-3)
    assert sr.min_detectable_effect(1.0, 5) == pytest.approx(1.36, abs=0.01)
    with pytest.raises(ValueError, match="sd > 0"):
        sr.paired_t_power(0.1, 0.0, 8)


def test_t_bound_by_hand():
    d = [0.0, 0.02, 0.04]
    assert sr.t_bound(d, level=0.95) == pytest.approx(0.02 + 2.919986 * 0.02 / math.sqrt(3))  # t_{0.95, 2}
    assert sr.t_bound(d, level=0.95, side="lower") == pytest.approx(0.02 - 2.919986 * 0.02 / math.sqrt(3))


def test_regime_counts():
    grpo = [0.569, 0.666, 0.000, 0.723, 0.675]  # v2l, lr 3e-4, start 0.316
    r = sr.regime_counts(grpo, start=0.316)
    assert (r["collapsed"], r["took_off"], r["text"]) == (1, 4, "1/5 collapsed, 4/5 took off")
    # start - 0.10 counts as collapse too; without a start only the absolute floor applies
    assert sr.regime_counts([0.2, 0.3], start=0.316)["collapsed"] == 1
    assert sr.regime_counts([0.2, 0.3])["collapsed"] == 0
    strict = sr.Regimes(collapse_below=0.5, collapse_drop=None, takeoff_above=0.7, takeoff_gain=None)
    assert sr.regime_counts(grpo, 0.316, strict)["text"] == "1/5 collapsed, 1/5 took off"


def test_unpaired_seeds_are_a_clear_error():
    p = sr.pair_by_seed({0: 0.5, 1: 0.6, 2: float("nan")}, {1: 0.4, 0: 0.3})
    assert p.seeds == (0, 1) and list(p.arm) == [0.5, 0.6] and list(p.ref) == [0.3, 0.4]
    with pytest.raises(sr.UnpairedSeedsError, match=r"arm lacks \[\], reference lacks \[2\]"):
        sr.pair_by_seed({0: 0.5, 1: 0.6, 2: 0.7}, {0: 0.3, 1: 0.4}, name="c")


def test_largest_stable_rate_rule():
    finals = {3e-5: [0.35, 0.36, 0.34], 1e-4: [0.43, 0.41, 0.45], 3e-4: [0.67, 0.0, 0.69], 1e-3: [0.0, 0.0, 0.0]}
    assert sr.largest_stable_rate(finals, start=0.316) == (1e-4, True)  # 3e-4 lost one seed of three
    assert sr.largest_stable_rate({1e-4: [0.2, 0.3]}, start=0.316) == (1e-4, False)  # 0.2 < start - 0.1
    with pytest.raises(ValueError, match="no finished"):
        sr.largest_stable_rate({1e-4: []})


def test_compare_report_counts_collapsed_seeds_beside_the_means(tmp_path):
    import json

    from rlvr.compare.report import summary_table

    for arm, vals in {"initial": [0.3, 0.3, 0.3], "grpo": [0.6, 0.0, 0.62], "fbos": [0.5, 0.45, 0.4]}.items():
        for s, v in enumerate(vals):
            (tmp_path / arm / f"seed{s}").mkdir(parents=True)
            (tmp_path / arm / f"seed{s}" / "result.json").write_text(json.dumps({"eval/pass@1": v}))
    table, summary = summary_table(tmp_path, ["initial", "grpo", "fbos"], [0, 1, 2])
    assert "collapsed / took off" in table.splitlines()[0]
    assert table.splitlines()[3].endswith("| 1/3 / 2/3 |")  # grpo: 0.0 collapsed, 0.6 and 0.62 > 0.3 + 0.25
    assert summary["fbos"]["regimes"]["text"] == "0/3 collapsed, 0/3 took off"

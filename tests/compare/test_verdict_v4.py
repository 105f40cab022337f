"""The v4 verdict rule (rlvr.compare.verdict_v4; issue 38 item 3): one line (the effect of interest) for both
directions, Holm over the family on every side, TOST read at 90 %, checked on hand-computed values."""

from __future__ import annotations

import math

import pytest

from rlvr.compare.claims import Claim, ClaimsFile, analyse, decide, evaluate
from rlvr.compare.verdict_v4 import decide_v4, holm_sides, v4_stats


def _claim(direction="higher", **kw):
    return Claim(**{"paper": "P", "claim": "c", "compare": "x", "arm": "a", "metric": "m", "direction": direction,
                    **kw})


def test_holm_over_a_family_by_hand_on_both_sides():
    # p_reproduce 0.01, 0.04, 0.03 -> sorted 0.01*3 = 0.03, 0.03*2 = 0.06, max(0.06, 0.04*1) = 0.06
    # p_refute 0.5, 0.02, 0.9      -> sorted 0.02*3 = 0.06, max(0.06, 0.5*2 = 1.0) = 1.0, max(1.0, 0.9) = 1.0
    rows = [{"p_reproduce": 0.01, "p_refute": 0.5, "p_positive": 0.001},
            {"p_reproduce": 0.04, "p_refute": 0.02, "p_positive": None},
            {"p_reproduce": 0.03, "p_refute": 0.9, "p_positive": 0.02},
            {"p_reproduce": 0.001, "p_refute": 0.001}]  # not in the family: untouched
    holm_sides(rows, [0, 1, 2])
    assert [rows[i]["p_holm_reproduce"] for i in range(3)] == pytest.approx([0.03, 0.06, 0.06])
    assert [rows[i]["p_holm_refute"] for i in range(3)] == pytest.approx([1.0, 0.06, 1.0])
    # positive: only rows 0 and 2 have one (m = 2): 0.001*2 = 0.002, max(0.002, 0.02*1) = 0.02
    assert rows[0]["p_holm_positive"] == pytest.approx(0.002) and rows[2]["p_holm_positive"] == pytest.approx(0.02)
    assert "p_holm_positive" not in rows[1] and "p_holm_reproduce" not in rows[3]
    iv = {"interval90": [0.0, 0.1]}
    assert decide_v4("higher", {**rows[0], **iv}, primary=True, effect=0.05)[0] == "reproduced"  # 0.03 < 0.05
    assert decide_v4("higher", {**rows[2], **iv}, primary=True, effect=0.05)[0] == "inconclusive"  # 0.06
    assert decide_v4("higher", {**rows[2], **iv}, primary=False, effect=0.05)[0] == "reproduced"  # raw 0.03


def test_interval_is_the_90_percent_t_interval_by_hand():
    d = [0.10, 0.12, 0.14, 0.16]  # mean 0.13, sd sqrt(0.002 / 3) = 0.0258199, se 0.0129099
    st = v4_stats("higher", d, effect=0.05, lo=0, hi=0)
    half = 2.353363 * 0.0129099  # t_{0.95, 3}
    assert st["interval90"] == pytest.approx([0.13 - half, 0.13 + half], abs=1e-6)
    # t against the effect: (0.13 - 0.05) / 0.0129099 = 6.19677 on 3 df; the t(3) tail in closed form,
    # x = t / sqrt(3) = 3.577709: p = (atan(1 / x) - x / (1 + x^2)) / pi = (0.2725516 - 0.2592543) / pi = 0.0042327
    assert st["p_reproduce"] == pytest.approx(0.0042327, abs=1e-6)
    assert st["p_refute"] == pytest.approx(1 - 0.0042327, abs=1e-6)


def test_similar_small_gains_get_the_same_label():
    """The v3 rule called a +0.03 gain 'reproduced' when shown > 0 and a similar one 'refuted' when its upper
    bound fell under the effect; v4 calls both what they are: positive but below the effect of interest."""
    ref = [0.43, 0.41, 0.47, 0.44, 0.39, 0.45, 0.42, 0.46]
    noise = [0.004, -0.006, 0.002, 0.007, -0.003, 0.001, -0.005, 0.000]
    out = []
    for gain in (0.030, 0.033):
        c = _claim(effect=0.05)
        st = analyse(c, dict(enumerate(r + gain + e for r, e in zip(ref, noise))), dict(enumerate(ref)))
        out.append(decide(c, st, None)[0])
    assert out == ["positive, below effect of interest"] * 2
    c = _claim(effect=0.05)
    big = analyse(c, dict(enumerate(r + 0.10 + e for r, e in zip(ref, noise))), dict(enumerate(ref)))
    assert decide(c, big, None)[0] == "reproduced"
    loss = analyse(c, dict(enumerate(r - 0.03 + e for r, e in zip(ref, noise))), dict(enumerate(ref)))
    assert decide(c, loss, None)[0] == "refuted"
    wide = analyse(c, dict(enumerate(r + 0.05 + 8 * e for r, e in zip(ref, noise))), dict(enumerate(ref)))
    assert decide(c, wide, None)[0] == "inconclusive"


def test_tost_reads_the_90_percent_interval():
    # d = 0.03 ± noise: the 90 % interval lies inside ± 0.05, the 95 % one crosses 0.05 (v3 printed that one)
    d = [0.03, 0.005, 0.055, 0.03, 0.01, 0.05]
    mean, sd = 0.03, math.sqrt(sum((x - 0.03) ** 2 for x in d) / 5)
    hi90, hi95 = mean + 2.015048 * sd / math.sqrt(6), mean + 2.570582 * sd / math.sqrt(6)
    assert hi90 < 0.05 < hi95
    st = v4_stats("match", d, effect=None, lo=-0.05, hi=0.05)
    assert st["interval90"][1] == pytest.approx(hi90, abs=1e-6) and st["p_reproduce"] < 0.05
    v, text = decide_v4("match", st, primary=False, lo=-0.05, hi=0.05)
    assert v == "reproduced" and "equivalent" in text and "90 %" in text
    far = v4_stats("match", [x + 0.1 for x in d], effect=None, lo=-0.05, hi=0.05)
    assert decide_v4("match", far, primary=False, lo=-0.05, hi=0.05)[0] == "refuted"


def test_claims_file_rule_switch(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("rule: v3\ntitle: t\nclaims:\n  - {paper: P, claim: c, compare: x, arm: a, metric: m}\n")
    assert ClaimsFile.load(p).claims[0].rule_version == "v3"
    p.write_text("title: t\nclaims:\n  - {paper: P, claim: c, compare: x, arm: a, metric: m}\n")
    assert ClaimsFile.load(p).claims[0].rule_version == "v4"
    p.write_text("rule: v9\ntitle: t\nclaims: []\n")
    with pytest.raises(Exception, match="rule must be one of v3, v4"):
        ClaimsFile.load(p)


def test_evaluate_v4_holm_family(tmp_path):
    import json

    ref = [0.43, 0.41, 0.47, 0.44, 0.39, 0.45, 0.42, 0.46]
    noise = [0.004, -0.006, 0.002, 0.007, -0.003, 0.001, -0.005, 0.000]
    rows = [{"arm": "grpo", "seed": s, "eval/pass@1": r} for s, r in enumerate(ref)]
    rows += [{"arm": "a", "seed": s, "eval/pass@1": r + 0.10 + e} for s, (r, e) in enumerate(zip(ref, noise))]
    rows += [{"arm": "b", "seed": s, "eval/pass@1": r + 0.02 + e} for s, (r, e) in enumerate(zip(ref, noise))]
    f = tmp_path / "runs.json"
    f.write_text(json.dumps({"m": rows}))
    cl = [Claim(paper="P", claim=a, compare=f"{f}#m", arm=a, metric="eval/pass@1", primary=True, effect=0.05)
          for a in ("a", "b")]
    out = evaluate(cl)
    p = sorted([(out[0]["p_reproduce"], 0), (out[1]["p_reproduce"], 1)])
    assert out[p[0][1]]["p_holm_reproduce"] == pytest.approx(min(1, 2 * p[0][0]))
    assert out[p[1][1]]["p_holm_reproduce"] == pytest.approx(max(min(1, 2 * p[0][0]), p[1][0]))
    # a: +0.10 clears 0.05; b: +0.02 is shown above 0 and below 0.05 (Holm on both sides)
    assert [r["verdict"] for r in out] == ["reproduced", "positive, below effect of interest"]

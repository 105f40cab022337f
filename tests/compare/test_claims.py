"""rlvr.compare.claims (paired verdict rules on planted data, the claims table) and the compare harness's
held-out learning curve (eval.curve_points) and per-level pass@k."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from rlvr.compare.claims import Claim, ClaimsFile, analyse, decide, evaluate, write_claims
from rlvr.compare.claim_values import arm_values, t_interval
from rlvr.compare.claims import VERDICTS
from rlvr.compare.stats_rules import UnpairedSeedsError
from rlvr.compare.harness import run_compare
from rlvr.compare.spec import Arm, CompareSpec
from rlvr.compare.budget import Budget
from rlvr.errors import ConfigError
from rlvr.tasks.base import Problem
from rlvr.testing import ToyTask

from tests.compare.test_harness import COMMON


def test_t_interval_by_hand():  # kept for benchmarks/default_seeds_table.py
    m, h, n = t_interval([0.1, 0.2, 0.3, 0.4, 0.5, float("nan")])
    sd = statistics.stdev([0.1, 0.2, 0.3, 0.4, 0.5])  # 0.158114
    assert (n, m) == (5, pytest.approx(0.3))
    assert h == pytest.approx(2.776 * sd / math.sqrt(5)) and h == pytest.approx(0.19630, abs=1e-5)
    assert t_interval([0.4])[1] == math.inf and t_interval([])[2] == 0
    assert t_interval([1.0] * 40)[1] == 0.0  # df > 30: normal quantile, zero spread


def _c(direction, **kw):  # the v3 rule (issue 29): these tests keep the v3 tables checkable
    return Claim(**{"paper": "P", "claim": "c", "compare": "x", "arm": "a", "metric": "m", "direction": direction,
                    "rule_version": "v3", **kw})


def _seeds(values):
    return dict(enumerate(values))


def _decide(claim, arm, ref, p_used=None):
    st = analyse(claim, _seeds(arm), _seeds(ref))
    return decide(claim, st, p_used)[0], st


REF8 = [0.43, 0.41, 0.47, 0.44, 0.39, 0.45, 0.42, 0.46]
NOISE8 = [0.004, -0.006, 0.002, 0.007, -0.003, 0.001, -0.005, 0.000]


def test_planted_difference_is_higher_and_a_planted_loss_is_refuted():
    up = [r + 0.10 + e for r, e in zip(REF8, NOISE8)]
    v, st = _decide(_c("higher", effect=0.05), up, REF8)
    assert v == "reproduced" and st["d"]["mean"] == pytest.approx(0.10, abs=1e-3) and st["n"] == 8
    assert st["d"]["boot_ci"][0] > 0.09 and st["power"] == pytest.approx(1.0)
    down = [r - 0.10 + e for r, e in zip(REF8, NOISE8)]
    v, st = _decide(_c("higher"), down, REF8)
    assert v == "refuted" and st["bounds"]["upper"] < 0
    assert _decide(_c("lower"), down, REF8)[0] == "reproduced"
    noisy = [r + e * 10 for r, e in zip(REF8, NOISE8)]  # mean difference 0: neither shown nor excluded
    v, st = _decide(_c("higher", effect=0.2), noisy, REF8)
    assert v == "refuted"  # a gain of 0.2 is excluded by the upper bound
    v, st = _decide(_c("higher", effect=0.01), noisy, REF8)
    assert v == "inconclusive" and "mde80" in st


def test_planted_equivalence_matches_within_the_margin_and_not_outside():
    same = [r + e for r, e in zip(REF8, NOISE8)]
    v, st = _decide(_c("match", margin=0.05), same, REF8)
    assert v == "reproduced" and st["p"] < 1e-6
    v, _ = _decide(_c("match", margin=0.05), [r + 0.2 + e for r, e in zip(REF8, NOISE8)], REF8)
    assert v == "refuted"
    # too noisy to call a match (the old rule's "narrow interval" case): inconclusive, not reproduced
    wide = [r + e * 30 for r, e in zip(REF8, NOISE8)]
    assert _decide(_c("match", margin=0.05), wide, REF8)[0] == "inconclusive"
    assert _c("match", tolerance=0.02).margin == 0.02  # the old key still reads


def test_a_collapsed_reference_seed_no_longer_decides_higher():
    """The v2l artefact (docs/results/replication.md §0.4): FBOS-RL passed the old rule by 0.002 because
    GRPO's seed 2 collapsed to 0; paired over seeds the evidence is inconclusive and the collapse is a count."""
    fbos = [0.63375, 0.66875, 0.49875, 0.7775, 0.7175]  # docs/results/replication/v2l/runs.json, v2l_main
    grpo = [0.56875, 0.66625, 0.0, 0.7225, 0.675]
    m, h, _ = t_interval(fbos)
    old_rule_passes = m - h > statistics.fmean(grpo)  # the old rule: arm's CI low > reference *mean*
    assert old_rule_passes and 0 < (m - h) - statistics.fmean(grpo) < 0.003  # CI low 0.5295 vs mean 0.5268
    claim = _c("higher", primary=True, effect=0.05, start=0.316, metric="eval/pass@1")
    v, st = _decide(claim, fbos, grpo)
    assert v == "inconclusive" and st["p_t"] == pytest.approx(0.1115, abs=1e-3)
    assert st["ref_stats"]["regimes"]["text"].startswith("1/5 collapsed")
    assert st["arm_stats"]["regimes"]["collapsed"] == 0
    assert st["p_wilcoxon"] == pytest.approx(1 / 32)  # every seed favours FBOS-RL: the robust test is reported


def test_faster_band_and_times_rules():
    assert _decide(_c("faster"), [10.0, 11.0, 10.5], [20.0, 21.0, 19.0])[0] == "reproduced"  # below 20 / 1.5
    assert _decide(_c("faster"), [18.0, 19.0, 17.5], [20.0, 21.0, 19.0])[0] == "refuted"  # clearly above ref / 1.5
    assert _decide(_c("faster"), [15.0, 14.0, 16.0], [20.0, 21.0, 19.0])[0] == "inconclusive"  # 3 seeds, near it
    v, st = _decide(_c("band", lo=0.5, hi=2.0), [1.0, 1.1, 0.9, 1.05], [])
    assert v == "reproduced" and st["n"] == 4
    assert _decide(_c("band", lo=0.5, hi=2.0), [2.6, 2.7, 2.5, 2.65], [])[0] == "refuted"
    assert _decide(_c("higher", times=1.4), [1.5, 1.52, 1.49], [1.0, 1.01, 0.99])[0] == "reproduced"
    assert _decide(_c("higher", times=1.4), [1.3, 1.31, 1.29], [1.0, 1.01, 0.99])[0] == "refuted"


def test_untestable_and_unpaired_and_bad_claims():
    assert _decide(_c("higher"), [0.5], [0.4])[0] == "untestable here"
    assert _decide(_c("higher"), [], [])[0] == "untestable here"
    v, st = _decide(_c("higher", untestable="the veto never fires at this scale"), [0.5, 0.6], [0.4, 0.5])
    assert v == "untestable here" and "veto" in decide(_c("higher", untestable="veto"), st, None)[1]
    with pytest.raises(UnpairedSeedsError, match="reference lacks"):
        analyse(_c("higher"), {0: 0.5, 1: 0.6, 2: 0.7}, {0: 0.4, 1: 0.5})
    with pytest.raises(UnpairedSeedsError, match="lacks seeds"):
        analyse(_c("higher", seeds=[0, 1, 5]), {0: 0.5, 1: 0.6}, {0: 0.4, 1: 0.5})
    with pytest.raises(ConfigError, match="direction"):
        _c("sideways")
    with pytest.raises(ConfigError, match="lo and hi"):
        _c("band")
    with pytest.raises(ConfigError, match="test must be"):
        _c("higher", test="z")
    with pytest.raises(ConfigError, match="requires"):
        _c("higher", requires={"metric": "x"})


def _runs_file(tmp_path, rows):
    p = tmp_path / "runs.json"
    p.write_text(json.dumps({"main": rows}))
    return f"{p}#main"


def test_evaluate_holm_adjusts_the_primary_family_and_checks_preconditions(tmp_path):
    rows = [{"arm": "initial", "seed": s, "eval/pass@1": 0.316} for s in range(8)]
    rows += [{"arm": "grpo", "seed": s, "eval/pass@1": r, "veto": 0} for s, r in enumerate(REF8)]
    rows += [{"arm": "a", "seed": s, "eval/pass@1": r + 0.02 + e, "veto": 0}
             for s, (r, e) in enumerate(zip(REF8, NOISE8))]
    rows += [{"arm": "b", "seed": s, "eval/pass@1": r + 0.03 + 2 * e, "veto": 3}
             for s, (r, e) in enumerate(zip(REF8, NOISE8))]
    src = _runs_file(tmp_path, rows)
    claims = [Claim(paper="P", claim=f"{a} higher", compare=src, arm=a, metric="eval/pass@1", primary=True,
                    rule_version="v3")
              for a in ("a", "b")]
    claims.append(Claim(paper="P", claim="b secondary", compare=src, arm="b", metric="eval/pass@1",
                        rule_version="v3"))
    claims.append(Claim(paper="P", claim="a veto", compare=src, arm="a", metric="eval/pass@1", primary=True,
                        rule_version="v3",
                        requires={"metric": "veto", "min": 1}))
    out = evaluate(claims)
    pa, pb = out[0]["p"], out[1]["p"]
    lo, hi = sorted([pa, pb])
    adj = {lo: min(1, 2 * lo), hi: max(min(1, 2 * lo), hi)}  # Holm, m = 2 (the untestable claim is left out)
    assert out[0]["p_holm"] == pytest.approx(adj[pa]) and out[1]["p_holm"] == pytest.approx(adj[pb])
    assert "p_holm" not in out[2] and out[2]["verdict"] == "reproduced"
    assert out[3]["verdict"] == "untestable here" and "precondition" in out[3]["rule"]
    assert out[0]["start"] == pytest.approx(0.316)  # from the comparison's `initial` row
    assert [r["arm"] for r in out] == ["a", "b", "b", "a"]  # the claim's fields are kept beside the statistics
    rows.append({"arm": "a", "seed": 9, "eval/pass@1": 0.5})
    src = _runs_file(tmp_path, rows)
    with pytest.raises(UnpairedSeedsError, match=r"reference lacks \[9\]"):
        evaluate([Claim(paper="P", claim="a", compare=src, arm="a", metric="eval/pass@1")])


def test_holm_families_adjust_separately(tmp_path):
    """Primaries with a ``family`` are adjusted within it: two families of two give each p twice its raw value
    (or the Holm step-up), never four times, and a v4 claim gets its per-side Holm values within its family."""
    rows = [{"arm": "grpo", "seed": s, "eval/pass@1": r} for s, r in enumerate(REF8)]
    for k, a in enumerate("abcd"):
        rows += [{"arm": a, "seed": s, "eval/pass@1": r + 0.01 * (k + 1) + e}
                 for s, (r, e) in enumerate(zip(REF8, NOISE8))]
    src = _runs_file(tmp_path, rows)
    claims = [Claim(paper="P", claim=a, compare=src, arm=a, metric="eval/pass@1", primary=True, rule_version="v3",
                    family="x" if a in "ab" else "y") for a in "abcd"]
    out = evaluate(claims)
    for fam in ((0, 1), (2, 3)):
        ps = [out[i]["p"] for i in fam]
        lo = min(ps)
        for i in fam:
            want = min(1, 2 * lo) if out[i]["p"] == lo else max(min(1, 2 * lo), out[i]["p"])
            assert out[i]["p_holm"] == pytest.approx(want)
    v4 = [Claim(paper="P", claim=a, compare=src, arm=a, metric="eval/pass@1", primary=True, effect=0.05,
                family=a) for a in "ab"]
    for r in evaluate(v4):  # each its own family of one: Holm changes nothing
        assert r["p_holm_reproduce"] == pytest.approx(r["p_reproduce"])


class LeveledToy(ToyTask):
    def problems(self, split):
        return [Problem(p.uid, p.question, p.answer, metadata={"level": 1 + i % 2})
                for i, p in enumerate(super().problems(split))]


def test_curve_points_per_level_pass_at_k_and_claims_table(tmp_path, tiny):
    factory, tok = tiny
    spec = CompareSpec(arms=[Arm.parse("grpo"), Arm.parse("lo=grpo learning_rate=1e-5")], seeds=[0, 1],
                       budget=Budget.parse("rollouts=32"), output_dir=str(tmp_path / "cmp"), common=list(COMMON),
                       eval_num_samples=2, eval_ks=[1, 2], eval_limit=4, eval_curve_points=2)
    run_compare(spec, model_factory=lambda c: (factory(0), tok), task_factory=lambda c: LeveledToy(),
                log=lambda m: None, report=False)
    run = tmp_path / "cmp" / "grpo" / "seed0"
    curve = [json.loads(x) for x in (run / "curve.jsonl").read_text().splitlines()]
    evals = [r for r in curve if "eval/pass@1" in r]
    assert [r["rollouts"] for r in evals] == [16, 32]  # half-way and final
    res = json.loads((run / "result.json").read_text())
    assert res["eval/pass@1"] == evals[-1]["eval/pass@1"]
    assert {"eval/level1/pass@1", "eval/level2/pass@2"} <= set(res)
    # the two levels split the 4 eval problems evenly, so their mean is the overall pass@1
    assert (res["eval/level1/pass@1"] + res["eval/level2/pass@1"]) / 2 == pytest.approx(res["eval/pass@1"])
    assert len(arm_values(tmp_path / "cmp", "grpo", "auc/pass@1")) == 2

    claims = tmp_path / "claims.yaml"
    claims.write_text(json.dumps({"title": "T", "claims": [
        {"paper": "X", "claim": "lo higher", "compare": str(tmp_path / "cmp"), "arm": "lo", "metric": "eval/pass@1"},
        {"paper": "X", "claim": "lo not slower", "compare": str(tmp_path / "cmp"), "arm": "lo", "metric": "wall_s",
         "direction": "faster"}],
        "figures": [{"paper": "X", "compare": str(tmp_path / "cmp"), "arms": ["grpo", "lo"],
                     "path": str(tmp_path / "x.png")}]}))
    md = write_claims(ClaimsFile.load(claims), tmp_path / "claims.md").read_text()
    assert md.count("| X |") == 2 and "n=2" in md and "![X](x.png)" in md
    assert (tmp_path / "x.png").stat().st_size > 1000
    js = json.loads((tmp_path / "claims.json").read_text())
    assert js[0]["verdict"] in VERDICTS and js[0]["seeds"] == [0, 1] and len(js[0]["arm_stats"]["values"]) == 2
    claims.write_text(json.dumps({"claims": [{"paper": "X", "claim": "no metric", "compare": "x", "arm": "a"}]}))
    with pytest.raises(ConfigError, match="no metric"):
        ClaimsFile.load(claims)


def test_curve_value_at_x():
    from rlvr.compare.claim_values import at_x

    curve = [{"step": 8, "eval/pass@1": 0.2}, {"step": 9, "reward/mean": 1.0}, {"step": 16, "eval/pass@1": 0.4}]
    assert at_x(curve, "eval/pass@1", "step", 12) == pytest.approx(0.3)
    assert at_x(curve, "eval/pass@1", "step", 8) == pytest.approx(0.2)
    assert math.isnan(at_x(curve, "eval/pass@1", "step", 20))


def test_curve_value_at_a_matched_level():
    """Hand-computed: pass@1 0.2 at step 8, 0.4 at step 16 -> it reaches 0.3 at step 12; the entropy there
    (logged at 10 and 14: 1.0 and 0.6) interpolates to 0.8."""
    from rlvr.compare.claim_values import at_level, metric_value

    curve = [{"step": 8, "eval/pass@1": 0.2}, {"step": 10, "actor/entropy": 1.0},
             {"step": 14, "actor/entropy": 0.6}, {"step": 16, "eval/pass@1": 0.4}]
    assert at_level(curve, "actor/entropy", "eval/pass@1", 0.3) == pytest.approx(0.8)
    assert metric_value({}, curve, "actor/entropy@eval/pass@1>=0.3") == pytest.approx(0.8)
    assert math.isnan(at_level(curve, "actor/entropy", "eval/pass@1", 0.5))  # never reached
    assert math.isnan(at_level(curve, "actor/entropy", "eval/pass@1", 0.2))  # reached at 8, no entropy there yet
    early = [{"step": 4, "eval/pass@1": 0.5, "actor/entropy": 0.9}] + curve
    assert at_level(early, "actor/entropy", "eval/pass@1", 0.3) == pytest.approx(0.9)  # the first row already there


def test_cli_exits_2_on_unpaired_seeds_and_writes_nothing(tmp_path, capsys):
    from rlvr.compare.claims import main

    rows = [{"arm": "grpo", "seed": s, "eval/pass@1": 0.4} for s in (0, 1)]
    rows += [{"arm": "a", "seed": s, "eval/pass@1": 0.5} for s in (0, 1, 2)]
    cf = tmp_path / "claims.yaml"
    cf.write_text(json.dumps({"claims": [{"paper": "P", "claim": "a higher", "compare": _runs_file(tmp_path, rows),
                                          "arm": "a", "metric": "eval/pass@1"}]}))
    with pytest.raises(SystemExit) as exc:
        main([str(cf), "--out", str(tmp_path / "out.md")])
    assert exc.value.code == 2 and "reference lacks [2]" in capsys.readouterr().err
    assert not (tmp_path / "out.md").exists()

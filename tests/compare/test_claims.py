"""rlvr.compare.claims (t-intervals, verdict rules, the claims table) and the compare harness's
held-out learning curve (eval.curve_points) and per-level pass@k."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from rlvr.compare.claims import Claim, ClaimsFile, arm_values, t_interval, verdict, write_claims
from rlvr.compare.harness import Arm, Budget, CompareSpec, run_compare
from rlvr.errors import ConfigError
from rlvr.tasks.base import Problem
from rlvr.testing import ToyTask

from tests.compare.test_harness import COMMON


def test_t_interval_by_hand():
    m, h, n = t_interval([0.1, 0.2, 0.3, 0.4, 0.5, float("nan")])
    sd = statistics.stdev([0.1, 0.2, 0.3, 0.4, 0.5])  # 0.158114
    assert (n, m) == (5, pytest.approx(0.3))
    assert h == pytest.approx(2.776 * sd / math.sqrt(5)) and h == pytest.approx(0.19630, abs=1e-5)
    assert t_interval([0.4])[1] == math.inf and t_interval([])[2] == 0
    assert t_interval([1.0] * 40)[1] == 0.0  # df > 30: normal quantile, zero spread


def _c(direction, **kw):
    return Claim(paper="P", claim="c", compare="x", arm="a", metric="m", direction=direction, **kw)


def test_verdict_rules():
    ref = [0.50, 0.52, 0.48]  # mean 0.50
    assert verdict(_c("higher"), [0.60, 0.62, 0.61], ref)["reproduced"] is True
    assert verdict(_c("higher"), [0.40, 0.70, 0.60], ref)["reproduced"] is False  # CI straddles 0.50
    assert verdict(_c("lower"), [0.30, 0.31, 0.29], ref)["reproduced"] is True
    assert verdict(_c("match"), [0.49, 0.51, 0.50], ref)["reproduced"] is True
    assert verdict(_c("match"), [0.20, 0.80, 0.50], ref)["reproduced"] is False  # too wide to call a match
    assert verdict(_c("faster"), [10.0, 11.0, 10.5], [20.0, 21.0, 19.0])["reproduced"] is True  # < 20 / 1.5
    assert verdict(_c("faster"), [15.0, 14.0, 16.0], [20.0, 21.0, 19.0])["reproduced"] is False
    assert verdict(_c("band", lo=0.5, hi=2.0), [1.0, 1.1, 0.9], [])["reproduced"] is True
    assert verdict(_c("higher"), [], ref)["reproduced"] is None
    with pytest.raises(ConfigError, match="direction"):
        _c("sideways")
    with pytest.raises(ConfigError, match="lo and hi"):
        _c("band")


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
    assert js[0]["reproduced"] in (True, False) and len(js[0]["arm"]) == 3
    claims.write_text(json.dumps({"claims": [{"paper": "X", "claim": "no metric", "compare": "x", "arm": "a"}]}))
    with pytest.raises(ConfigError, match="no metric"):
        ClaimsFile.load(claims)


def test_times_rule_and_curve_value_at_x():
    from rlvr.compare.claims import at_x

    ref = [1.0, 1.0, 1.0]
    assert verdict(_c("higher", times=1.4), [1.5, 1.5, 1.5], ref)["reproduced"] is True
    assert verdict(_c("higher", times=1.4), [1.3, 1.3, 1.3], ref)["reproduced"] is False
    curve = [{"step": 8, "eval/pass@1": 0.2}, {"step": 9, "reward/mean": 1.0}, {"step": 16, "eval/pass@1": 0.4}]
    assert at_x(curve, "eval/pass@1", "step", 12) == pytest.approx(0.3)
    assert at_x(curve, "eval/pass@1", "step", 8) == pytest.approx(0.2)
    assert math.isnan(at_x(curve, "eval/pass@1", "step", 20))

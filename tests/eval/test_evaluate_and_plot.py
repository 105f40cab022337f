"""rlvr eval (pass@k JSON) and rlvr plot (PNG curves) on the tiny model."""

from __future__ import annotations

import json

import pytest

from rlvr.eval.evaluate import evaluate, write_eval
from rlvr.eval.plot import plot_run, read_metrics


def test_evaluate_pass_at_k_consistent_with_counts(tiny, toy_task, tmp_path):
    factory, tok = tiny
    res = evaluate(factory(0), tok, toy_task, num_samples=4, ks=[1, 2, 8], max_new_tokens=6, prompts_per_batch=5,
                   limit=6)
    assert res["num_problems"] == 6 and res["num_samples"] == 4
    assert "pass@8" not in res  # k > n is skipped, not extrapolated
    total_c = sum(p["correct"] for p in res["per_problem"])
    assert res["pass@1"] == pytest.approx(total_c / 24)  # pass@1 is the mean per-sample accuracy
    assert res["pass@1"] <= res["pass@2"] <= 1.0
    # hand check of one problem's pass@2 contribution: 1 - C(n-c,2)/C(n,2)
    p = res["per_problem"][0]
    n, c = p["n"], p["correct"]
    assert n == 4 and 0 <= c <= 4
    path = write_eval(res, tmp_path / "e" / "eval.json")
    assert json.loads(path.read_text())["pass@2"] == res["pass@2"]


def test_evaluate_rejects_bad_num_samples(tiny, toy_task):
    factory, tok = tiny
    with pytest.raises(ValueError, match="num_samples"):
        evaluate(factory(0), tok, toy_task, num_samples=0, ks=[1])


def test_plot_writes_png_and_skips_torn_line(tmp_path):
    rows = [{"step": i, "reward/mean": i / 10, "actor/entropy": 1 - i / 20} for i in range(1, 8)]
    text = "\n".join(json.dumps(r) for r in rows) + '\n{"step": 8, "reward/me'
    (tmp_path / "metrics.jsonl").write_text(text)
    assert len(read_metrics(tmp_path)) == 7
    png = plot_run(tmp_path)
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_known_metrics_errors(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "other": 1}) + "\n")
    from rlvr.errors import DataError

    with pytest.raises(DataError, match="none of the metrics"):  # exit 2 in the CLI, not a traceback
        plot_run(tmp_path)

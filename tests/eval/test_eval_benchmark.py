"""rlvr eval as a benchmark tool: whole eval files in file order, --limit, greedy, maj@k + intervals,
per-problem JSONL, the progress bar, and one table for several checkpoints (tiny models, offline)."""

from __future__ import annotations

import json

import pytest

from rlvr import cli
from rlvr.config import build_config
from rlvr.errors import ConfigError, DataError
from rlvr.eval.evaluate import evaluate
from rlvr.tasks import MathTask
from rlvr.tasks.math import read_jsonl


def _gsm_file(path, n):
    rows = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(n)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_eval_file_uses_every_row_in_file_order_and_eval_size_takes_a_prefix(tmp_path):
    train, ev = _gsm_file(tmp_path / "train.jsonl", 12), _gsm_file(tmp_path / "test.jsonl", 150)
    uids = [p.uid for p in read_jsonl(ev)]
    t = MathTask.from_jsonl(train, eval_path=ev)  # no eval_size: the whole file (was: 100 random rows)
    assert [p.uid for p in t.problems("eval")] == uids and t.source_sizes["eval"] == 150
    capped = MathTask.from_jsonl(train, eval_path=ev, eval_size=7)
    assert [p.uid for p in capped.problems("eval")] == uids[:7] and capped.source_sizes["eval"] == 150
    only = MathTask.from_jsonl(None, eval_path=ev)  # evaluation-only task
    assert len(only.problems("eval")) == 150
    with pytest.raises(DataError, match="task.path"):
        only.problems("train")


def test_limit_takes_the_first_n_and_says_n_of_m(tiny, tmp_path):
    factory, tok = tiny
    ev = _gsm_file(tmp_path / "test.jsonl", 30)
    task = MathTask.from_jsonl(None, eval_path=ev)
    seen = []
    res = evaluate(factory(0), tok, task, num_samples=2, ks=[1, 2], max_new_tokens=4, prompts_per_batch=3,
                   limit=5, on_problem=seen.append)
    assert [p["uid"] for p in res["per_problem"]] == [p.uid for p in task.problems("eval")[:5]]
    assert res["num_problems"] == 5 and res["num_problems_total"] == 30 and res["problems"] == "5 of 30"
    full = evaluate(factory(0), tok, MathTask.from_jsonl(None, eval_path=ev, eval_size=4), num_samples=1, ks=[1],
                    max_new_tokens=2)
    assert full["problems"] == "4 of 30"  # a cap by task.eval_size is reported too
    # per-problem records: every sample with its text, extracted answer and verdict
    assert len(seen) == 5 and all(len(r["samples"]) == 2 for r in seen)
    s = seen[0]["samples"][0]
    assert set(s) >= {"text", "extracted", "correct", "reward", "length", "truncated"}
    assert seen[0]["gold"] == "0" and set(seen[0]["pass"]) == {"1", "2"} and set(seen[0]["maj"]) == {"1", "2"}


def test_eval_reports_maj_at_k_and_intervals(tiny, tmp_path):
    factory, tok = tiny
    task = MathTask.from_jsonl(None, eval_path=_gsm_file(tmp_path / "t.jsonl", 6))
    seen = []
    res = evaluate(factory(0), tok, task, num_samples=4, ks=[1, 4, 8], max_new_tokens=6, on_problem=seen.append)
    assert res["ks"] == [1, 4] and res["ks_skipped"] == [8]
    for m in ("pass@1", "pass@4", "reward/mean"):
        lo, hi = res[f"ci95/{m}"]
        assert 0 <= lo <= res[m] <= hi <= 1
    if res["answers/extracted_ratio"] > 0:  # maj@k needs extracted answers
        assert res["maj@4"] == pytest.approx(sum(r["maj"]["4"] for r in seen) / 6)
        assert "ci95/maj@1" in res


def test_temperature_zero_eval_is_one_greedy_sample_with_wilson_interval(tiny, tmp_path):
    factory, tok = tiny
    task = MathTask.from_jsonl(None, eval_path=_gsm_file(tmp_path / "t.jsonl", 5))
    a = evaluate(factory(0), tok, task, num_samples=16, ks=[1, 4, 16], temperature=0.0, max_new_tokens=5, seed=0)
    b = evaluate(factory(0), tok, task, num_samples=16, ks=[1, 4, 16], temperature=0.0, max_new_tokens=5, seed=9)
    assert a["decoding"] == "greedy" and a["num_samples"] == 1 and a["ks"] == [1] and a["ks_skipped"] == [4, 16]
    assert [p["sample"] for p in a["per_problem"]] == [p["sample"] for p in b["per_problem"]]  # seed-free
    assert a["ci_method/pass@1"] == "wilson"


def test_training_refuses_temperature_zero_with_the_reason_and_eval_accepts_it():
    with pytest.raises(ConfigError, match="GRPO needs sampled groups"):
        build_config(overrides=["temperature=0"])
    cfg = build_config(overrides=["eval.temperature=0"])
    assert cfg.eval.temperature == 0 and cfg.temperature == 1.0


@pytest.mark.parametrize("ks, needle", [("[0,1]", "must be >= 1"), ("[1,32]", "k=32 > eval.num_samples=16"), ("[]", "at least one")])
def test_bad_eval_ks_is_a_config_error(ks, needle):
    with pytest.raises(ConfigError, match=needle):
        build_config(overrides=[f"eval.ks={ks}"])


def test_default_ks_follow_num_samples():
    assert build_config(overrides=["eval.num_samples=4"]).eval.ks == [1, 4]
    assert build_config(overrides=["eval.num_samples=2"]).eval.ks == [1]
    assert build_config().eval.ks == [1, 4, 16]


def test_progress_bar_with_eta(tiny, toy_task, capsys):
    factory, tok = tiny
    evaluate(factory(0), tok, toy_task, num_samples=1, ks=[1], max_new_tokens=2, prompts_per_batch=4, limit=8,
             progress=True, label="m")
    err = capsys.readouterr().err
    assert "eval m" in err and "8/8" in err and "problem/s" in err and "<" in err  # elapsed<remaining


def _save_tiny(factory, tok, folder, seed, complete=True):
    model = factory(seed)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    if complete:
        (folder / ".complete").write_text("")
    return folder


def test_multi_checkpoint_eval_writes_one_table_json_and_jsonl(tiny, tmp_path, capsys):
    factory, tok = tiny
    run = tmp_path / "run"
    for step, seed in ((10, 1), (2, 2)):
        _save_tiny(factory, tok, run / f"checkpoint-{step}", seed)
    _save_tiny(factory, tok, run / "checkpoint-5", 5, complete=False)  # half-written: skipped
    _save_tiny(factory, tok, run / "final", 3, complete=False)
    other = _save_tiny(factory, tok, tmp_path / "other", 4)
    ev = _gsm_file(tmp_path / "test.jsonl", 9)
    out = tmp_path / "res" / "curve.json"
    code = cli.main(["eval", "task.type=jsonl", f"task.eval_path={ev}", "max_completion_length=4",
                     "max_prompt_length=64", "eval.num_samples=2", "eval.ks=[1,2]", "logging.progress=false",
                     "--checkpoint", str(run), "--checkpoint", str(other), "--limit", "3", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    labels = [r["model"] for r in data["rows"]]
    assert labels == [f"{run}/checkpoint-2", f"{run}/checkpoint-10", f"{run}/final", str(other)]
    assert [r["step"] for r in data["rows"]] == [2, 10, None, None]
    assert all(r["problems"] == "3 of 9" and "ci95/pass@1" in r for r in data["rows"])
    md = (tmp_path / "res" / "curve.md").read_text()
    table = [line for line in md.splitlines() if line.startswith("| `")]
    assert len(table) == 4 and "3 of 9 problems" in md and "pass@2" in md
    lines = [json.loads(x) for x in (tmp_path / "res" / "curve.samples.jsonl").read_text().splitlines()]
    assert len(lines) == 4 * 3 and {x["model"] for x in lines} == set(labels)
    assert all(len(x["samples"]) == 2 and "extracted" in x["samples"][0] for x in lines)


def test_eval_bad_checkpoint_fails_before_any_model_loads(tmp_path, capsys, monkeypatch):
    import rlvr.models

    monkeypatch.setattr(rlvr.models, "load_policy", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    ev = _gsm_file(tmp_path / "test.jsonl", 3)
    empty = tmp_path / "empty_run"
    empty.mkdir()
    assert cli.main(["eval", "task.type=jsonl", f"task.eval_path={ev}", "--checkpoint", str(empty)]) == 2  # bad input (ModelPathError): a configuration error
    assert "neither a model folder" in capsys.readouterr().err


def test_eval_unwritable_out_is_a_config_error_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import rlvr.models

    monkeypatch.setattr(rlvr.models, "load_policy", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    ev = _gsm_file(tmp_path / "test.jsonl", 3)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert cli.main(["eval", "task.type=jsonl", f"task.eval_path={ev}", "--out", str(blocker / "e.json")]) == 2
    assert "--out" in capsys.readouterr().err

"""A split evaluated in shards (``--offset``/``--limit``) and merged (``rlvr eval-merge``) gives the
numbers of one run; the default engine decodes a whole eval batch together; eval honours
``distributed.num_threads`` (tiny models, offline)."""

from __future__ import annotations

import json

import pytest
import torch

from rlvr import cli
from rlvr.errors import DataError
from rlvr.eval.evaluate import evaluate
from rlvr.eval.merge import merge_samples, read_samples
from rlvr.eval.stats import wilson_interval
from rlvr.eval.summary import summarize_records
from rlvr.tasks import MathTask


def _gsm_file(path, n):
    rows = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(n)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _tiny_folder(factory, tok, folder):
    factory(0).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _eval(model, ev, out, *extra):
    return cli.main(["eval", f"model.name_or_path={model}", "task.type=jsonl", f"task.eval_path={ev}",
                     "max_completion_length=4", "max_prompt_length=64", "eval.num_samples=2", "eval.ks=[1,2]",
                     "eval.temperature=1.0", "eval.batch_size=6", "logging.progress=false", *extra, "--out", str(out)])


def test_shards_merged_equal_one_run_over_all_problems(tiny, tmp_path, capsys):
    factory, tok = tiny
    model = _tiny_folder(factory, tok, tmp_path / "m")
    ev = _gsm_file(tmp_path / "test.jsonl", 9)
    assert _eval(model, ev, tmp_path / "all.json") == 0, capsys.readouterr().err
    # 3 problems per batch (batch_size 6 / 2 samples): shards at multiples of 3 draw the same batches
    assert _eval(model, ev, tmp_path / "a.json", "--limit", "3") == 0
    assert _eval(model, ev, tmp_path / "b.json", "--offset", "3") == 0
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["row_range"] == [3, 9] and b["problems"] == "6 of 9 (rows 4–9)"
    code = cli.main(["eval-merge", str(tmp_path / "a.samples.jsonl"), str(tmp_path / "b.samples.jsonl"),
                     "--out", str(tmp_path / "merged.json")])
    assert code == 0, capsys.readouterr().err
    whole, merged = json.loads((tmp_path / "all.json").read_text()), json.loads((tmp_path / "merged.json").read_text())
    assert merged["problems"] == "all 9" and merged["ks"] == [1, 2]
    for key in ("pass@1", "pass@2", "maj@1", "maj@2", "reward/mean", "ci95/pass@1", "ci95/pass@2", "ci_method/pass@1",
                "ci95/maj@2", "completions/mean_length", "completions/clipped_ratio", "answers/extracted_ratio"):
        if key in whole:
            assert merged[key] == pytest.approx(whole[key]), key
    # the very same samples, in split order (seeds follow the problem's index in the whole split)
    lines = lambda p: [json.loads(x) for x in p.read_text().splitlines()]  # noqa: E731
    assert lines(tmp_path / "merged.samples.jsonl") == lines(tmp_path / "all.samples.jsonl")
    assert [s["complete"] for s in merged["shards"]] == [True, True]
    assert "9" in (tmp_path / "merged.md").read_text()


def test_offset_past_the_split_is_a_config_error_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import rlvr.models

    monkeypatch.setattr(rlvr.models, "load_policy", lambda *a, **k: pytest.fail("model loaded"))
    ev = _gsm_file(tmp_path / "test.jsonl", 4)
    code = cli.main(["eval", "task.type=jsonl", f"task.eval_path={ev}", "--offset", "4",
                     "--out", str(tmp_path / "x.json")])
    assert code == 2 and "--offset 4" in capsys.readouterr().err


def _record(uid, correct, extracted, model="m"):
    samples = [{"text": "t", "extracted": e, "correct": c, "reward": float(c), "length": 3, "truncated": False}
               for c, e in zip(correct, extracted)]
    n, c = len(samples), sum(correct)
    return {"model": model, "uid": uid, "n": n, "correct": c, "mean_reward": c / n, "seen_in_train": False,
            "pass": {"1": c / n}, "maj": {"1": c / n}, "samples": samples}


def test_summarize_records_by_hand():
    recs = [_record("a", [True], ["1"]), _record("b", [False], ["2"]), _record("c", [False], [None]),
            _record("d", [True], ["4"])]
    out = summarize_records(recs, [1])
    assert out["pass@1"] == 0.5 and out["ci_method/pass@1"] == "wilson"
    assert out["ci95/pass@1"] == pytest.approx(list(wilson_interval(2, 4)))
    assert out["answers/extracted_ratio"] == 0.75 and out["completions/mean_length"] == 3
    with pytest.raises(ValueError, match="no pass/maj outcome for k=4"):
        summarize_records(recs, [4])


def _write(path, recs, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + tail)
    return path


def test_merge_refuses_overlap_other_models_and_other_settings_and_skips_a_torn_line(tmp_path):
    a = _write(tmp_path / "a.samples.jsonl", [_record("p1", [True], ["1"])], tail='{"uid": "p2", "sam')
    assert [r["uid"] for r in read_samples(a)] == ["p1"]  # an interrupted shard keeps what it finished
    b = _write(tmp_path / "b.samples.jsonl", [_record("p1", [False], ["2"])])
    with pytest.raises(DataError, match="'p1' is in both"):
        merge_samples([a, b])
    c = _write(tmp_path / "c.samples.jsonl", [_record("p3", [False], ["2"], model="other")])
    with pytest.raises(DataError, match="one model"):
        merge_samples([a, c])
    d = _write(tmp_path / "d.samples.jsonl", [_record("p4", [False], ["2"])])
    (tmp_path / "a.json").write_text(json.dumps({"temperature": 0.7, "num_problems": 1}))
    (tmp_path / "d.json").write_text(json.dumps({"temperature": 0.0, "num_problems": 1}))
    with pytest.raises(DataError, match="temperature"):
        merge_samples([a, d])
    (tmp_path / "a.json").write_text(json.dumps({"temperature": 0.7, "continuous_batching": False, "num_problems": 1}))
    (tmp_path / "d.json").write_text(json.dumps({"temperature": 0.7, "continuous_batching": True, "num_problems": 1}))
    with pytest.raises(DataError, match="continuous_batching=True"):  # sampled draws depend on the mode
        merge_samples([a, d])
    (tmp_path / "d.json").unlink()  # a cut shard has no JSON: merged, and reported as incomplete
    m = merge_samples([a, d])
    assert m["num_problems"] == 2 and m["pass@1"] == 0.5 and [s["complete"] for s in m["shards"]] == [True, False]


def test_default_engine_decodes_the_whole_eval_batch_together(tiny, tmp_path, monkeypatch):
    from rlvr.engines import hf

    factory, tok = tiny
    rows = []
    orig = hf.HFEngine._forward

    def spy(self, ids, mask, pos, cache):
        rows.append(ids.shape[0])
        return orig(self, ids, mask, pos, cache)

    monkeypatch.setattr(hf.HFEngine, "_forward", spy)
    task = MathTask.from_jsonl(None, eval_path=_gsm_file(tmp_path / "t.jsonl", 40))
    evaluate(factory(0), tok, task, num_samples=2, ks=[1], max_new_tokens=2, prompts_per_batch=40)
    assert max(rows) == 80  # 40 problems x 2 samples in one decode batch (the engine's old cap was 64 rows)


def test_eval_honours_distributed_num_threads(tiny, tmp_path, capsys):
    factory, tok = tiny
    model = _tiny_folder(factory, tok, tmp_path / "m")
    before = torch.get_num_threads()
    try:
        code = _eval(model, _gsm_file(tmp_path / "t.jsonl", 2), tmp_path / "x.json", "distributed.num_threads=1")
        assert code == 0, capsys.readouterr().err
    finally:
        torch.set_num_threads(before)
    assert json.loads((tmp_path / "x.json").read_text())["torch_threads"] == 1

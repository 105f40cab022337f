"""Math task: math-verify equivalence, JSONL loading and its errors, splits, Hugging Face loading."""

from __future__ import annotations

import json
import sys
import threading
import types

import pytest

from rlvr.errors import ConfigError, DataError
from rlvr.tasks import MathTask, Problem, answers_match
from rlvr.tasks.math import gold_from_field, read_jsonl


@pytest.mark.parametrize(
    "gold,pred,equal",
    [
        ("0.75", "3/4", True),
        ("0.75", "\\frac{3}{4}", True),
        ("\\frac{3}{4}", "0.75", True),
        ("1000", "1,000", True),
        ("1,000", "1000", True),
        ("72", "72.0", True),
        ("18", "\\$18", True),
        ("18", "18 dollars", True),
        ("5", "x = 5", True),
        ("0.75", "0.76", False),
        ("5", "6", False),
        ("18", "18x", False),
    ],
)
def test_answers_match(gold, pred, equal):
    assert answers_match(gold, pred)[0] is equal


def test_verify_boxed_fraction_vs_decimal_gold():
    task = MathTask("t", [], [])
    p = Problem("u", "q", "0.75")
    v = task.verify(p, "Half of 1.5 is ...\n\\boxed{3/4}")
    assert (v.score, v.correct, v.feedback, v.extracted) == (1.0, True, None, "3/4")
    w = task.verify(p, "\\boxed{0.5}")
    assert w.score == 0.0 and "0.75" not in w.feedback and "`0.5`" in w.feedback


def test_verify_off_main_thread_and_junk_is_cheap_and_safe():
    task = MathTask("t", [], [])
    p = Problem("u", "q", "\\frac{1}{2}")
    out = {}
    th = threading.Thread(target=lambda: out.update(v=task.verify(p, "\\boxed{0.5}")))
    th.start()
    th.join(30)
    assert out["v"].correct
    junk = task.verify(p, "\\boxed{" + "(" * 400 + "}")
    assert junk.score == 0.0 and not junk.correct


def test_gold_from_field():
    assert gold_from_field("work\n#### 1,234") == "1234"
    assert gold_from_field("so $\\boxed{\\frac{1}{2}}$") == "\\frac{1}{2}"
    assert gold_from_field(" 7 ") == "7"
    assert gold_from_field(12) == "12"
    with pytest.raises(DataError):
        gold_from_field(None)


def _write(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def _rows(n, start=0):
    return [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(start, start + n)]


def test_read_jsonl(tmp_path):
    f = _write(tmp_path / "gsm.jsonl", _rows(3))
    probs = read_jsonl(f)
    assert [p.answer for p in probs] == ["1", "2", "3"]
    assert probs[0].uid == "gsm.jsonl:1" and probs[0].question == "What is 0 + 1?"


def test_jsonl_bad_json_names_file_and_line(tmp_path):
    f = _write(tmp_path / "bad.jsonl", [_rows(1)[0], "", "{not json"])
    with pytest.raises(DataError, match=r"bad\.jsonl:3: not valid JSON"):
        read_jsonl(f)


def test_jsonl_missing_field_names_file_line_field(tmp_path):
    f = _write(tmp_path / "miss.jsonl", [*_rows(1), {"question": "q", "solution": "#### 3"}])
    with pytest.raises(DataError, match=r"miss\.jsonl:2: .*'answer'.*solution"):
        read_jsonl(f)
    g = _write(tmp_path / "alt.jsonl", [{"problem": "q", "solution": "#### 3"}])
    assert read_jsonl(g, "problem", "solution")[0].answer == "3"


def test_jsonl_bad_answer_and_non_object(tmp_path):
    f = _write(tmp_path / "a.jsonl", [{"question": "q", "answer": "   "}])
    with pytest.raises(DataError, match=r"a\.jsonl:1: field 'answer'"):
        read_jsonl(f)
    g = _write(tmp_path / "b.jsonl", ["[1, 2]"])
    with pytest.raises(DataError, match=r"b\.jsonl:1: expected a JSON object"):
        read_jsonl(g)


def test_jsonl_missing_file(tmp_path):
    with pytest.raises(DataError, match="nope.jsonl"):
        read_jsonl(tmp_path / "nope.jsonl")


def test_split_deterministic_and_disjoint(tmp_path):
    f = _write(tmp_path / "all.jsonl", _rows(30))
    a = MathTask.from_jsonl(f, eval_size=8, eval_seed=3)
    b = MathTask.from_jsonl(f, eval_size=8, eval_seed=3)
    assert a.problems("eval") == b.problems("eval") and a.problems("train") == b.problems("train")
    tr, ev = {p.uid for p in a.problems("train")}, {p.uid for p in a.problems("eval")}
    assert len(ev) == 8 and len(tr) == 22 and not tr & ev
    c = MathTask.from_jsonl(f, eval_size=8, eval_seed=4)
    assert {p.uid for p in c.problems("eval")} != ev
    capped = MathTask.from_jsonl(f, eval_size=8, train_size=5)
    assert len(capped.problems("train")) == 5
    with pytest.raises(DataError, match="no training rows"):
        MathTask.from_jsonl(f, eval_size=30)


def test_separate_eval_file(tmp_path):
    f = _write(tmp_path / "train.jsonl", _rows(10))
    g = _write(tmp_path / "test.jsonl", _rows(4, start=100))
    t = MathTask.from_jsonl(f, eval_path=g, eval_size=3)
    assert len(t.problems("train")) == 10 and len(t.problems("eval")) == 3
    assert all(p.uid.startswith("test.jsonl:") for p in t.problems("eval"))
    p = t.problems("eval")[0]
    assert t.verify(p, f"\\boxed{{{p.answer}}}").correct


def test_hf_dataset_without_datasets_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import raises ImportError
    with pytest.raises(ConfigError, match="pip install datasets"):
        MathTask.from_hf("openai/gsm8k", "main")


def test_hf_dataset_with_fake_loader(monkeypatch):
    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        if split == "missing":
            raise ValueError("Unknown split")
        start = 0 if split == "train" else 100
        return _rows(12 if split == "train" else 6, start)

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    t = MathTask.from_hf("openai/gsm8k", "main", eval_size=4)
    assert calls == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", "test")]
    assert len(t.problems("train")) == 12 and len(t.problems("eval")) == 4 and t.name == "gsm8k"
    assert t.problems("eval")[0].uid.startswith("openai/gsm8k/test/")
    same = MathTask.from_hf("openai/gsm8k", "main", eval_split="train", eval_size=4)
    assert len(same.problems("train")) == 8
    with pytest.raises(DataError, match="split 'missing'"):
        MathTask.from_hf("openai/gsm8k", "main", eval_split="missing")
    with pytest.raises(DataError, match=r"split 'train' row 0.*'prompt'"):
        MathTask.from_hf("openai/gsm8k", "main", question_field="prompt")

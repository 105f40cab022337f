"""JSONL data problems become messages naming file and line (issue 12, items 7 and 8)."""

from __future__ import annotations

import json

import pytest

from rlvr.errors import DataError
from rlvr.tasks.math import read_jsonl


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_non_utf8_line_is_named(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_bytes(json.dumps({"question": "1+1?", "answer": "#### 2"}).encode() + b"\n"
                  + b'{"question": "caf\xe9", "answer": "#### 3"}\n')
    with pytest.raises(DataError, match=r"d\.jsonl:2: not UTF-8"):
        read_jsonl(f)


def test_a_folder_as_task_path(tmp_path):
    with pytest.raises(DataError, match="is a directory"):
        read_jsonl(tmp_path)


def test_rows_without_a_final_answer_marker_are_warned_with_their_lines(tmp_path):
    rows = [{"question": f"q{i}", "answer": f"so it is {i}\n#### {i}"} for i in range(4)]
    rows[1]["answer"] = "we add them and get 5"
    rows[3]["answer"] = "the total is 7 apples"
    with pytest.warns(UserWarning, match=r"2 of 4 rows have no '####'.*lines 2, 4"):
        probs = read_jsonl(_write(tmp_path / "d.jsonl", rows))
    assert [p.answer for p in probs][0] == "0"


def test_no_row_with_a_final_answer_marker_is_refused(tmp_path):
    rows = [{"question": f"q{i}", "answer": f"the answer is {i}"} for i in range(3)]
    with pytest.raises(DataError, match="no row's 'answer' marks its final answer"):
        read_jsonl(_write(tmp_path / "d.jsonl", rows))


def test_bare_answers_and_numbers_need_no_marker(tmp_path, recwarn):
    rows = [{"question": "a", "answer": "42"}, {"question": "b", "answer": 7}, {"question": "c", "answer": "3/4"}]
    assert [p.answer for p in read_jsonl(_write(tmp_path / "d.jsonl", rows))] == ["42", "7", "3/4"]
    assert not [w for w in recwarn if "####" in str(w.message)]

"""Answer extraction rules and GSM8K gold parsing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.errors import DataError
from rlvr.tasks import extract_answer, extract_answer_with_source, gold_from_gsm8k

TABLE = [
    # (completion, expected answer, expected source)
    ("so the result is \\boxed{42}", "42", "boxed"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", "boxed"),
    ("nested \\boxed{\\frac{\\sqrt{2}}{\\{3\\}}} end", "\\frac{\\sqrt{2}}{\\{3\\}}", "boxed"),
    ("first \\boxed{1}, then corrected: \\boxed{2}", "2", "boxed"),
    ("\\boxed{ $-4$ }.", "-4", "boxed"),
    ("\\boxed{\\text{yes}}", "yes", "boxed"),
    ("\\fbox{9}", "9", "boxed"),
    ("\\boxed{7} and a truncated \\boxed{8", "7", "boxed"),  # unclosed last box is skipped
    ("\\boxed{} <answer>3</answer>", "3", "tag"),  # empty box skipped
    ("<answer>1</answer> oops <answer> 5 </answer>", "5", "tag"),
    ("<ANSWER>\n12\n</ANSWER>", "12", "tag"),
    ("The answer is -4.", "-4", "phrase"),
    ("Answer: 17", "17", "phrase"),
    ("**Final Answer:** $42$", "42", "phrase"),
    ("Final answer:\n\n  17\n", "17", "phrase"),
    ("the answer is 3, no wait, the answer is **5**.", "5", "phrase"),
    ("The answer is 7. Let me double-check: 3 + 5 = 8", "7", "phrase"),
    ("3 + 4 = 7, total 1,000 apples", "1000", "last_number"),
    ("it is 3.5", "3.5", "last_number"),
    ("from 2-3", "3", "last_number"),
    ("x = -12", "-12", "last_number"),
    ("\\boxed{3", "3", "last_number"),
    ("no digits at all", None, "none"),
    ("", None, "none"),
]


@pytest.mark.parametrize("text,answer,source", TABLE)
def test_extraction_table(text, answer, source):
    assert extract_answer_with_source(text) == (answer, source)
    assert extract_answer(text) == answer


def test_many_unclosed_boxes():
    text = "\\boxed{1}" + " \\boxed{" * 5000
    assert extract_answer_with_source(text) == ("1", "boxed")


def test_none_input_is_none():
    assert extract_answer_with_source(None) == (None, "none")


def test_boxed_beats_tag_and_phrase():
    text = "<answer>1</answer> The answer is 2. \\boxed{3} trailing 4"
    assert extract_answer_with_source(text) == ("3", "boxed")


@settings(max_examples=60, deadline=None)
@given(st.integers(-10**9, 10**9), st.text(alphabet="abc xyz\n+-=", max_size=30))
def test_boxed_integer_round_trips(n, prefix):
    assert extract_answer_with_source(f"{prefix} \\boxed{{{n}}}") == (str(n), "boxed")


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_extraction_never_raises(text):
    ans, src = extract_answer_with_source(text)
    assert src in ("boxed", "tag", "phrase", "last_number", "none")
    assert (ans is None) == (src == "none")


@pytest.mark.parametrize(
    "field,gold",
    [
        ("She pays 3 * 4 = <<3*4=12>>12 dollars.\n#### 12", "12"),
        ("Total is 1,000.\n#### 1,000", "1000"),
        ("a #### inside text, then\n#### -5 ", "-5"),
        ("#### 3.75", "3.75"),
    ],
)
def test_gold_from_gsm8k(field, gold):
    assert gold_from_gsm8k(field) == gold


@pytest.mark.parametrize("field", ["no marker here", "ends with marker ####   ", None])
def test_gold_from_gsm8k_errors(field):
    with pytest.raises(DataError, match="####"):
        gold_from_gsm8k(field)

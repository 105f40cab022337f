"""The Hermes tool-call parser reads one JSON value per ``<tool_call>`` (issue 37 item 2): a
``</tool_call>`` inside a JSON string made a well-formed call "not valid JSON" under the non-greedy
regex (vLLM's hermes parser had the same bug report)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.envs.tools import format_hermes, parse_hermes


def _ok(calls):
    return [(c.name, c.arguments) for c in calls if c.error is None]


def test_closing_tag_inside_a_json_string_is_part_of_the_argument():
    text = '<tool_call>{"name": "python", "arguments": {"code": "print(\'</tool_call>\')"}}</tool_call>'
    (call,) = parse_hermes(text)
    assert call.error is None and (call.name, call.arguments) == ("python", {"code": "print('</tool_call>')"})
    # also an opening tag in a string, and a call after it
    two = ('<tool_call>{"name": "a", "arguments": {"s": "<tool_call>x</tool_call>"}}</tool_call> then '
           '<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    assert _ok(parse_hermes(two)) == [("a", {"s": "<tool_call>x</tool_call>"}), ("b", {})]


def test_nested_braces_and_escapes_in_strings():
    args = {"code": "d = {'a': {'b': [1, {2}]}}\nprint('}}}', \"{{\")", "q": "\\\"}"}
    text = f"<tool_call>\n{json.dumps({'name': 'python', 'arguments': args})}\n</tool_call>"
    assert _ok(parse_hermes(text)) == [("python", args)]


def test_an_invalid_call_then_a_valid_one():
    text = ('<tool_call>{"name": "a", "arguments": {bad}}</tool_call>'
            '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>')
    bad, good = parse_hermes(text)
    assert "not valid JSON" in bad.error and ", char " in bad.error
    assert (good.name, good.arguments, good.error) == ("b", {"x": 1}, None)
    # valid JSON followed by junk before the tag is still not a call, and the next call is read
    junk = '<tool_call>{"name": "a"} trailing</tool_call><tool_call>{"name": "c"}</tool_call>'
    first, second = parse_hermes(junk)
    assert "Extra data" in first.error and (second.name, second.error) == ("c", None)


def test_unicode_names_and_arguments():
    text = '<tool_call>{"name": "überprüfe", "arguments": {"text": "日本語 🙂 \\u00e9"}}</tool_call>'
    assert _ok(parse_hermes(text)) == [("überprüfe", {"text": "日本語 🙂 é"})]


def test_todays_behaviour_elsewhere_is_kept():
    assert "unclosed" in parse_hermes('<tool_call>{"name": "y"')[0].error
    assert "unclosed" in parse_hermes('<tool_call>{"name": "y", "arguments": {}}  ')[0].error  # valid JSON, no tag
    # invalid JSON is skipped to the next closing tag, as before
    assert "not valid JSON" in parse_hermes('<tool_call>{"name": "python", "arguments": {"code": "</tool_call>')[0].error
    assert 'string "name"' in parse_hermes("<tool_call>[1, 2]</tool_call>")[0].error
    assert '"arguments" must be' in parse_hermes('<tool_call>{"name": "a", "arguments": 3}</tool_call>')[0].error
    assert parse_hermes("no calls here </tool_call>") == []
    deep = parse_hermes("<tool_call>" + "[" * 100_000 + "</tool_call>")  # a RecursionError is not a crash
    assert len(deep) == 1 and "not valid JSON" in deep[0].error


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(), kids, max_size=4), max_leaves=16)
_texty = st.sampled_from(["</tool_call>", "<tool_call>", "{", "}", '"', "\\", "\n", " "])
_args = st.dictionaries(st.text() | _texty, _json | _texty | st.text(alphabet="{}[]\"\\<>/tool_cal "), max_size=5)


@settings(max_examples=200, deadline=None)
@given(name=st.text(min_size=1), args=_args, prose=st.text(alphabet="ab <>/{}\n"))
def test_any_jsonable_arguments_round_trip_through_format_and_parse(name, args, prose):
    text = prose.replace("<tool_call>", "") + format_hermes(name, args) + " " + format_hermes("second", {"k": args})
    calls = parse_hermes(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [(name, args, None), ("second", {"k": args}, None)]

"""Pulling the final answer out of a model's completion, and the gold answer out of a GSM8K row.

The rules, in order (the first that finds a non-empty answer wins):

1. ``boxed``: the content of the last closed ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced so
   nested LaTeX (``\\boxed{\\frac{1}{2}}``) survives;
2. ``tag``: the content of the last ``<answer>...</answer>``;
3. ``phrase``: the text after the last "answer is" / "Answer:" / "final answer:" (rest of that line,
   or the next non-empty line when the phrase ends its line);
4. ``last_number`` (fallback, a format violation): the last number in the text, thousands commas removed;
5. ``none``.

Source: the ``\\boxed{}`` convention of MATH (Hendrycks et al. 2021) and of the GRPO literature;
``<answer>`` tags of DeepSeek-R1 style prompts; the last-number fallback of GSM8K evaluation
harnesses (lm-eval ``flexible-extract``). Interpretation: ``boxed`` beats ``tag`` beats ``phrase``
because the system prompt asks for ``\\boxed{}`` and it is the least ambiguous; an unclosed last
``\\boxed{`` (a truncated response) is skipped rather than guessed at.
"""

from __future__ import annotations

import re

from rlvr.errors import DataError

SOURCES = ("boxed", "tag", "phrase", "last_number", "none")

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_TAG = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_PHRASE = re.compile(
    r"\b(?:final\s+)?answer\s*\**\s*(?:is\b\s*:?|[:=])\s*",
    re.IGNORECASE,
)
_NUMBER = re.compile(r"(?<!\d)-?\d+(?:,\d{3})+(?:\.\d+)?(?!\d)|(?<!\d)-?\d+(?:\.\d+)?")
_SENTENCE_END = re.compile(r"(?<=\S)\.\s")
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_WRAPPERS = re.compile(r"^\\(?:text|textbf|mathrm|mathbf|texttt)\s*\{(.*)\}$", re.DOTALL)
_MAX_CHARS = 500  # an "answer" longer than this is prose, not an answer; keep verifiers cheap


def _balanced(text: str, start: int) -> str | None:
    """Content between ``text[start - 1] == "{"`` and its matching ``}``, or None if unclosed."""
    depth = 1
    i = start
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):  # skip escaped characters such as \{ and \}
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
        i += 1
    return None


def _clean(ans: str) -> str:
    """Strip whitespace, math delimiters, markdown emphasis, one text wrapper, trailing punctuation."""
    s = ans.strip()
    for _ in range(3):
        before = s
        s = s.strip().strip("*`").strip()
        if len(s) >= 2 and s[0] == "$" and s[-1] == "$":
            s = s.strip("$").strip()
        if s.startswith("\\(") and s.endswith("\\)"):
            s = s[2:-2].strip()
        if s.startswith("\\[") and s.endswith("\\]"):
            s = s[2:-2].strip()
        m = _WRAPPERS.match(s)
        if m and _balanced(s, s.index("{") + 1) == m.group(1):
            s = m.group(1).strip()
        s = s.rstrip(" .;,")
        if s == before:
            break
    return s


def _strip_commas(num: str) -> str:
    return num.replace(",", "") if _THOUSANDS.match(num) else num


def _closing_braces(text: str) -> dict[int, int]:
    """Map each ``{`` position to its matching ``}`` position, one pass (escaped braces ignored)."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def _from_boxed(text: str) -> str | None:
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None
    pairs = _closing_braces(text)  # linear even for a degenerate run of unclosed \boxed{
    for m in reversed(matches):
        close = pairs.get(m.end() - 1)
        if close is None:
            continue
        cleaned = _clean(text[m.end():close])
        if cleaned:
            return cleaned
    return None


def _from_tag(text: str) -> str | None:
    for inner in reversed(_TAG.findall(text)):
        cleaned = _clean(inner)
        if cleaned:
            return cleaned
    return None


def _from_phrase(text: str) -> str | None:
    matches = list(_PHRASE.finditer(text))
    for m in reversed(matches):
        rest = text[m.end() : m.end() + 4 * _MAX_CHARS]
        lines = rest.split("\n")
        candidate = lines[0].strip() or next((ln.strip() for ln in lines[1:] if ln.strip()), "")
        candidate = _SENTENCE_END.split(candidate, maxsplit=1)[0]  # "is 7. Let me check" -> "7"
        cleaned = _clean(candidate)
        if cleaned:
            return cleaned
    return None


def _from_last_number(text: str) -> str | None:
    nums = _NUMBER.findall(text)
    return _strip_commas(nums[-1]) if nums else None


def extract_answer_with_source(text: str | None) -> tuple[str | None, str]:
    """Find the final answer in ``text`` and say which rule found it.

    Args:
        text: a completion (decoded response text); ``None`` is treated as empty.

    Returns:
        ``(answer, source)`` where ``source`` is one of ``"boxed"``, ``"tag"``, ``"phrase"``,
        ``"last_number"`` (a fallback: the completion broke the answer format) or ``"none"``
        (then ``answer`` is ``None``). The answer is stripped of surrounding ``$``, markdown
        emphasis, one ``\\text{}``-style wrapper and trailing ``.,;``; answers longer than 500
        characters are treated as not found by that rule.

    Source: module docstring (rule order and its reasons).
    """
    if not text:
        return None, "none"
    for source, rule in (("boxed", _from_boxed), ("tag", _from_tag), ("phrase", _from_phrase)):
        ans = rule(text)
        if ans is not None and len(ans) <= _MAX_CHARS:
            return ans, source
    ans = _from_last_number(text)
    if ans is not None:
        return ans, "last_number"
    return None, "none"


def extract_answer(text: str | None) -> str | None:
    """The final answer in ``text`` or ``None``; see :func:`extract_answer_with_source` for the rules."""
    return extract_answer_with_source(text)[0]


def gold_from_gsm8k(answer_field: str) -> str:
    """The gold answer of a GSM8K row: the text after the final ``####``, commas removed.

    Args:
        answer_field: the row's ``answer`` string (worked solution ending in ``#### 72``).

    Returns:
        The stripped answer (``"#### 1,000"`` → ``"1000"``).

    Raises:
        DataError: no ``####`` marker, or nothing after the last one.

    Source: the GSM8K format (Cobbe et al. 2021, ``grade_school_math`` repository).
    """
    if not isinstance(answer_field, str) or "####" not in answer_field:
        raise DataError(f"GSM8K answer has no '####' final-answer marker: {str(answer_field)[-80:]!r}")
    gold = answer_field.rsplit("####", 1)[1].strip().replace(",", "")
    if not gold:
        raise DataError(f"GSM8K answer has nothing after its final '####': {answer_field[-80:]!r}")
    return gold

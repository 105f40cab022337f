"""Short, label-free feedback on a wrong completion, for feedback-guided second attempts.

Source: ``docs/fbos_rl.md`` §2.4, level ``answer_wrong`` (the default): the ``format`` messages
(no final answer in ``\\boxed{}``; response truncated before a final answer; final answer not
parseable) plus "Your final answer ``X`` is incorrect." The reference answer is never included
(the ``gt_hint`` level is an ablation that the sampler, not the task, would have to build).
"""

from __future__ import annotations

FORMAT_HINT = "Hint: end with the final answer alone on the last line, e.g. \\boxed{7}."
"""The hint a task appends when ``task.feedback_hint`` is true.

Interpretation: a format reminder, not a content hint, because a task-independent hint must not
depend on (and so cannot leak) the reference answer.
"""

_MAX_SHOWN = 120


def _show(extracted: str) -> str:
    s = " ".join(extracted.split())
    return s if len(s) <= _MAX_SHOWN else s[: _MAX_SHOWN - 3] + "..."


def make_feedback(
    extracted: str | None,
    source: str,
    correct: bool,
    *,
    hint: str | None = None,
    truncated: bool = False,
    unparseable: bool = False,
) -> str | None:
    """Feedback text for one verdict, or ``None`` when the answer is correct.

    Args:
        extracted: the answer extracted from the completion (``None`` if none was found).
        source: the extraction rule (``"boxed"``, ``"tag"``, ``"phrase"``, ``"last_number"``,
            ``"none"``; see :func:`rlvr.tasks.answers.extract_answer_with_source`).
        correct: the verdict; ``True`` returns ``None``.
        hint: appended after one space, only when given (the caller is responsible for it not
            holding the reference answer).
        truncated: the response hit the length limit (only changes the no-answer message).
        unparseable: the verifier could not read the extracted answer.

    Returns:
        ``None`` if ``correct``; otherwise one or two short sentences: a format violation
        (``No final answer in \\boxed{} was found.``, ``... found only a bare number ...``, the answer
        not in ``\\boxed{}``, not parseable) and/or ``Your final answer `X` is incorrect.``. It
        names only the model's own answer, never the reference.
    """
    if correct:
        return None
    if extracted is None or source == "none":
        if truncated:
            msg = "The response was cut off before a final answer; no final answer in \\boxed{} was found."
        else:
            msg = "No final answer in \\boxed{} was found."
    elif source == "last_number":
        msg = (
            f"No final answer in \\boxed{{}} was found, only a bare number (`{_show(extracted)}`), "
            "and it is incorrect."
        )
    elif unparseable:
        msg = f"Your final answer `{_show(extracted)}` could not be parsed as an answer."
        if source != "boxed":
            msg = "The final answer was not in \\boxed{}. " + msg
    else:
        msg = f"Your final answer `{_show(extracted)}` is incorrect."
        if source != "boxed":
            msg = "The final answer was not in \\boxed{}. " + msg
    if hint:
        msg = f"{msg} {hint}"
    return msg

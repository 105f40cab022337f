"""The system prompt that fixes the answer format, and rendering problems through a chat template."""

from __future__ import annotations

from typing import Any

from rlvr.errors import ConfigError
from rlvr.tasks.base import Problem

DEFAULT_SYSTEM_PROMPT = (
    "Solve the problem. Reason briefly, step by step, then write the final answer alone on the "
    "last line as \\boxed{answer}.\n"
    "Example: for 3 + 4, the last line is \\boxed{7}"
)
"""Default system instruction.

Interpretation: a short instruction plus a one-line worked example, because 135M-parameter models
copy a concrete example far more reliably than they follow an abstract format description
(observed: SmolLM2-135M never uses an answer tag unprompted). ``\\boxed{}`` is the
format :func:`rlvr.tasks.answers.extract_answer` tries first.
"""


def build_messages(problem: Problem, system_prompt: str | None) -> list[dict[str, str]]:
    """Chat messages for ``problem``: a system turn (if ``system_prompt`` is non-empty) and a user turn.

    Args:
        problem: the problem; its ``question`` becomes the user turn verbatim. A problem that carries its
            own ``metadata["system_prompt"]`` (a task mixture's, :mod:`rlvr.tasks.mixture`: each source keeps
            its answer format) uses that instead of ``system_prompt``.
        system_prompt: the system instruction; ``None`` or ``""`` leaves the system turn out
            (for chat templates that reject a system role).

    Returns:
        ``[{"role": "system", "content": ...}, {"role": "user", "content": problem.question}]``.
    """
    messages: list[dict[str, str]] = []
    system_prompt = problem.metadata.get("system_prompt", system_prompt)
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": problem.question})
    return messages


def _tokenizer_name(tokenizer: Any) -> str:
    return str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)


def render_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """Render ``messages`` to the prompt string the model continues.

    Uses ``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``, so
    the string ends with the assistant header. Tokenize the result with ``add_special_tokens=False``
    (the template already holds any BOS token).

    Args:
        tokenizer: a Hugging Face tokenizer with a ``chat_template``.
        messages: as built by :func:`build_messages`.

    Returns:
        The rendered prompt text.

    Raises:
        ConfigError: the tokenizer has no chat template (names the tokenizer), or the template
            rejects the messages (e.g. no system role: set ``task.system_prompt=""``).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"tokenizer {_tokenizer_name(tokenizer)!r} has no chat template: use an instruct/chat model, "
            "or set tokenizer.chat_template (e.g. a ChatML template) before training"
        )
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # jinja2 TemplateError and friends
        raise ConfigError(
            f"the chat template of tokenizer {_tokenizer_name(tokenizer)!r} failed on the prompt "
            f"({type(exc).__name__}: {exc}); if it rejects a system turn, set task.system_prompt=\"\""
        ) from exc
    if not isinstance(text, str):
        raise ConfigError(
            f"tokenizer {_tokenizer_name(tokenizer)!r}: apply_chat_template(tokenize=False) returned "
            f"{type(text).__name__}, expected str"
        )
    return text

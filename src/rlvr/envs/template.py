"""Chat-template rendering for token-in/token-out episodes: the opening prompt, each observation's
tokens rendered once, and the start-up check that the template is append-only.

Token-in/token-out: the tokens the engine sampled stay in the trajectory exactly as sampled (never
decoded and re-encoded); an observation's tokens are the *difference* the chat template makes when the
observation is added to a fixed conversation, so the conversation the model sees grows only at its
end. This is exact only when the template renders a conversation as the concatenation of its turns:
templates that rewrite earlier turns (Qwen3 strips ``<think>`` blocks of earlier assistant turns) are
not, and :func:`check_append_only` refuses them at start-up, naming the template and the first
token where the two renderings differ.

Source: issue 26 item 2; the pitfalls it avoids are those of SkyRL #123 and verl #3960 (re-tokenised
conversations) and prime-rl #1334 / TRL #6361 (non-append-only templates).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from rlvr.errors import ConfigError
from rlvr.tasks.prompts import render_prompt

__all__ = ["ObservationRenderer", "check_append_only", "render_opening"]

_SENTINEL = "\u2063RLVR_ASSISTANT_TURN\u2063"
PROBE_TURN = "<think>\nt\n</think>\n\nA"
"""The model turn of the append-only probe: a reasoning block and an answer (templates that strip earlier
``<think>`` blocks render it differently once the conversation goes on)."""
_BASE_USER = {"role": "user", "content": "hi"}


def _name(tokenizer: Any) -> str:
    return str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, gen: bool) -> str:
    kw = {"tools": tools} if tools else {}
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen, **kw)
    except Exception as exc:  # jinja2 errors
        raise ConfigError(f"the chat template of tokenizer {_name(tokenizer)!r} failed on an environment's "
                          f"messages ({type(exc).__name__}: {exc})") from exc


TOOLS_NOTE = ("You can call these tools:\n<tools>\n{schemas}\n</tools>\nTo call one, write "
              '<tool_call>{{"name": <tool name>, "arguments": <JSON object>}}</tool_call>. '
              "When you have the result, answer without a tool call.")
"""What the system turn says about the tools when the chat template ignores ``tools=`` (Hermes format)."""


def render_opening(tokenizer: Any, messages: list[dict[str, Any]], tools: Any = None) -> str:
    """The prompt text of an episode's opening ``messages`` (with the generation prompt).

    Without ``tools`` this is :func:`rlvr.tasks.prompts.render_prompt`, the single-turn samplers'
    rendering. With ``tools`` they go through the template's ``tools=``; a template that ignores it
    (renders the same text) gets them in the system turn instead (:data:`TOOLS_NOTE`, interpretation:
    a model cannot call tools it was never shown).
    """
    plain = render_prompt(tokenizer, messages)
    if not tools:
        return plain
    text = _render(tokenizer, messages, tools, True)
    if text != plain:
        return text
    note = TOOLS_NOTE.format(schemas="\n".join(json.dumps(t) for t in tools))
    msgs = [dict(m) for m in messages]
    if msgs and msgs[0].get("role") == "system":
        msgs[0]["content"] = f"{msgs[0]['content']}\n\n{note}"
    else:
        msgs.insert(0, {"role": "system", "content": note})
    return render_prompt(tokenizer, msgs)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


class ObservationRenderer:
    """Tokens of an observation appended after a model turn, rendered once with the chat template.

    ``base`` = ``[user, assistant(SENTINEL)]``. The template's text after the assistant content is its
    end-of-turn ``tail`` (ChatML: ``<|im_end|>\\n``). An observation's text is ``tail`` (without the
    end-of-sequence text when the model's turn already ended with it) followed by
    ``render(base + observation, generation prompt) − render(base)``.

    Args:
        tokenizer: the policy's tokenizer (with a chat template).
        eos_text: the text of the end-of-sequence token the engine stops on (``tokenizer.eos_token``).
        tools: JSON schemas the opening prompt was rendered with (the same here, so the tool section
            of the system turn cannot differ).

    Raises:
        ConfigError: the template cannot render an assistant turn, or does not render ``base`` as a
            prefix of ``base + observation`` (not append-only).
    """

    def __init__(self, tokenizer: Any, eos_text: str | None, tools: Any = None) -> None:
        self.tokenizer = tokenizer
        self.tools = tools
        self.eos_text = eos_text or ""
        base = [_BASE_USER, {"role": "assistant", "content": _SENTINEL}]
        text = _render(tokenizer, base, tools, False)
        if _SENTINEL not in text:
            raise ConfigError(f"the chat template of tokenizer {_name(tokenizer)!r} drops the content of an "
                              "assistant turn: a multi-turn episode cannot be rendered with it")
        self.base = base
        self.base_text = text
        self.tail = text[text.index(_SENTINEL) + len(_SENTINEL):]

    def text(self, observation: list[dict[str, Any]], after_eos: bool) -> str:
        """The text appended for ``observation``; ``after_eos``: the model's turn ended with EOS."""
        full = _render(self.tokenizer, self.base + list(observation), self.tools, True)
        if not full.startswith(self.base_text):
            raise ConfigError(f"the chat template of tokenizer {_name(self.tokenizer)!r} is not append-only: "
                              "adding an observation changes the rendering of the turns before it")
        tail = self.tail
        if after_eos and self.eos_text and tail.startswith(self.eos_text):
            tail = tail[len(self.eos_text):]
        return tail + full[len(self.base_text):]

    def tokens(self, observation: list[dict[str, Any]], after_eos: bool) -> list[int]:
        """Token ids of :meth:`text` (tokenised alone, no special tokens added)."""
        return _encode(self.tokenizer, self.text(observation, after_eos))


def check_append_only(tokenizer: Any, eos_token_id: int, roles: Sequence[str] = ("user",), tools: Any = None,
                      opening: list[dict[str, Any]] | None = None) -> None:
    """Refuse a chat template whose incremental episode tokens differ from its whole-conversation rendering.

    For each observation role, a probe conversation ``opening + assistant(PROBE_TURN) + role("B")`` is
    tokenised two ways: (1) rendered whole, with the generation prompt, (2) the way an episode builds it:
    the opening prompt's tokens, the model's turn :data:`PROBE_TURN` + EOS, then
    :meth:`ObservationRenderer.tokens` of ``B``. They must be equal token for token.

    Raises:
        ConfigError: (exit 2) naming the template (the tokenizer), the role, the first differing
            position and the tokens there.
    """
    opening = opening or [_BASE_USER]
    eos = tokenizer.convert_ids_to_tokens(int(eos_token_id))
    renderer = ObservationRenderer(tokenizer, tokenizer.decode([int(eos_token_id)]), tools)
    for role in roles:
        obs = [{"role": role, "content": "B"}]
        whole = _encode(tokenizer, _render(tokenizer, opening + [{"role": "assistant", "content": PROBE_TURN}] + obs,
                                           tools, True))
        steps = (_encode(tokenizer, _render(tokenizer, opening, tools, True)) + _encode(tokenizer, PROBE_TURN)
                 + [int(eos_token_id)] + renderer.tokens(obs, after_eos=True))
        if whole != steps:
            k = next((i for i, (a, b) in enumerate(zip(whole, steps)) if a != b), min(len(whole), len(steps)))
            def tok(ids: list[int]) -> str:
                return repr(tokenizer.convert_ids_to_tokens(ids[k])) if k < len(ids) else "(end)"
            raise ConfigError(
                f"the chat template of tokenizer {_name(tokenizer)!r} is not append-only for a {role!r} "
                f"observation after an assistant turn ending in {eos!r}: rendering the whole conversation and "
                f"appending turn by turn first differ at token {k} (whole: {tok(whole)}, appended: {tok(steps)}). "
                "Multi-turn training needs the tokens the model saw to be the tokens it is trained on; use a "
                "template that renders earlier turns unchanged (e.g. one that does not strip <think> blocks)"
            )

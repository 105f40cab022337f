"""Testbed where tool use must be learned (issue 26 item 7): a ``transform`` tool, its tokens and chat template.

A tools spec (:class:`rlvr.testbed.model.TestbedSpec` with ``tool_frac > 0``) pre-trains on single-op
problems at levels ``1..hard_max_level``. Levels up to ``max_level`` are answered directly with letter
noise ``noise``; at the hard levels ``max_level+1..hard_max_level`` a fraction ``tool_frac`` of the
sequences is a whole tool episode and the rest a direct answer with noise ``hard_noise`` (near-zero
pass@1). A tool episode, as the ``tools`` environment and :data:`CHAT_TEMPLATE` render it::

    <|im_start|>R:abcdefgh=<CALL>R:abcdefgh<END><|im_end|>>hgfedcba=hgfedcba<|im_end|>

``<CALL>`` and ``<END>`` are single tokens (:data:`CALL_OPEN`, :data:`CALL_CLOSE`) whose text makes a
Hermes call ``<tool_call>{"name": "transform", "arguments": {"query": "R:abcdefgh"}}</tool_call>``;
``>`` opens the tool's reply and ``=`` asks for the answer. Only the model's tokens (the call, the
answer, their EOS) carry labels. So the pre-trained policy calls the tool on about ``tool_frac`` of the
hard problems, and copying the tool's reply (which a 0.3 M model does well) is the only way it answers
them; GRPO has the tool-call rate to raise.

Source: interpretation of issue 26 item 7 ("hard levels the 0.3 M policy cannot answer directly but can
with a tool, pre-trained so that it calls the tool only sometimes"); the call format is Hermes'
(:func:`rlvr.envs.tools.parse_hermes`).
"""

from __future__ import annotations

import random
from typing import Any

from rlvr.testbed.task import ALPHABET, OPS

CALL_OPEN = '<tool_call>{"name": "transform", "arguments": {"query": "'
"""One token: the start of a Hermes call of :func:`transform` up to its ``query`` string."""
CALL_CLOSE = '"}}</tool_call>'
"""One token: the end of that call."""
TOOL_MARK = ">"
"""Character opening a tool reply in the tools chat template."""
TOOL_CHARS = TOOL_MARK
"""Characters the tools vocabulary adds after v2's (appended, so earlier token ids are unchanged)."""
CHAT_TEMPLATE = (
    "{{ '<|im_start|>' }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ message['content'] }}{{ '=' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] }}{{ '<|im_end|>' }}"
    "{% elif message['role'] == 'tool' %}{{ '>' }}{{ message['content'] }}{{ '=' }}{% endif %}"
    "{% endfor %}"
)
"""Append-only template of the tools testbed: user ``q=``, assistant ``text<|im_end|>``, tool ``>reply=``
(system turns and ``tools=`` are not rendered: the policy learned the one tool in pre-training). A
single-turn prompt renders as the v1 template's (``<|im_start|>R:abc=``)."""


def transform(query: str) -> str:
    """Apply a testbed operation to a string and return the result.

    Args:
        query: an operation code and a string, e.g. "R:abcde" (R reverse, C shift, S sort, D reverse then shift).
    """
    op, sep, s = str(query).partition(":")
    if not sep or op not in OPS or not s or any(c not in ALPHABET for c in s):
        raise ValueError(f"query must look like 'R:abcde' (op in {''.join(OPS)}, letters {ALPHABET}), got {query!r}")
    return OPS[op](s)


def tool_example(rng: random.Random, spec: Any) -> list[tuple[str, bool]]:
    """One pre-training sequence of a tools ``spec`` as ``(text, trained)`` segments, without the
    leading ``<|im_start|>``; a trained segment's tokens carry labels. See the module docstring.

    Raises:
        ValueError: an unknown op in ``spec.ops``.
    """
    level = rng.randint(1, max(spec.max_level, spec.hard_max_level))
    op = rng.choice(spec.ops)
    if op not in OPS:
        raise ValueError(f"unknown testbed op {op!r}; known: {''.join(OPS)}")
    s = "".join(rng.choice(ALPHABET) for _ in range(level))
    q, gold = f"{op}:{s}", OPS[op](s)
    hard = level > spec.max_level
    if hard and rng.random() < spec.tool_frac:
        return [(f"{q}=", False), (f"{CALL_OPEN}{q}{CALL_CLOSE}<|im_end|>", True), (f"{TOOL_MARK}{gold}=", False),
                (f"{gold}<|im_end|>", True)]
    p = spec.hard_noise if hard else spec.noise
    ans = "".join(rng.choice(ALPHABET) if rng.random() < p else c for c in gold)
    return [(f"{q}=", False), (f"{ans}<|im_end|>", True)]

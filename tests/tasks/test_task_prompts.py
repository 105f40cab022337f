"""System prompt and chat-template rendering with an in-process ChatML tokenizer (no downloads)."""

from __future__ import annotations

import pytest

from rlvr.errors import ConfigError
from rlvr.tasks import DEFAULT_SYSTEM_PROMPT, Problem, build_messages, extract_answer_with_source, render_prompt

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _tokenizer(template: str | None):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "hello": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>", name_or_path="tiny-chatml-test"
    )
    fast.chat_template = template
    return fast


P = Problem(uid="p1", question="What is 3 + 4?", answer="7")


def test_default_prompt_fixes_boxed_format_with_example():
    assert "\\boxed{" in DEFAULT_SYSTEM_PROMPT and "last line" in DEFAULT_SYSTEM_PROMPT
    # the example itself is extractable as a boxed answer
    assert extract_answer_with_source(DEFAULT_SYSTEM_PROMPT)[1] == "boxed"
    assert len(DEFAULT_SYSTEM_PROMPT) < 300


def test_build_messages():
    assert build_messages(P, "sys") == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "What is 3 + 4?"},
    ]
    assert build_messages(P, "") == [{"role": "user", "content": "What is 3 + 4?"}]


def test_render_prompt_chatml():
    text = render_prompt(_tokenizer(CHATML), build_messages(P, "Be brief."))
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_render_prompt_without_template_names_tokenizer():
    with pytest.raises(ConfigError, match="'tiny-chatml-test' has no chat template"):
        render_prompt(_tokenizer(None), build_messages(P, "x"))


def test_render_prompt_template_error_is_config_error():
    tmpl = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    with pytest.raises(ConfigError, match="system_prompt"):
        render_prompt(_tokenizer(tmpl), build_messages(P, "x"))

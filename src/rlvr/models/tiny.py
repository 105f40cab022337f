"""The tiny in-process policy for tests and smoke runs: a byte-level BPE tokenizer with ChatML markers
trained on a synthetic corpus (:func:`build_tiny_tokenizer`) and a random ~0.1 M-parameter llama on it
(:func:`build_tiny_model`; ``model.name_or_path=tiny`` loads it through :func:`rlvr.models.load_policy`).

Separate from :mod:`rlvr.models` (which loads real checkpoints by name) because it builds a model from
nothing, offline and deterministically, and changes with what the tests need (sizes, extra tokens),
not with model sources or file formats. Re-exported from :mod:`rlvr.models`.
"""

from __future__ import annotations

import functools
import random
from typing import Any

import torch

TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _synthetic_corpus(n: int = 3000, seed: int = 1234) -> list[str]:
    """Strings the tiny tokenizer is trained on: digits, arithmetic, tags and ChatML turns."""
    rng = random.Random(seed)
    ops = ["+", "-", "*", "/"]
    words = [
        "What is", "Compute", "Calculate", "The answer is", "Answer:", "so", "then", "result",
        "sum", "total", "think", "step", "Let", "us", "add", "the", "numbers", "equals",
    ]
    out: list[str] = []
    for _ in range(n):
        k = rng.randint(2, 4)
        nums = [str(rng.randint(0, 10 ** rng.randint(1, 3))) for _ in range(k)]
        expr = f" {rng.choice(ops)} ".join(nums)
        val = str(rng.randint(-999, 9999))
        kind = rng.random()
        if kind < 0.4:
            out.append(
                f"<|im_start|>user\n{rng.choice(words[:3])} {expr}?<|im_end|>\n"
                f"<|im_start|>assistant\n{rng.choice(words[3:5])} <answer>{val}</answer><|im_end|>\n"
            )
        elif kind < 0.7:
            out.append(f"{expr} = {val}")
        else:
            out.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 8))) + f" {val}.")
    return out


@functools.lru_cache(maxsize=8)
def _tiny_tokenizer_json(vocab_size: int = 512) -> str:
    """Train the tiny byte-level BPE once per process; return it serialised (callers get fresh copies)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(_synthetic_corpus(), trainer=trainer)
    return tk.to_str()


def build_tiny_tokenizer(vocab_extra: list[str] | None = None, *, vocab_size: int = 512) -> Any:
    """A small byte-level BPE tokenizer with ChatML markers, trained in-process (no file, offline).

    Special tokens: ``<|endoftext|>`` (id 0), ``<|im_start|>`` (1), ``<|im_end|>`` (2, eos and pad).
    ``chat_template`` renders ChatML (no default system prompt). The BPE is trained once per process
    (~1 s) on :func:`_synthetic_corpus`; every call returns a fresh ``PreTrainedTokenizerFast``.

    Args:
        vocab_extra: extra strings added as whole tokens after the trained vocabulary (e.g. tags).
        vocab_size: BPE target size, special tokens included (≥ 259: 256 bytes + 3 specials).

    Returns:
        ``PreTrainedTokenizerFast`` with ``len(tok) == vocab_size + len(new vocab_extra)``
        (exactly ``vocab_size`` when the corpus allows that many merges).
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tiny_tokenizer_json(vocab_size)),
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    tok.chat_template = TINY_CHAT_TEMPLATE
    tok.padding_side = "left"
    if vocab_extra:
        tok.add_tokens(list(vocab_extra))
    return tok


def build_tiny_model(
    seed: int = 0,
    *,
    vocab_extra: list[str] | None = None,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 1024,
    initializer_range: float = 0.02,
    vocab_size: int = 512,
) -> tuple[Any, Any]:
    """A tiny random llama policy and its tokenizer, for tests (offline, ~1 s the first time).

    The model is a ``LlamaForCausalLM`` with tied embeddings, built under ``torch.manual_seed(seed)``
    (the global RNG state is restored afterwards), in float32, eval mode, on CPU. The same arguments
    give bit-identical weights. With the defaults it has ~0.1 M parameters.

    Args:
        seed: weight-initialisation seed.
        vocab_extra: extra whole-word tokens for the tokenizer (see :func:`build_tiny_tokenizer`).
        hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size, max_position_embeddings:
            the ``LlamaConfig`` sizes (``hidden_size`` divisible by ``num_heads``, ``num_heads`` by
            ``num_kv_heads``).
        initializer_range: std of the normal weight init; larger values give peakier next-token
            distributions.
        vocab_size: BPE size of the tokenizer.

    Returns:
        ``(model, tokenizer)``; ``model.config.vocab_size == len(tokenizer)``, eos = pad = ``<|im_end|>``.
    """
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tok = build_tiny_tokenizer(vocab_extra, vocab_size=vocab_size)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    rng_state = torch.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    finally:
        torch.set_rng_state(rng_state)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    model.eval()
    return model, tok


def build_tiny_reward_model(seed: int = 0, *, num_labels: int = 1, hidden_size: int = 32,
                            num_layers: int = 1) -> tuple[Any, Any]:
    """A tiny random sequence-classification llama and its tokenizer, for reward-model tests and the
    offline ``rewards: [{type: reward_model, name_or_path: tiny}]`` (offline, deterministic).

    ``LlamaForSequenceClassification`` (its score is the head's output at the last non-pad token), built
    under ``torch.manual_seed(seed)`` with the global RNG state restored, float32, eval mode, CPU, on
    :func:`build_tiny_tokenizer` (``config.pad_token_id`` set, so batches of several rows work).

    Returns:
        ``(model, tokenizer)``; ``model(**enc).logits`` is ``[B, num_labels]``.
    """
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tok = build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        num_labels=num_labels, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    rng_state = torch.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = LlamaForSequenceClassification(config)
    finally:
        torch.set_rng_state(rng_state)
    model.eval()
    return model, tok

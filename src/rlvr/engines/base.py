"""The engine protocol: the one seam between samplers and generation backends.

An engine turns token-id contexts into sampled continuations with their behaviour log-probs. Samplers
(group, tree, feedback) depend only on this protocol, so a backend (transformers today, vLLM later)
can be swapped without touching them.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import torch

from rlvr.types import Generation, GenerationRequest, SamplingParams


@runtime_checkable
class Engine(Protocol):
    """A generation backend.

    Attributes:
        eos_token_ids: token ids that end a sequence; a sampled one is kept as the last token of
            :attr:`Generation.token_ids` and gives ``finish_reason == "eos"``.
    """

    eos_token_ids: set[int]

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[list[Generation]]:
        """Continue each request's context ``request.n`` times.

        Args:
            requests: contexts (prompt ids, optionally followed by an already generated prefix) and
                how many continuations each needs.
            params: temperature, top-p, top-k, token cap and optional seed (same seed, same inputs →
                same outputs).

        Greedy contract (every engine): ``params.temperature == 0`` means greedy decoding — each
        step takes the argmax of the model's raw next-token logits, ``top_p``/``top_k`` are
        ignored, ties go to the lowest token id, no randomness is consumed (the seed is
        irrelevant), the ``n`` continuations of a request are identical, and each token's
        behaviour log-prob is ``0.0`` (the log of the point mass it was drawn from). Training
        refuses temperature 0 at config time (GRPO needs distinct samples within a group), so
        greedy is an evaluation mode. ``temperature < 0`` is an error.

        Returns:
            One list per request, in request order, of exactly ``request.n`` :class:`Generation`\\ s
            holding only the new tokens, their behaviour log-probs and the finish reason.

        Raises:
            ValueError: an empty context, ``n < 1`` or invalid sampling parameters (``temperature < 0``).
        """
        ...

    def load_weights(self, state_dict: Mapping[str, torch.Tensor] | Any) -> None:
        """Make the engine sample from the given policy weights (called after optimizer updates).

        Args:
            state_dict: parameter name → tensor, in the policy's own naming.

        Raises:
            KeyError: a name the engine's model does not have.
        """
        ...


def engine_eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """The tokenizer's eos id plus the model's ``generation_config.eos_token_id`` (int or list).

    Interpretation: as transformers' ``generate``, every id in ``generation_config.eos_token_id`` ends a
    sequence (chat models list their end-of-turn token there), and the tokenizer's own eos does too.
    Shared by every engine (here, beside the protocol, so that no engine imports the factory).
    """
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen is not None:
        ids.update(int(i) for i in ([gen] if isinstance(gen, int) else gen))
    return ids

"""The flat group sampler: ``G`` i.i.d. completions per prompt (GRPO, Dr.GRPO, DAPO).

Source: GRPO (Shao et al. 2024, DeepSeekMath §4.1) — a group of G outputs per question.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import torch

from rlvr.engines.base import Engine
from rlvr.tasks.prompts import build_messages, render_prompt
from rlvr.types import Generation, GenerationRequest, RolloutBatch, SamplingParams


class PromptEncoder:
    """Renders a problem through the chat template and tokenizes it, once per problem.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        system_prompt: the system instruction that fixes the answer format.
        max_prompt_length: prompts longer than this many tokens keep their last
            ``max_prompt_length`` tokens (left truncation, as TRL does) and are counted.
    """

    def __init__(self, tokenizer: Any, system_prompt: str, max_prompt_length: int) -> None:
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.max_prompt_length = max_prompt_length
        self.truncated = 0
        self.unencodable = 0  # characters mapped to the unknown token, over every prompt encoded
        self._cache: dict[tuple[str, str], list[int]] = {}

    def _count_unencodable(self, problem: Any, text: str, ids: list[int]) -> None:
        """Count the characters the tokenizer mapped to its unknown token (a character-level vocabulary such
        as the testbed's meets ``é`` or a digit); warn on the first prompt that has any (issue 25, item 4.15:
        such a run trained silently on prompts the policy never saw as written)."""
        unk_id, unk = getattr(self.tokenizer, "unk_token_id", None), getattr(self.tokenizer, "unk_token", None)
        if unk_id is None:
            return
        n = ids.count(unk_id) - (text.count(unk) if unk else 0)
        if n <= 0:
            return
        self.unencodable += n
        if self.unencodable == n:  # the first prompt with any
            vocab, plain = self.tokenizer.get_vocab(), text
            for special in getattr(self.tokenizer, "all_special_tokens", []):
                plain = plain.replace(special, "")
            chars = sorted({c for c in plain if c not in vocab})[:8]
            warnings.warn(
                f"prompt of problem {problem.uid!r} has {n} character(s) the tokenizer cannot encode "
                f"({', '.join(map(repr, chars))}), each replaced by its unknown token {unk!r}; the model sees "
                "those prompts garbled (check the data against the tokenizer's vocabulary)",
                stacklevel=3,
            )

    def text(self, problem: Any) -> str:
        """The rendered prompt string of ``problem``."""
        return render_prompt(self.tokenizer, build_messages(problem, self.system_prompt))

    def __call__(self, problem: Any) -> list[int]:
        """Token ids of the rendered prompt of ``problem`` (cached by uid and question text)."""
        key = (problem.uid, problem.question)
        ids = self._cache.get(key)
        if ids is None:
            text = self.text(problem)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            self._count_unencodable(problem, text, ids)
            if len(ids) > self.max_prompt_length:
                self.truncated += 1
                if self.truncated == 1:
                    warnings.warn(
                        f"prompt of problem {problem.uid!r} has {len(ids)} tokens > max_prompt_length="
                        f"{self.max_prompt_length}; keeping the last {self.max_prompt_length}",
                        stacklevel=2,
                    )
                ids = ids[-self.max_prompt_length :]
            self._cache[key] = ids
        return ids


def generations_to_batch(
    contexts: Sequence[Sequence[int]],
    generations: Sequence[Generation],
    *,
    group_ids: Sequence[int],
    prompt_index: Sequence[int],
    problems: list[Any],
    pad_token_id: int,
    temperature: float,
    policy_version: int,
) -> RolloutBatch:
    """Pack ``N`` generations into a :class:`RolloutBatch` (right-padded ``[N, T]``).

    ``T`` is the longest generation (at least 1). ``sampler_logp`` holds the engine's behaviour
    log-probs; ``logprob_temperature`` equals the sampling temperature (TRL/verl convention,
    ``grpo_core.md`` §4). When the engine recorded per-token versions (partial rollouts:
    :attr:`Generation.versions`), they fill ``token_version`` ``[N, T]`` and each row's ``policy_version``
    is its oldest token's (interpretation: a row is as stale as its stalest token; ``docs/streaming.md``);
    otherwise every row is ``policy_version``.
    """
    n = len(generations)
    width = max([len(g.token_ids) for g in generations] + [1])
    ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.float32)
    slogp = torch.zeros((n, width), dtype=torch.float32)
    per_token = any(g.versions is not None for g in generations)
    tver = torch.zeros((n, width), dtype=torch.long) if per_token else None
    row_version = torch.full((n,), int(policy_version), dtype=torch.long)
    for i, g in enumerate(generations):
        k = len(g.token_ids)
        if k:
            ids[i, :k] = torch.tensor(g.token_ids, dtype=torch.long)
            mask[i, :k] = 1.0
            slogp[i, :k] = torch.tensor(g.logprobs, dtype=torch.float32)
        if tver is not None:
            v = g.versions if g.versions is not None else [int(policy_version)] * k
            if len(v) != k:
                raise ValueError(f"generation {i}: {len(v)} token versions for {k} tokens")
            if k:
                tver[i, :k] = torch.tensor(v, dtype=torch.long)
                row_version[i] = min(v)
    return RolloutBatch(
        context_ids=[list(c) for c in contexts],
        completion_ids=ids,
        completion_mask=mask,
        group_id=torch.tensor(list(group_ids), dtype=torch.long),
        prompt_index=torch.tensor(list(prompt_index), dtype=torch.long),
        is_truncated=torch.tensor([g.finish_reason == "length" for g in generations], dtype=torch.bool),
        sampling_temperature=torch.full((n,), float(temperature)),
        logprob_temperature=torch.full((n,), float(temperature)),
        policy_version=row_version,
        sampler_logp=slogp,
        problems=problems,
        token_version=tver,
    )


class GroupSampler:
    """Draws ``num_generations`` completions for each prompt through an :class:`Engine`.

    Each prompt's context is sent once with ``n = num_generations`` so the engine can prefill it
    once and share it across the group.

    Args:
        engine: the generation backend.
        encoder: a :class:`PromptEncoder`.
        pad_token_id: id used to right-pad completions.
    """

    def __init__(self, engine: Engine, encoder: PromptEncoder, pad_token_id: int) -> None:
        self.engine = engine
        self.encoder = encoder
        self.pad_token_id = pad_token_id

    def sample(
        self,
        problems: Sequence[Any],
        num_generations: int,
        params: SamplingParams,
        *,
        policy_version: int = 0,
        first_group_id: int = 0,
    ) -> RolloutBatch:
        """``len(problems) × num_generations`` rollouts; group ``first_group_id + p`` is problem ``p``.

        Returns a batch without rewards (see :class:`rlvr.rewards.Scorer`).
        """
        contexts = [self.encoder(p) for p in problems]
        requests = [GenerationRequest(context_ids=c, n=num_generations) for c in contexts]
        outputs = self.engine.generate(requests, params)
        flat, ctx, gids, pidx = [], [], [], []
        for p, (c, gens) in enumerate(zip(contexts, outputs)):
            if len(gens) != num_generations:
                raise RuntimeError(
                    f"engine returned {len(gens)} generations for prompt {p}, expected {num_generations}"
                )
            for g in gens:
                flat.append(g)
                ctx.append(c)
                gids.append(first_group_id + p)
                pidx.append(p)
        return generations_to_batch(
            ctx,
            flat,
            group_ids=gids,
            prompt_index=pidx,
            problems=list(problems),
            pad_token_id=self.pad_token_id,
            temperature=params.temperature,
            policy_version=policy_version,
        )

"""Fixtures of the environment tests: a scripted engine (exact, instant) and sampler builders."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from rlvr.envs import Step
from rlvr.samplers.group import PromptEncoder
from rlvr.samplers.multiturn import EpisodeLimits, MultiTurnSampler
from rlvr.types import Generation

EOS = 2


class ScriptedEngine:
    """An engine whose turn ``k`` (counted per context length seen) answers ``script(context)`` token ids;
    each sampled token's log-prob is ``-0.5``. Records every call as a list of ``(context, n, cap)``."""

    def __init__(self, script: Callable[[list[int]], list[int]]) -> None:
        self.script = script
        self.eos_token_ids = {EOS}
        self.calls: list[list[tuple[list[int], int, int | None]]] = []

    def generate(self, requests, params):
        self.calls.append([(list(r.context_ids), r.n, r.max_new_tokens) for r in requests])
        out = []
        for r in requests:
            cap = r.max_new_tokens or params.max_new_tokens
            gens = []
            for _ in range(r.n):
                toks = list(self.script(list(r.context_ids)))[:cap]
                finish = "eos" if toks and toks[-1] == EOS else "length"
                gens.append(Generation(toks, [-0.5] * len(toks), finish))
            out.append(gens)
        return out


class CountingEnv:
    """Never done before ``turns`` steps; observation ``"obs <k>"`` as a user turn; reward 0.25 per step."""

    def __init__(self, turns: int = 3) -> None:
        self.turns, self.k = turns, 0

    def reset(self, problem):
        return [{"role": "user", "content": problem.question}]

    def step(self, action):
        self.k += 1
        done = self.k >= self.turns
        obs = [] if done else [{"role": "user", "content": f"obs {self.k}"}]
        return Step(obs, 0.25, done, info={"correct": done})


@pytest.fixture
def make_sampler(tiny):
    """``make_sampler(engine, env_factory, max_turns=, max_tokens=, timeout_s=)`` on the tiny tokenizer."""
    _, tok = tiny

    def make(engine: Any, env_factory: Callable[[], Any], *, max_turns: int = 4, max_tokens: int = 200,
             timeout_s: float = 0.0, max_prompt_length: int = 64) -> MultiTurnSampler:
        enc = PromptEncoder(tok, "", max_prompt_length)
        return MultiTurnSampler(engine, tok, env_factory, EpisodeLimits(max_turns, max_tokens, timeout_s), enc, EOS)

    return make

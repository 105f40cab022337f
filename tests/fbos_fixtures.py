"""Shared FBOS-RL test fixtures: an addition task with label-free feedback and a scripted engine.

Used by ``tests/samplers/test_feedback_sampler.py`` (the sampler alone) and
``tests/schedules/test_fbos_schedule.py`` (sampler + schedule inside a trainer); import it as
``from fbos_fixtures import ...`` (``tests/`` is on ``sys.path`` through its ``conftest.py``, as for
``fake_vllm_server``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rlvr.tasks.base import Problem, Verdict
from rlvr.tasks.feedback import make_feedback
from rlvr.types import Generation

MARK = "<previous_attempt>"
"""Present in a feedback-augmented prompt (FAP) and in no original prompt."""

Script = Callable[[str, int], str]
"""``script(context_text, k) -> completion text``; ``k`` is the generation's index within the current
``generate()`` call (0-based, over all its requests), so a script is the same for a fresh engine (a
resumed run) as for the engine that generated the earlier rounds."""


@dataclass
class AddTask:
    """``n`` problems "What is i + 4?"; correct iff the completion is exactly the answer; label-free
    feedback from :func:`rlvr.tasks.feedback.make_feedback`."""

    n: int = 8
    name: str = "add"
    system_prompt: str = "Answer with a number."

    def problems(self, split):
        return [Problem(uid=f"{split}-{i}", question=f"What is {i} + 4?", answer=str(i + 4)) for i in range(self.n)]

    def verify(self, problem, completion):
        got = completion.strip()
        ok = got == problem.answer
        return Verdict(score=float(ok), correct=ok, feedback=make_feedback(got or None, "boxed" if got else "none", ok))


def answer_in(context: str) -> str:
    """The right answer to the (last) "What is i + 4?" question in a decoded context."""
    return str(int(context.rsplit("What is ", 1)[1].split(" + 4")[0]) + 4)


class ScriptedEngine:
    """An engine whose completions are ``script(context_text, k)`` (see :data:`Script`), each followed by
    EOS, with every token's behaviour log-prob ``logprob``. Records every request in :attr:`requests`."""

    def __init__(self, tok, script: Script, logprob: float = -0.5):
        self.tok, self.script, self.logprob = tok, script, logprob
        self.eos_token_ids = {tok.eos_token_id}
        self.requests = []

    def generate(self, requests, params):
        out, k = [], 0
        for r in requests:
            self.requests.append(r)
            ctx = self.tok.decode(r.context_ids)
            gens = []
            for _ in range(r.n):
                text = self.script(ctx, k)
                k += 1
                ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
                gens.append(Generation(token_ids=ids, logprobs=[self.logprob] * len(ids), finish_reason="eos"))
            out.append(gens)
        return out


def first_fap_correct(answer: str | None = None, wrong: str = "wrong 99") -> Script:
    """A script: in each ``generate()`` call the first FAP-conditioned generation answers correctly
    (``answer``, or :func:`answer_in` its context); every other generation answers ``wrong``."""
    state = {"done": False}

    def script(ctx, k):
        if k == 0:
            state["done"] = False
        if MARK in ctx and not state["done"]:
            state["done"] = True
            return answer if answer is not None else answer_in(ctx)
        return wrong

    return script

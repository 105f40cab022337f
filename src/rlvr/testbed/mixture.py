"""Pre-training examples of the testbed v2 policy (issue 17 §2): chains, hard levels and corrections.

A v2 spec (:class:`rlvr.testbed.model.TestbedSpec` with ``chain_steps > 1``, ``hard_max_level``
or ``feedback_frac``) pre-trains on a mixture of

* **chains** of 1..``chain_steps`` ops, answered step by step (``RC:abc=cba|dcb``). Label noise
  hits only the *first* step; later steps are computed from the noisy first step, so the policy
  learns to carry an early mistake through and the first step decides correctness (what IB-TPO's
  branching at high-IB steps can exploit);
* **hard levels** ``max_level+1 .. hard_max_level`` with per-letter noise ``hard_noise`` (instead of
  ``noise``): pass@1 there is near 0 but not exactly 0, so many samples at a raised temperature can
  find a correct answer (what UEC-RL's tempered exploration needs);
* **corrections** (a fraction ``feedback_frac``): ``<problem>=<failed attempt>!<k>=<answer>``, where
  ``k`` is the first wrong position of the attempt as digits (the testbed task's
  ``feedback="position"`` verdict) and the answer carries per-letter noise ``feedback_noise``. A
  feedback-augmented prompt in this form (FBOS-RL, ``fbos.fap_template`` = :data:`FAP_TEMPLATE`)
  therefore rescues a failed prompt with a probability set by ``feedback_noise`` and the level.

Source: interpretation of issue 17 §2 ("a fraction of pre-training sequences of the form attempt +
feedback → corrected answer"; "levels where pass@1 ≈ 0 but pass@64 at T ≈ 1.2 is clearly > 0";
"answers made of steps with separators, where an early step decides correctness").
"""

from __future__ import annotations

import random
from typing import Any

from rlvr.testbed.task import ALPHABET, OPS, STEP_SEP, chain_answer, chain_steps, first_wrong_position

FEEDBACK_MARK = "!"
"""Token between a failed attempt and the position of its first error."""
FAP_TEMPLATE = "{problem}={attempt}" + FEEDBACK_MARK + "{feedback}"
"""``fbos.fap_template`` for the v2 testbed: with the chat template (``<|im_start|>`` + user turn +
``=``) a FAP renders exactly as a pre-training correction prompt, ``<|im_start|>R:abc=cbb!3=``."""
V2_CHARS = "0123456789" + FEEDBACK_MARK + STEP_SEP
"""Characters the v2 vocabulary adds to v1's (appended, so v1 token ids are unchanged)."""


def _noisy(rng: random.Random, s: str, p: float) -> str:
    """Replace each letter of ``s`` by a uniformly random letter with probability ``p`` (separators kept)."""
    if p <= 0:
        return s
    return "".join(rng.choice(ALPHABET) if c in ALPHABET and rng.random() < p else c for c in s)


def failed_attempt(rng: random.Random, gold: str, p: float) -> str:
    """A wrong answer near ``gold``: each letter replaced with probability ``p``; if nothing changed,
    one random letter is changed to a different one. Never equal to ``gold``."""
    out = _noisy(rng, gold, p)
    if out == gold:
        idx = [i for i, c in enumerate(gold) if c in ALPHABET]
        i = rng.choice(idx)
        out = gold[:i] + rng.choice([c for c in ALPHABET if c != gold[i]]) + gold[i + 1:]
    return out


def v2_example(rng: random.Random, spec: Any) -> tuple[str, str]:
    """One pre-training ``(prompt_text, answer_text)`` of a v2 ``spec`` (prompt without ``<|im_start|>``,
    ending in ``=``; answer without EOS). See the module docstring for the mixture.

    Raises:
        ValueError: an unknown op in ``spec.ops``.
    """
    top = max(spec.max_level, spec.hard_max_level)
    level = rng.randint(1, top)
    steps = rng.randint(1, max(1, spec.chain_steps))
    chain = "".join(rng.choice(spec.ops) for _ in range(steps))
    if any(o not in OPS for o in chain):
        raise ValueError(f"unknown testbed op in {spec.ops!r}; known: {''.join(OPS)}")
    s = "".join(rng.choice(ALPHABET) for _ in range(level))
    q = f"{chain}:{s}"
    if spec.feedback_frac > 0 and rng.random() < spec.feedback_frac:
        gold = chain_answer(chain, s)
        attempt = failed_attempt(rng, gold, spec.attempt_noise)
        k = first_wrong_position(attempt, gold)
        first = _noisy(rng, OPS[chain[0]](s), spec.feedback_noise)
        target = STEP_SEP.join([first] + chain_steps(chain[1:], first))
        return f"{q}={attempt}{FEEDBACK_MARK}{k}=", target
    noise = spec.hard_noise if level > spec.max_level else spec.noise
    first = _noisy(rng, OPS[chain[0]](s), noise)
    return f"{q}=", STEP_SEP.join([first] + chain_steps(chain[1:], first))

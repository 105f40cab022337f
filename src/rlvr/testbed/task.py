"""The testbed's synthetic task family: string transformations with exact, verifiable answers.

A problem is an operation code and a string over a 10-letter alphabet, e.g. ``R:cadbe`` (reverse);
the answer is the transformed string (``ebdac``). Difficulty is the string length (``level`` =
length): each extra character is one more position the policy must get right, so the pass rate of
a model that is right with probability ``p`` per character falls like ``p ** level``, and levels
longer than anything seen in pre-training are out of reach (zero-pass groups).

Operations (``OPS``): ``R`` reverse, ``C`` shift every letter one step (``a→b``, ..., ``j→a``),
``S`` sort, ``D`` reverse then shift.

Testbed v2 (issue 17 §2) adds two knobs, both off by default so v1 problems are unchanged:

* ``steps`` > 1: a *chain* of ops, e.g. ``RC:abc`` (reverse, then shift); the answer lists every
  intermediate result separated by :data:`STEP_SEP`: ``cba|dcb``. Each step is a function of the
  previous one, so an error in the first step decides the outcome (IB-TPO's branching points).
* ``feedback="position"``: the verifier's feedback is the 1-based position of the first wrong
  character as digits (``"3"``), tokens the v2 policy saw in pre-training, instead of English text.

Source: interpretation: the issue asks for "multi-step arithmetic or string transformations with
verifiable answers, where harder levels are beyond the pre-trained model's reach"; string
transformations make every answer a string of known length, so difficulty is one integer and
the verifier is an exact comparison.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from rlvr.tasks.base import Problem, Split, Verdict, check_split

ALPHABET = "abcdefghij"
"""The letters problems are made of (10 characters)."""
STEP_SEP = "|"
"""Separator between the steps of a multi-step (chain) answer."""
FEEDBACK_MODES = ("text", "position")


def _shift(s: str) -> str:
    return "".join(ALPHABET[(ALPHABET.index(c) + 1) % len(ALPHABET)] for c in s)


OPS: dict[str, Callable[[str], str]] = {
    "R": lambda s: s[::-1],
    "C": _shift,
    "S": lambda s: "".join(sorted(s)),
    "D": lambda s: _shift(s[::-1]),
}
"""Operation code → transformation ``str -> str`` (same length in, same length out)."""


def make_example(rng: random.Random, level: int, ops: str, steps: int = 1) -> tuple[str, str]:
    """One ``(question, answer)`` pair at ``level`` (string length), ops drawn uniformly from ``ops``.

    ``steps == 1`` (v1): ``("R:abc", "cba")``, with exactly v1's RNG draws. ``steps > 1``: a chain of
    ``steps`` ops applied left to right, answer = the intermediate results joined by
    :data:`STEP_SEP` (``("RC:abc", "cba|dcb")``); see :func:`chain_answer`.

    Raises:
        ValueError: ``level < 1``, ``steps < 1`` or an unknown op code.
    """
    if level < 1:
        raise ValueError(f"testbed level must be ≥ 1, got {level}")
    if steps < 1:
        raise ValueError(f"testbed steps must be ≥ 1, got {steps}")
    chain = "".join(rng.choice(ops) for _ in range(steps))
    bad = [o for o in chain if o not in OPS]
    if bad:
        raise ValueError(f"unknown testbed op {bad[0]!r}; known: {''.join(OPS)}")
    s = "".join(rng.choice(ALPHABET) for _ in range(level))
    return f"{chain}:{s}", chain_answer(chain, s)


def chain_steps(chain: str, s: str) -> list[str]:
    """The intermediate results of applying the ops of ``chain`` to ``s`` in order (one per op)."""
    out = []
    for op in chain:
        s = OPS[op](s)
        out.append(s)
    return out


def chain_answer(chain: str, s: str) -> str:
    """The answer to ``chain:s``: :func:`chain_steps` joined by :data:`STEP_SEP` (``R``, ``abc`` → ``cba``)."""
    return STEP_SEP.join(chain_steps(chain, s))


def first_wrong_position(got: str, gold: str) -> int | None:
    """1-based position of the first character where ``got`` differs from ``gold`` (a missing or
    extra character counts as wrong at ``min(len) + 1``); ``None`` when they are equal."""
    if got == gold:
        return None
    for i, (x, y) in enumerate(zip(got, gold)):
        if x != y:
            return i + 1
    return min(len(got), len(gold)) + 1


@dataclass
class TestbedTask:
    """The testbed task as a :class:`rlvr.tasks.Task` (``task.type=testbed``).

    Args:
        min_level, max_level: string lengths drawn uniformly per problem (1 ≤ min ≤ max).
        ops: op codes to draw from (subset of ``"RCSD"``).
        train_size, eval_size: problems per split.
        seed, eval_seed: RNG seeds of the two splits (distinct seeds; held-out problems that
            happen to coincide with a training string are removed from the eval split).
        name: metric name of the task.
        steps: ops per problem (1 = v1; > 1 = multi-step chain answers, see :func:`make_example`).
        feedback: ``"text"`` (v1: ``"letter 3 is wrong"``) or ``"position"`` (v2: ``"3"``, the
            first wrong position as digits, the form the v2 policy's pre-training uses).

    ``verify`` gives 1 for an exact match (surrounding whitespace ignored), else 0; feedback names
    the first wrong position without revealing the answer.

    Raises:
        ValueError: bad levels, steps, op codes or feedback mode.
    """

    min_level: int = 4
    max_level: int = 6
    ops: str = "RC"
    train_size: int = 1000
    eval_size: int = 100
    seed: int = 0
    eval_seed: int = 10_000
    name: str = "testbed"
    system_prompt: str = ""
    steps: int = 1
    feedback: str = "text"

    __test__ = False  # not a pytest class

    def __post_init__(self) -> None:
        if not 1 <= self.min_level <= self.max_level:
            raise ValueError(f"testbed levels must satisfy 1 ≤ min_level ≤ max_level, got {self.min_level}..{self.max_level}")
        bad = [o for o in self.ops if o not in OPS]
        if bad or not self.ops:
            raise ValueError(f"testbed ops must be a non-empty subset of {''.join(OPS)!r}, got {self.ops!r}")
        if self.steps < 1:
            raise ValueError(f"testbed steps must be ≥ 1, got {self.steps}")
        if self.feedback not in FEEDBACK_MODES:
            raise ValueError(f"testbed feedback must be one of {FEEDBACK_MODES}, got {self.feedback!r}")
        self._cache: dict[str, list[Problem]] = {}

    def _make(self, split: str, seed: int, size: int, exclude: set[str]) -> list[Problem]:
        rng = random.Random(seed)
        out: list[Problem] = []
        tries = 0
        while len(out) < size and tries < size * 20:
            tries += 1
            level = rng.randint(self.min_level, self.max_level)
            q, a = make_example(rng, level, self.ops, self.steps)
            if q in exclude:
                continue
            out.append(Problem(uid=f"{split}-{len(out)}", question=q, answer=a, metadata={"level": level}))
        return out

    def problems(self, split: Split) -> list[Problem]:
        """All problems of ``split`` in a fixed order (deterministic for the seeds)."""
        check_split(split)
        if split not in self._cache:
            if split == "train":
                self._cache[split] = self._make("train", self.seed, self.train_size, set())
            else:
                train_q = {p.question for p in self.problems("train")}
                self._cache[split] = self._make("eval", self.eval_seed, self.eval_size, train_q)
        return self._cache[split]

    def verify(self, problem: Problem, completion: str) -> Verdict:
        """Exact match of the stripped completion against ``problem.answer``."""
        got = completion.strip()
        gold = problem.answer or ""
        if got == gold:
            return Verdict(score=1.0, correct=True, extracted=got, source="exact")
        if self.feedback == "position":
            fb = str(first_wrong_position(got, gold))
        elif len(got) != len(gold):
            fb = f"the answer should have {len(gold)} letters, got {len(got)}"
        else:
            i = next(i for i, (x, y) in enumerate(zip(got, gold)) if x != y)
            fb = f"letter {i + 1} is wrong"
        return Verdict(score=0.0, correct=False, feedback=fb, extracted=got, source="exact")


def testbed_task_from_config(cfg) -> TestbedTask:
    """``task.type=testbed``: a :class:`TestbedTask` from a ``TaskConfig``.

    ``task.config`` keys: ``min_level``, ``max_level`` (default 4..6), ``level`` (sets both, wins),
    ``ops`` (default ``"RC"``), ``steps`` (default 1), ``feedback`` (``text``/``position``); ``train_size``, ``eval_size``, ``seed``, ``eval_seed``,
    ``system_prompt`` come from the ``TaskConfig`` fields (``name`` defaults to ``testbed``).

    Raises:
        ConfigError: unknown ``task.config`` keys, bad levels or ops (names the key).
    """
    from rlvr.errors import ConfigError

    c = dict(cfg.config)
    bad = set(c) - {"min_level", "max_level", "level", "ops", "steps", "feedback"}
    if bad:
        raise ConfigError(f"task.config: unknown testbed keys {sorted(bad)}; valid: level, min_level, max_level, ops, "
                          "steps, feedback")
    if "level" in c:  # one level: wins over min_level/max_level (which a recipe may have set)
        c["min_level"] = c["max_level"] = c.pop("level")
    name = cfg.name if "name" in cfg.model_fields_set else "testbed"

    def whole(key: str, default: int) -> int:  # names the key: int("abc")'s own message does not
        v = c.get(key, default)
        try:
            if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
                raise ValueError
            return int(v)
        except (TypeError, ValueError):
            raise ConfigError(f"task.config.{key} must be a whole number, got {v!r}") from None

    try:
        return TestbedTask(
            min_level=whole("min_level", 4), max_level=whole("max_level", 6), ops=str(c.get("ops", "RC")),
            train_size=cfg.train_size, eval_size=cfg.eval_size_or_default, seed=cfg.seed, eval_seed=cfg.eval_seed,
            name=name, steps=whole("steps", 1), feedback=str(c.get("feedback", "text")),
            system_prompt=cfg.system_prompt or "",
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"task.config: {exc}") from None

"""The testbed's synthetic task family: string transformations with exact, verifiable answers.

A problem is an operation code and a string over a 10-letter alphabet, e.g. ``R:cadbe`` (reverse);
the answer is the transformed string (``ebdac``). Difficulty is the string length (``level`` =
length): each extra character is one more position the policy must get right, so the pass rate of
a model that is right with probability ``p`` per character falls like ``p ** level``, and levels
longer than anything seen in pre-training are out of reach (zero-pass groups).

Operations (``OPS``): ``R`` reverse, ``C`` shift every letter one step (``a→b``, ..., ``j→a``),
``S`` sort, ``D`` reverse then shift.

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


def _shift(s: str) -> str:
    return "".join(ALPHABET[(ALPHABET.index(c) + 1) % len(ALPHABET)] for c in s)


OPS: dict[str, Callable[[str], str]] = {
    "R": lambda s: s[::-1],
    "C": _shift,
    "S": lambda s: "".join(sorted(s)),
    "D": lambda s: _shift(s[::-1]),
}
"""Operation code → transformation ``str -> str`` (same length in, same length out)."""


def make_example(rng: random.Random, level: int, ops: str) -> tuple[str, str]:
    """One ``(question, answer)`` pair at ``level`` (string length), op drawn uniformly from ``ops``.

    Raises:
        ValueError: ``level < 1`` or an unknown op code.
    """
    if level < 1:
        raise ValueError(f"testbed level must be ≥ 1, got {level}")
    op = rng.choice(ops)
    if op not in OPS:
        raise ValueError(f"unknown testbed op {op!r}; known: {''.join(OPS)}")
    s = "".join(rng.choice(ALPHABET) for _ in range(level))
    return f"{op}:{s}", OPS[op](s)


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

    ``verify`` gives 1 for an exact match (surrounding whitespace ignored), else 0; feedback names
    the first wrong position without revealing the answer.

    Raises:
        ValueError: bad levels or op codes.
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

    __test__ = False  # not a pytest class

    def __post_init__(self) -> None:
        if not 1 <= self.min_level <= self.max_level:
            raise ValueError(f"testbed levels must satisfy 1 ≤ min_level ≤ max_level, got {self.min_level}..{self.max_level}")
        bad = [o for o in self.ops if o not in OPS]
        if bad or not self.ops:
            raise ValueError(f"testbed ops must be a non-empty subset of {''.join(OPS)!r}, got {self.ops!r}")
        self._cache: dict[str, list[Problem]] = {}

    def _make(self, split: str, seed: int, size: int, exclude: set[str]) -> list[Problem]:
        rng = random.Random(seed)
        out: list[Problem] = []
        tries = 0
        while len(out) < size and tries < size * 20:
            tries += 1
            level = rng.randint(self.min_level, self.max_level)
            q, a = make_example(rng, level, self.ops)
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
        if len(got) != len(gold):
            fb = f"the answer should have {len(gold)} letters, got {len(got)}"
        else:
            i = next(i for i, (x, y) in enumerate(zip(got, gold)) if x != y)
            fb = f"letter {i + 1} is wrong"
        return Verdict(score=0.0, correct=False, feedback=fb, extracted=got, source="exact")


def testbed_task_from_config(cfg) -> TestbedTask:
    """``task.type=testbed``: a :class:`TestbedTask` from a ``TaskConfig``.

    ``task.config`` keys: ``min_level``, ``max_level`` (default 4..6), ``level`` (sets both, wins),
    ``ops`` (default ``"RC"``); ``train_size``, ``eval_size``, ``seed``, ``eval_seed``,
    ``system_prompt`` come from the ``TaskConfig`` fields (``name`` defaults to ``testbed``).

    Raises:
        ConfigError: unknown ``task.config`` keys, bad levels or ops (names the key).
    """
    from rlvr.errors import ConfigError

    c = dict(cfg.config)
    bad = set(c) - {"min_level", "max_level", "level", "ops"}
    if bad:
        raise ConfigError(f"task.config: unknown testbed keys {sorted(bad)}; valid: level, min_level, max_level, ops")
    if "level" in c:  # one level: wins over min_level/max_level (which a recipe may have set)
        c["min_level"] = c["max_level"] = c.pop("level")
    name = cfg.name if "name" in cfg.model_fields_set else "testbed"
    try:
        return TestbedTask(
            min_level=int(c.get("min_level", 4)), max_level=int(c.get("max_level", 6)), ops=str(c.get("ops", "RC")),
            train_size=cfg.train_size, eval_size=cfg.eval_size_or_default, seed=cfg.seed, eval_seed=cfg.eval_seed,
            name=name,
            system_prompt=cfg.system_prompt or "",
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"task.config: {exc}") from None

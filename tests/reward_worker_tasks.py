"""Module-level (picklable) tasks for the reward worker tests, importing nothing heavy: the tests run
them in subprocesses, whose start-up this keeps short."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from rlvr.tasks.base import Problem, Verdict
from rlvr.testing import ToyTask


def items(uids: list[str]) -> list[tuple[int, Problem, str]]:
    """``VerifierPool.run`` items, one per uid (the text is unused)."""
    return [(i, Problem(uid=u, question=u, answer="1"), "x") for i, u in enumerate(uids)]


@dataclass
class ForkingTask:
    """Its verifier starts a child that sleeps 60 s and does not wait for it (module level: picklable)."""

    name: str = "forking"
    system_prompt: str = "x"

    def verify(self, problem, completion):
        # no pipes of the run's: what waits for the run's output must not wait for this child
        null = subprocess.DEVNULL
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=null, stdout=null, stderr=null)
        return Verdict(score=1.0, correct=True)


@dataclass
class InterruptingTask:
    """Raises KeyboardInterrupt (``kbint`` problems) or SystemExit (``exit``); else scores 1."""

    name: str = "interrupting"
    system_prompt: str = "x"

    def verify(self, problem, completion):
        kind = problem.uid.split("-")[0]
        if kind == "kbint":
            raise KeyboardInterrupt
        if kind == "exit":
            raise SystemExit(4)
        if kind == "hang":
            time.sleep(60)
        return Verdict(score=1.0, correct=True)


@dataclass
class ScriptedTask:
    """Verdict by problem uid: ``ok`` → 1, ``bad`` → 0, ``raise`` raises, ``nan``/``str`` return a
    non-number, ``hang`` sleeps ``hang_s``, ``die`` kills its process. Module level: picklable."""

    name: str = "scripted"
    hang_s: float = 30.0
    system_prompt: str = "x"

    def problems(self, split):
        return [Problem(uid=u, question=u, answer="1") for u in ("ok", "bad")]

    def verify(self, problem, completion):
        kind = problem.uid.split("-")[0]
        if kind == "raise":
            raise ZeroDivisionError("user bug")
        if kind == "nan":
            return Verdict(score=math.nan, correct=False)
        if kind == "str":
            return Verdict(score="high", correct=False)  # type: ignore[arg-type]
        if kind == "hang":
            time.sleep(self.hang_s)
        if kind == "die":
            os._exit(3)
        ok = kind == "ok"
        return Verdict(score=0.5 if ok else 0.0, correct=ok, feedback=None if ok else "no")


@dataclass
class HangOnFirst(ToyTask):
    """ToyTask whose verifier hangs on train problem 0 (module level: picklable for the worker pool)."""

    def verify(self, problem, completion):
        if problem.uid == "train-0":
            time.sleep(60)
        return super().verify(problem, completion)


@dataclass
class AlwaysRaises(ToyTask):
    """A ToyTask whose reward function raises on every call."""

    def verify(self, problem, completion):
        raise RuntimeError("reward service unreachable")


@dataclass
class RaisesOnRank1(ToyTask):
    """Raises on every call in the process whose ``RANK`` is 1 (torchrun), scores normally elsewhere."""

    def verify(self, problem, completion):
        if os.environ.get("RANK") == "1":
            raise RuntimeError("rank 1's reward service unreachable")
        return super().verify(problem, completion)

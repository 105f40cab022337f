"""User reward functions given as ``module:function``, wrapped around any task's problems."""

from __future__ import annotations

import difflib
import hashlib
import math
import numbers
from pathlib import Path
from typing import Any, Callable

from rlvr.errors import ConfigError
from rlvr.tasks.answers import extract_answer_with_source
from rlvr.tasks.base import Problem, Split, Task, Verdict
from rlvr.user_modules import import_user_module

RewardFn = Callable[..., Any]


def _file_module_name(path: Path) -> str:
    """The module name a ``module:attribute`` file is imported under: ``rlvr_reward_<stem>_<hash of its
    path>`` (two files of one name in different folders are two modules; one file is imported once)."""
    return f"rlvr_reward_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"


def load_attribute(spec: str, key: str, what: str = "function") -> Any:
    """Import ``"module:attr"`` (or ``"path/to/file.py:attr"``; ``attr`` may be dotted) for config key ``key``.

    The module may be installed, on ``PYTHONPATH`` or in the working directory (also searched, after
    ``sys.path``), or be a ``.py`` file (imported once per process, its folder on ``sys.path``); the loader
    is :func:`rlvr.user_modules.import_user_module`.

    Raises:
        ConfigError: naming ``key``: no colon; module not found or failing on import (with its error);
            attribute missing (with close names from the module).
    """
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigError(f"{key} must look like 'module:{what}', got {spec!r}")
    module, _, attr = spec.rpartition(":")
    if not module or not attr:
        raise ConfigError(f"{key} must look like 'module:{what}', got {spec!r}")
    obj: Any = import_user_module(module, f"{key}={spec!r}", module_name=_file_module_name)
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"{key}={spec!r}: {module!r} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
    return obj


def load_reward_fn(spec: str) -> RewardFn:
    """Import a reward function from ``"module:function"`` (or ``"path/to/file.py:function"``).

    Args:
        spec: module path (dotted, importable; the working directory is tried too) or a ``.py``
            file, a colon, and an attribute path (``"my_rewards:Scorer.score"`` works).

    Returns:
        The callable. It is called as ``fn(completion=str, problem=Problem)``.

    Raises:
        ConfigError: no colon; module not found or failing on import (with its error); attribute
            missing (with close names from the module); or the attribute is not callable.
    """
    obj = load_attribute(spec, "task.reward_fn")
    if not callable(obj):
        attr = spec.rpartition(":")[2]
        raise ConfigError(f"task.reward_fn={spec!r}: {attr!r} is a {type(obj).__name__}, not a callable")
    return obj


def _fn_name(fn: Any) -> str:
    mod = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    return f"{mod}:{name}" if mod else str(name)


def _as_score(value: Any, fn: Any) -> float | None:
    """A finite float for bool/real/0-d numeric values, else None."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if not isinstance(value, numbers.Real):
        item = getattr(value, "item", None)  # 0-d torch / numpy arrays
        if item is None or getattr(value, "ndim", 1) != 0:
            return None
        value = item()
        if isinstance(value, bool):
            return 1.0 if value else 0.0
        if not isinstance(value, numbers.Real):
            return None
    score = float(value)
    if not math.isfinite(score):
        raise ValueError(f"reward function {_fn_name(fn)} returned a non-finite score {score!r}")
    return score


def _as_correct(value: Any, fn: Any) -> bool | None:
    """A reward dict's ``correct``: a bool (numpy's too) or a 0/1 number, None when absent.

    Raises:
        TypeError: anything else, e.g. the string ``"false"`` (``bool("false")`` is True: such a
            completion would count as solved).
    """
    if value is None:
        return None
    numpy_bool = getattr(getattr(value, "dtype", None), "kind", None) == "b" and getattr(value, "ndim", 1) == 0
    if (isinstance(value, (bool, numbers.Integral)) or numpy_bool) and int(value) in (0, 1):
        return bool(value)
    raise TypeError(f"reward function {_fn_name(fn)} returned correct={value!r} ({type(value).__name__}); "
                    "expected a bool (or 0/1)")


def _describe(out: Any) -> str:
    if isinstance(out, tuple):
        return f"a tuple of ({', '.join(type(x).__name__ for x in out)})"
    if isinstance(out, dict):
        if "score" not in out:
            return f"a dict without a 'score' key (keys: {', '.join(map(str, out))})"
        return f"a dict with score {type(out['score']).__name__}, feedback {type(out.get('feedback')).__name__}"
    return f"a {type(out).__name__}"


class RewardFnTask:
    """Any task's problems, scored by a user reward function instead of the task's verifier.

    Args:
        base_task: supplies ``name``, ``system_prompt`` and ``problems``.
        fn: the reward function, or its ``"module:function"`` spec (then the task pickles by spec).
        correct_threshold: ``correct = score >= correct_threshold``; default: the base task's
            ``correct_threshold`` attribute, else 1.0.

    ``verify`` calls ``fn(completion=completion, problem=problem)``, which may return:
    a float/int (the score); a bool (1.0/0.0); a ``(score, feedback)`` tuple; a dict with
    ``score`` and optional ``feedback``/``correct``/``extracted``; or a :class:`Verdict` (used as
    is). The returned feedback is used verbatim (``None`` if absent): interpretation — the task's
    own "answer is incorrect" feedback would be wrong for a reward that is not answer matching.
    """

    def __init__(self, base_task: Task, fn: RewardFn | str, correct_threshold: float | None = None) -> None:
        self.base_task = base_task
        self.spec = fn if isinstance(fn, str) else None
        self.fn = load_reward_fn(fn) if isinstance(fn, str) else fn
        if not callable(self.fn):
            raise ConfigError(f"reward function must be callable, got {type(self.fn).__name__}")
        if correct_threshold is None:
            correct_threshold = float(getattr(base_task, "correct_threshold", 1.0))
        self.correct_threshold = correct_threshold
        self.name = base_task.name
        self.system_prompt = base_task.system_prompt

    def problems(self, split: Split) -> list[Problem]:
        """The base task's problems of ``split``."""
        return self.base_task.problems(split)

    @property
    def source_sizes(self) -> dict[str, int]:
        """The base task's ``source_sizes`` (rows each split was taken from), if it has them."""
        return dict(getattr(self.base_task, "source_sizes", {}))

    def verify(self, problem: Problem, completion: str) -> Verdict:
        """Score ``completion`` with the reward function.

        Returns:
            A :class:`Verdict`; ``extracted``/``source`` come from
            :func:`~rlvr.tasks.answers.extract_answer_with_source` unless the function gave them.

        Raises:
            TypeError: the function returned another type (names the function and the type).
            ValueError: it returned a non-finite score.
            Exception: whatever the function raises (the trainer's scorer counts it and scores 0).
        """
        out = self.fn(completion=completion, problem=problem)
        if isinstance(out, Verdict):
            return out
        feedback: Any = None
        correct: bool | None = None
        extracted: str | None = None
        score: float | None
        if isinstance(out, tuple) and len(out) == 2:
            score, feedback = _as_score(out[0], self.fn), out[1]
        elif isinstance(out, dict) and "score" in out:
            score = _as_score(out["score"], self.fn)
            feedback, extracted = out.get("feedback"), out.get("extracted")
            correct = _as_correct(out.get("correct"), self.fn)
        else:
            score = _as_score(out, self.fn)
        if score is None or not (feedback is None or isinstance(feedback, str)):
            raise TypeError(
                f"reward function {_fn_name(self.fn)} returned {_describe(out)}; expected a float, a bool, "
                "a (score, feedback) tuple, a dict with 'score' (and optional 'feedback'), or a Verdict"
            )
        ext, source = extract_answer_with_source(completion)
        if correct is None:
            correct = score >= self.correct_threshold
        return Verdict(
            score=score,
            correct=correct,
            feedback=feedback,
            extracted=extracted if extracted is not None else ext,
            source=None if extracted is not None else source,
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.spec is not None:  # functions loaded from files may not pickle by reference
            state["fn"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.fn is None and self.spec is not None:
            self.fn = load_reward_fn(self.spec)

    def __repr__(self) -> str:
        return f"RewardFnTask({self.base_task!r}, fn={self.spec or _fn_name(self.fn)})"

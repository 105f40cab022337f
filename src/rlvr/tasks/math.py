"""Math word problems (GSM8K-style JSONL or a Hugging Face dataset) verified with math-verify.

Facts this module relies on (math-verify 0.9.0, checked here): ``verify(parse(gold), parse(pred))``
treats ``\\boxed{3/4}`` and ``0.75``, ``1,000`` and ``1000``, ``x = 5`` and ``5`` as equal; ``parse``
and ``verify`` guard themselves with ``signal.alarm`` timeouts, which only work in the main thread
(elsewhere they must be disabled); the first call takes ~50 ms (LaTeX grammar warm-up), later ones
about a millisecond.
"""

from __future__ import annotations

import gzip
import json
import random
import re
import threading
import warnings
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Iterator

from rlvr.errors import ConfigError, DataError
from rlvr.util.file_kinds import not_regular_file
from rlvr.tasks.answers import _from_boxed, extract_answer_with_source, gold_from_gsm8k
from rlvr.tasks.base import Problem, Split, Verdict, check_split
from rlvr.tasks.feedback import FORMAT_HINT, make_feedback
from rlvr.tasks.prompts import DEFAULT_SYSTEM_PROMPT
from rlvr.util.text import plural

_NUM = re.compile(r"^[-+]?\d+(?:\.\d+)?$")
_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_NUM_WORDS = re.compile(r"^(?:\\?\$)?\s*([-+]?\d[\d,]*(?:\.\d+)?)\s+[A-Za-z][A-Za-z .]*$")
_MAX_PRED_CHARS = 300
_TIMEOUT_S = 2


def gold_from_field(value: Any) -> str:
    """The gold answer string of one row's answer field.

    Args:
        value: a GSM8K solution ending in ``#### n``; a solution holding ``\\boxed{...}`` (MATH);
            a plain answer string; or a JSON number.

    Returns:
        The text after the final ``####`` (commas removed), else the last boxed content, else the
        stripped string (numbers via ``str``).

    Raises:
        DataError: empty, or of another type (e.g. null or a list).
    """
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DataError(f"answer must be a string or a number, got {type(value).__name__}")
    if not isinstance(value, str):
        return str(value)
    if "####" in value:
        return gold_from_gsm8k(value)
    if "\\boxed" in value or "\\fbox" in value:
        boxed = _from_boxed(value)
        if boxed:
            return boxed
    gold = value.strip()
    if not gold:
        raise DataError("answer is empty")
    return gold


def plain_number(s: str) -> Decimal | None:
    """``s`` as a decimal when it is a plain number (``$`` signs and thousands commas allowed:
    ``"$1,250.50"`` → ``Decimal("1250.50")``), else None."""
    return _plain_number(s)


def _plain_number(s: str) -> Decimal | None:
    t = s.strip().replace("\\$", "").replace("$", "").strip()
    if _THOUSANDS.match(t):
        t = t.replace(",", "")
    if not _NUM.match(t):
        return None
    try:
        return Decimal(t)
    except InvalidOperation:  # pragma: no cover - the regex admits only valid decimals
        return None


def _timeouts() -> int | None:
    # math-verify's timeouts use signal.alarm, which raises outside the main thread
    return _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=8192)
def _parse_gold(gold: str) -> list[Any]:
    from math_verify import parse

    text = gold if ("\\boxed" in gold or "$" in gold) else f"${gold}$"
    return parse(text, parsing_timeout=_timeouts())


def answers_match(gold: str, pred: str) -> tuple[bool, bool]:
    """Whether ``pred`` equals ``gold`` mathematically.

    Args:
        gold: the reference answer (``"72"``, ``"\\frac{3}{4}"``, ``"0.75"``).
        pred: the extracted model answer (content of its ``\\boxed{}``, or a bare number).

    Returns:
        ``(equal, parsed)``. ``parsed`` is False when math-verify could not read ``pred`` (or it is
        longer than 300 characters, or math-verify raised or timed out); then ``equal`` is False.

    Interpretation: two plain decimals (thousands commas and ``$`` allowed) are compared exactly
    without math-verify, because that is GSM8K's whole answer space and costs microseconds; a
    number followed only by words (``18 dollars``, ``5 apples``) counts as that number when the
    gold is a plain number (math-verify 0.9 accepts ``5 apples`` but rejects ``5 dollars``);
    everything else goes to ``math_verify.verify(parse(gold), parse("\\boxed{pred}"))`` — boxing
    the prediction makes ``parse`` take it whole. Timeouts (2 s) apply only in the main thread.
    """
    g, p = _plain_number(gold), _plain_number(pred)
    if g is not None and p is None:
        m = _NUM_WORDS.match(pred.strip())
        p = _plain_number(m.group(1)) if m else None
    if g is not None and p is not None:
        return g == p, True
    if len(pred) > _MAX_PRED_CHARS:
        return False, False
    try:
        from math_verify import parse, verify

        gold_parsed = _parse_gold(gold)
        pred_parsed = parse(f"\\boxed{{{pred}}}", parsing_timeout=_timeouts())
        if not pred_parsed:
            return False, False
        if not gold_parsed:
            return False, True
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=_timeouts())), True
    except Exception:  # math-verify on odd input: count as wrong, never crash the run
        return False, False


def _split_rows(rows: list[Any], eval_size: int, eval_seed: int, where: str) -> tuple[list[Any], list[Any]]:
    n = len(rows)
    if eval_size >= n:
        raise DataError(
            f"{where} has {plural(n, 'row')}; holding out eval_size={eval_size} for evaluation would leave no "
            "training rows (lower task.eval_size or give task.eval_path)"
        )
    order = list(range(n))
    random.Random(eval_seed).shuffle(order)
    held = set(order[:eval_size])
    eval_rows = [r for i, r in enumerate(rows) if i in held]
    train_rows = [r for i, r in enumerate(rows) if i not in held]
    return train_rows, eval_rows


def _first(rows: list[Any], k: int | None) -> list[Any]:
    """The first ``k`` rows in file order (all when ``k`` is None): a test set is a prefix, never a sample."""
    return rows if k is None else rows[:k]


def _cap(rows: list[Any], k: int | None, seed: int) -> list[Any]:
    if k is None or len(rows) <= k:
        return rows
    keep = set(random.Random(seed).sample(range(len(rows)), k))
    return [r for i, r in enumerate(rows) if i in keep]


def _problem(uid: str, row: dict[str, Any], qf: str, af: str, where: str) -> Problem:
    for f in (qf, af):
        if f not in row:
            raise DataError(
                f"{where}: row has no field {f!r} (fields: {', '.join(map(str, row)) or 'none'}); "
                f"set task.{'question' if f == qf else 'answer'}_field"
            )
    q = row[qf]
    if not isinstance(q, str) or not q.strip():
        raise DataError(f"{where}: field {qf!r} must be a non-empty string, got {q!r:.60}")
    try:
        gold = gold_from_field(row[af])
    except DataError as exc:
        raise DataError(f"{where}: field {af!r}: {exc}") from None
    meta = {"raw_answer": row[af]} if isinstance(row[af], str) and row[af].strip() != gold else {}
    return Problem(uid=uid, question=q, answer=gold, metadata=meta)


def _has_marked_answer(value: Any) -> bool:
    """Whether a row's answer field says where its gold answer is: a JSON number, a ``####`` line
    (GSM8K), a ``\\boxed{}`` (MATH), or a bare answer with no whitespace (``"42"``, ``"3/4"``).
    Anything else (a worked solution without a marker) would be taken whole as the gold answer."""
    if not isinstance(value, str):
        return True
    return "####" in value or "\\boxed" in value or "\\fbox" in value or not any(c.isspace() for c in value.strip())


def _lines(fh: Any, p: Path) -> Iterator[bytes]:
    try:
        yield from fh
    except (OSError, EOFError) as exc:  # a corrupt .gz
        raise DataError(f"{p}: cannot be read ({type(exc).__name__}: {exc})") from None


def iter_json_rows(path: str | Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """``(line number, "file:line", row)`` for each non-blank line of a JSONL file (``.gz`` read
    through gzip), in order.

    Raises:
        DataError: the file is missing (names the path) or a folder; a line is not UTF-8 or not a
            JSON object (names file and 1-based line).
    """
    p = Path(path)
    if p.is_dir():
        raise DataError(f"JSONL file {str(p)!r} is a directory (expected a .jsonl file)")
    why = not_regular_file(p)
    if why == "does not exist":
        raise DataError(f"JSONL file not found: {str(p)!r}")
    if why:  # a FIFO would block the read forever, /dev/zero never end
        raise DataError(f"JSONL file {str(p)!r} {why} (expected a regular .jsonl file)")
    with (gzip.open(p, "rb") if p.suffix == ".gz" else p.open("rb")) as fh:
        for lineno, raw in enumerate(_lines(fh, p), start=1):
            where = f"{p}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{where}: not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x}); "
                                "save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield lineno, where, row


def read_jsonl(path: str | Path, question_field: str = "question", answer_field: str = "answer") -> list[Problem]:
    """Read a GSM8K-style JSONL file into problems (blank lines skipped).

    Rows whose answer is a worked solution with no ``####`` (nor ``\\boxed{}``) are counted and warned
    about with their line numbers; when no row has a marked answer the file is refused (interpretation:
    the whole solution text would become the gold answer, so no completion could ever match).

    Args:
        path: the file; one JSON object per line, UTF-8.
        question_field, answer_field: the row keys of question and answer.

    Returns:
        One :class:`Problem` per row, in file order; ``uid`` is ``"<file name>:<line>"``,
        ``answer`` the gold from :func:`gold_from_field`.

    Raises:
        DataError: the file is missing (names the path), a folder, or empty; a line is not UTF-8 or
            not a JSON object, or lacks a field, or has an unusable answer (names file, 1-based line
            and field); no row has a marked answer.
    """
    p = Path(path)
    out: list[Problem] = []
    unmarked: list[int] = []
    for lineno, where, row in iter_json_rows(p):
        out.append(_problem(f"{p.name}:{lineno}", row, question_field, answer_field, where))
        if not _has_marked_answer(row.get(answer_field)):
            unmarked.append(lineno)
    if not out:
        raise DataError(f"JSONL file {str(p)!r} has no rows")
    if unmarked:
        lines = ", ".join(map(str, unmarked[:10])) + (f" and {len(unmarked) - 10} more" if len(unmarked) > 10 else "")
        what = (f"{p}: no row's {answer_field!r} marks its final answer with '#### <answer>' (or \\boxed{{}})")
        if len(unmarked) == len(out):
            raise DataError(what + "; each whole solution text would be the gold answer. Add '#### <answer>' "
                            "at the end of each answer, or keep only the final answer in the field")
        warnings.warn(f"{p}: {len(unmarked)} of {plural(len(out), 'row')} {'has' if len(unmarked) == 1 else 'have'} no '####' final answer in {answer_field!r} "
                      f"(lines {lines}); their whole text is used as the gold answer", stacklevel=2)
    return out


class MathTask:
    """Math word problems with a single gold answer, verified with math-verify.

    Build it with :meth:`from_jsonl` or :meth:`from_hf`, or from two lists of problems.

    Args:
        name: task name for logs.
        train, eval: the problems of each split (``answer`` holds the gold string).
        system_prompt: default :data:`~rlvr.tasks.prompts.DEFAULT_SYSTEM_PROMPT`.
        correct_threshold: ``correct = score >= correct_threshold`` (scores are 0 or 1).
        feedback_hint: append :data:`~rlvr.tasks.feedback.FORMAT_HINT` to feedback.
    """

    def __init__(
        self,
        name: str,
        train: list[Problem],
        eval: list[Problem],
        system_prompt: str | None = None,
        correct_threshold: float = 1.0,
        *,
        feedback_hint: bool = False,
    ) -> None:
        self.name = name
        self._splits = {"train": list(train), "eval": list(eval)}
        self.source_sizes: dict[str, int] = {k: len(v) for k, v in self._splits.items()}
        """Rows each split was taken from (more than the split's size when ``eval_size`` capped an eval file)."""
        self.system_prompt = DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt
        self.correct_threshold = correct_threshold
        self.hint = FORMAT_HINT if feedback_hint else None
        self._no_train: str | None = None  # why there is no train split (an evaluation-only task)

    @classmethod
    def from_jsonl(
        cls,
        path: str | Path | None,
        *,
        eval_path: str | Path | None = None,
        question_field: str = "question",
        answer_field: str = "answer",
        train_size: int | None = None,
        eval_size: int | None = None,
        seed: int = 0,
        eval_seed: int = 10_000,
        **kwargs: Any,
    ) -> "MathTask":
        """A task from a JSONL file (and optionally a separate eval file).

        Args:
            path: training file (also the eval source when ``eval_path`` is None); None for an
                evaluation-only task from ``eval_path`` (its train split then raises DataError).
            eval_path: a separate eval file, or None to hold out ``eval_size`` rows of ``path``
                (a seeded choice by ``eval_seed``; the rest, minus any row whose question also
                appears in the held-out rows, is the train split).
            question_field, answer_field: row keys.
            train_size: at most this many train rows (a ``seed``-seeded sample in file order);
                None keeps all.
            eval_size: with ``eval_path``: None keeps every eval row, N the first N, in file order
                (a benchmark is reported on its whole test set or a stated prefix); without it: the
                rows held out of ``path`` (None: 100).
            seed, eval_seed: the seeds above.
            **kwargs: ``system_prompt``, ``correct_threshold``, ``feedback_hint``.

        Raises:
            DataError: see :func:`read_jsonl`; or too few rows to hold out ``eval_size``.
        """
        if path is None:
            if eval_path is None:
                raise DataError("MathTask.from_jsonl needs task.path or task.eval_path")
            all_ev = read_jsonl(eval_path, question_field, answer_field)
            task = cls(Path(eval_path).stem, [], _first(all_ev, eval_size), **kwargs)
            task.source_sizes["eval"] = len(all_ev)
            task._no_train = (f"task.path is not set: {str(eval_path)!r} (task.eval_path) is for evaluation only; "
                              "training needs a train file: set task.path")
            return task
        rows = read_jsonl(path, question_field, answer_field)
        eval_total = None
        if eval_path is None:
            train, ev = _split_rows(rows, eval_size or 100, eval_seed, str(path))
            held_q = {p.question for p in ev}
            kept = [p for p in train if p.question not in held_q]
            dropped, train = len(train) - len(kept), kept
        else:
            all_ev = read_jsonl(eval_path, question_field, answer_field)
            train, ev, eval_total = rows, _first(all_ev, eval_size), len(all_ev)
        task = cls(Path(path).stem, _cap(train, train_size, seed), ev, **kwargs)
        if eval_total is not None:
            task.source_sizes["eval"] = eval_total
        elif not train:  # evaluation still works; training is refused with the reason (before a model loads)
            task._no_train = (f"{path}: all {plural(dropped, 'row')} left after holding out task.eval_size="
                              f"{len(ev)} for evaluation repeat a held-out question, so no training problem is "
                              "left (such rows are dropped from training so that evaluation stays held-out): "
                              "add distinct rows, or give a separate task.eval_path")
        return task

    @classmethod
    def from_hf(
        cls,
        name: str,
        hf_config: str | None = None,
        *,
        train_split: str = "train",
        eval_split: str | None = "test",
        question_field: str = "question",
        answer_field: str = "answer",
        train_size: int | None = None,
        eval_size: int | None = None,
        seed: int = 0,
        eval_seed: int = 10_000,
        **kwargs: Any,
    ) -> "MathTask":
        """A task from a Hugging Face dataset via ``datasets.load_dataset(name, hf_config, split=...)``.

        Args:
            name, hf_config: dataset id and configuration (``"openai/gsm8k"``, ``"main"``).
            train_split, eval_split: split names; an ``eval_split`` that is empty or equal to
                ``train_split`` holds out ``eval_size`` (None: 100) train rows instead; otherwise
                ``eval_size`` None keeps every ``eval_split`` row and N the first N, in order.
            others: as in :meth:`from_jsonl`.

        Raises:
            ConfigError: the ``datasets`` package is not installed (``pip install datasets``).
            DataError: the dataset or split cannot be loaded (offline, unknown id), or a row lacks a
                field (names dataset, split, 0-based row index and field).
        """
        try:
            import datasets
        except ImportError:
            raise ConfigError(
                "task.type=hf_dataset needs the Hugging Face `datasets` package: pip install datasets"
            ) from None

        def load(split: str) -> list[Problem]:
            try:
                ds = datasets.load_dataset(name, hf_config, split=split)
            except Exception as exc:
                raise DataError(
                    f"could not load Hugging Face dataset {name!r} (config {hf_config!r}, split {split!r}): "
                    f"{type(exc).__name__}: {exc} (offline? HF_HUB_OFFLINE=1 needs it in the local cache)"
                ) from exc
            return [
                _problem(f"{name}/{split}/{i}", dict(row), question_field, answer_field,
                         f"dataset {name!r} split {split!r} row {i}")
                for i, row in enumerate(_rows(ds))
            ]

        rows = load(train_split)
        eval_total = None
        if not eval_split or eval_split == train_split:
            train, ev = _split_rows(rows, eval_size or 100, eval_seed, f"dataset {name!r} split {train_split!r}")
            held_q = {p.question for p in ev}
            kept = [p for p in train if p.question not in held_q]
            dropped, train = len(train) - len(kept), kept
        else:
            all_ev = load(eval_split)
            train, ev, eval_total = rows, _first(all_ev, eval_size), len(all_ev)
        task = cls(name.rsplit("/", 1)[-1], _cap(train, train_size, seed), ev, **kwargs)
        if eval_total is not None:
            task.source_sizes["eval"] = eval_total
        return task

    def problems(self, split: Split) -> list[Problem]:
        """The problems of ``split`` (a copy of the list).

        Raises:
            ValueError: unknown split.
            DataError: ``"train"`` of an evaluation-only task (built from ``eval_path`` alone), or of a
                file whose rows all repeat its held-out questions.
        """
        check_split(split)
        if split == "train" and self._no_train:
            raise DataError(self._no_train)
        return list(self._splits[split])

    def verify(self, problem: Problem, completion: str) -> Verdict:
        """Extract the final answer and compare it with ``problem.answer`` (see :func:`answers_match`).

        Returns:
            ``Verdict`` with score 1.0 or 0.0, ``correct = score >= correct_threshold``, label-free
            feedback, the extracted answer and its source. A completion without any answer scores 0.

        Raises:
            DataError: ``problem.answer`` is None (a math problem needs a gold answer).
        """
        if problem.answer is None:
            raise DataError(f"problem {problem.uid!r} has no gold answer to verify against")
        extracted, source = extract_answer_with_source(completion)
        parsed = True
        equal = False
        if extracted is not None:
            equal, parsed = answers_match(problem.answer, extracted)
        score = 1.0 if equal else 0.0
        correct = score >= self.correct_threshold
        feedback = make_feedback(extracted, source, correct, hint=self.hint, unparseable=not parsed)
        return Verdict(score=score, correct=correct, feedback=feedback, extracted=extracted, source=source)

    def __repr__(self) -> str:
        return f"MathTask({self.name!r}, train={len(self._splits['train'])}, eval={len(self._splits['eval'])})"


def _rows(ds: Iterable[Any]) -> Iterable[dict[str, Any]]:
    for row in ds:
        if not isinstance(row, dict):
            raise DataError(f"dataset rows must be mappings, got {type(row).__name__}")
        yield row

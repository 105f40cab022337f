"""Tasks: where prompts come from and how completions are verified.

``build_task(cfg.task)`` returns a :class:`Task`: a reasoning-gym dataset, a GSM8K-style JSONL file
or a Hugging Face dataset (both verified with math-verify), optionally re-scored by a user reward
function. ``validate_task_config`` checks what can be checked without data, so the CLI can fail
before loading a model. Importing this package is cheap: reasoning-gym, math-verify and
``datasets`` are imported on first use.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

from rlvr.config import TaskConfig
from rlvr.errors import ConfigError
from rlvr.util.file_kinds import not_regular_file
from rlvr.tasks.answers import extract_answer, extract_answer_with_source, gold_from_gsm8k
from rlvr.tasks.base import Problem, Task, Verdict
from rlvr.tasks.code import CodeTask, code_task_from_config
from rlvr.tasks.custom import RewardFnTask, load_reward_fn
from rlvr.tasks.feedback import FORMAT_HINT, make_feedback
from rlvr.tasks.math import MathTask, answers_match
from rlvr.tasks.mixture import MixtureTask, build_mixture, entry_error
from rlvr.tasks.prompts import DEFAULT_SYSTEM_PROMPT, build_messages, render_prompt
from rlvr.tasks.reasoning_gym import ReasoningGymTask, check_reasoning_gym_config
from rlvr.registry import Registry

_BUILTIN_TYPES = ("reasoning_gym", "jsonl", "hf_dataset")

TASK_TYPES: Registry = Registry("task.type", "rlvr.tasks.TASK_TYPES")
"""Task types provided by packages above this one: ``task.type`` → ``(TaskConfig) -> Task`` (cheap
until ``problems()`` is called; raises ``ConfigError`` for a bad ``task.config``). :mod:`rlvr.testbed`
registers ``testbed`` when imported (the CLI imports it), so this package imports no testbed code.
``code`` (:mod:`rlvr.tasks.code`, programs run in :mod:`rlvr.sandbox`) is registered here."""

TASK_TYPES.register("code")(code_task_from_config)


def _registered_type(name: str):
    """The builder of a registered task type.

    Raises:
        ConfigError: ``name`` is not registered (the message names the registered types).
    """
    if name not in TASK_TYPES:
        raise ConfigError(f"task.type={name!r} is not registered (registered: {', '.join(sorted(TASK_TYPES)) or 'none'}; "
                          "a type registers when its package is imported, e.g. import rlvr.testbed)")
    return TASK_TYPES[name]

__all__ = [
    "CodeTask",
    "DEFAULT_SYSTEM_PROMPT",
    "FORMAT_HINT",
    "MathTask",
    "MixtureTask",
    "Problem",
    "ReasoningGymTask",
    "RewardFnTask",
    "Task",
    "Verdict",
    "answers_match",
    "build_messages",
    "build_task",
    "extract_answer",
    "extract_answer_with_source",
    "gold_from_gsm8k",
    "load_reward_fn",
    "make_feedback",
    "render_prompt",
    "validate_task_config",
]


def validate_task_config(cfg: TaskConfig) -> None:
    """Check a task configuration without generating or reading any problem (well under a second).

    Checks: reasoning-gym dataset name, options and seed ranges
    (:func:`~rlvr.tasks.reasoning_gym.check_reasoning_gym_config`); that JSONL files exist; that
    ``datasets`` is installed for ``hf_dataset``; that ``reward_fn`` imports and is callable.

    A mixture (``task.mixture``) checks each entry, its errors naming ``task.mixture[i].*``.

    Raises:
        ConfigError: the first problem found, naming the ``task.*`` key.
    """
    if cfg.mixture is not None:
        for i, entry in enumerate(cfg.mixture):
            try:
                validate_task_config(entry)
            except ConfigError as exc:
                raise ConfigError(entry_error(str(exc), i)) from None
        return
    if cfg.type == "reasoning_gym":
        check_reasoning_gym_config(
            cfg.name, cfg.config, train_size=cfg.train_size, eval_size=cfg.eval_size_or_default, seed=cfg.seed,
            eval_seed=cfg.eval_seed,
        )
    elif cfg.type == "jsonl":
        for key in ("path", "eval_path"):
            value = getattr(cfg, key)
            if value is not None and Path(value).is_dir():
                raise ConfigError(f"task.{key}: {value!r} is a directory (expected a .jsonl file)")
            why = None if value is None else not_regular_file(value)
            if why == "does not exist":
                raise ConfigError(f"task.{key}: file {value!r} not found")
            if why:
                raise ConfigError(f"task.{key}: {value!r} {why} (expected a regular .jsonl file)")
    elif cfg.type == "hf_dataset":
        if importlib.util.find_spec("datasets") is None:
            raise ConfigError("task.type=hf_dataset needs the Hugging Face `datasets` package: pip install datasets")
    elif cfg.type not in _BUILTIN_TYPES:  # a type a package registers (the testbed): its builder validates
        _registered_type(cfg.type)(cfg)  # cheaply, generating nothing
    if cfg.reward_fn:
        load_reward_fn(cfg.reward_fn)


def build_task(cfg: TaskConfig) -> Task:
    """Build the task described by ``cfg``.

    Args:
        cfg: ``type`` picks the adapter: ``reasoning_gym`` (``name`` = dataset, ``config`` = its
            options), ``jsonl`` (``path``, optional ``eval_path``), ``hf_dataset`` (``name``,
            ``hf_config``, ``train_split``, ``eval_split``); ``reward_fn`` wraps the result in a
            :class:`RewardFnTask`. For ``jsonl`` the task name is ``name`` if set explicitly, else
            the file stem. ``mixture`` builds a :class:`MixtureTask` of its entries, each built as here.

    Returns:
        A :class:`Task`. JSONL and Hugging Face rows are read here; reasoning-gym problems are
        generated on the first ``problems()`` call.

    Raises:
        ConfigError: see :func:`validate_task_config`.
        DataError: unreadable or malformed data (file, line and field named).
    """
    if cfg.mixture is not None:
        return build_mixture(cfg, build_task)
    validate_task_config(cfg)
    common = dict(system_prompt=cfg.system_prompt, correct_threshold=cfg.correct_threshold,
                  feedback_hint=cfg.feedback_hint)
    if cfg.type not in _BUILTIN_TYPES:
        task = _registered_type(cfg.type)(cfg)
        if cfg.reward_fn:
            task = RewardFnTask(task, cfg.reward_fn, correct_threshold=cfg.correct_threshold)
        return task
    if cfg.type != "reasoning_gym" and cfg.config:
        warnings.warn(f"task.config is read only by task.type=reasoning_gym and testbed; ignored for {cfg.type}",
                      stacklevel=2)
    task: Task
    if cfg.type == "reasoning_gym":
        task = ReasoningGymTask(
            cfg.name, cfg.config, cfg.train_size, cfg.eval_size_or_default, cfg.seed, cfg.eval_seed, **common
        )
    elif cfg.type == "jsonl":
        assert cfg.path is not None or cfg.eval_path is not None  # enforced by TaskConfig
        task = MathTask.from_jsonl(
            cfg.path, eval_path=cfg.eval_path, question_field=cfg.question_field, answer_field=cfg.answer_field,
            train_size=cfg.train_size, eval_size=cfg.eval_size, seed=cfg.seed, eval_seed=cfg.eval_seed, **common,
        )
        if "name" in cfg.model_fields_set:
            task.name = cfg.name
    elif cfg.type == "hf_dataset":
        task = MathTask.from_hf(
            cfg.name, cfg.hf_config, train_split=cfg.train_split, eval_split=cfg.eval_split,
            question_field=cfg.question_field, answer_field=cfg.answer_field, train_size=cfg.train_size,
            eval_size=cfg.eval_size, seed=cfg.seed, eval_seed=cfg.eval_seed, **common,
        )
    else:  # pragma: no cover - TaskConfig's Literal forbids it
        raise ConfigError(f"task.type: unknown task type {cfg.type!r}")
    if cfg.reward_fn:
        task = RewardFnTask(task, cfg.reward_fn, correct_threshold=cfg.correct_threshold)
    return task

"""A task mixture (``task.mixture``): several tasks behind one :class:`~rlvr.tasks.base.Task`.

Each source keeps its own problems, system prompt and verifier. A mixture problem is the source's
problem with its uid prefixed by the source's label (``chain_sum/chain_sum-3``) and two metadata keys
added: ``source`` (the label; what per-source metrics and the trainer's mixture loader group by) and
``system_prompt`` (the source's, honoured by :func:`rlvr.tasks.prompts.build_messages`). ``verify``
strips both again and hands the source's own problem to the source's verifier, so a source scores a
completion exactly as it would alone. How prompts are drawn from the sources (weights, curricula,
resume) is the trainer's (:mod:`rlvr.trainer.mixture`); see ``docs/mixtures.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Sequence

from rlvr.errors import ConfigError, DataError
from rlvr.tasks.base import Problem, Task, Verdict, check_split

SOURCE_KEY = "source"
"""``Problem.metadata`` key holding a mixture problem's source label."""
PROMPT_KEY = "system_prompt"
"""``Problem.metadata`` key holding a mixture problem's system prompt (its source's)."""
_LABEL = re.compile(r"[A-Za-z0-9_.-]+")
_INNER_KEYS = "mixture_inner_keys"  # the source problem's own values of the two keys above, if it had them


@dataclass(frozen=True)
class MixtureSource:
    """One source of a mixture.

    Attributes:
        label: its name in metrics and ``metadata["source"]`` (unique within the mixture).
        weight: its share of the prompts before any curriculum (≥ 0; normalised over the sources).
        task: the source's own task.
    """

    label: str
    weight: float
    task: Any


class MixtureTask:
    """Several tasks as one: problems of every source (in source order), verified by their source.

    Args:
        sources: the sources, in ``task.mixture`` order (labels unique).
        system_prompt: the default system prompt of a source whose own is unset (``task.system_prompt``);
            ``None``: the source task's own.
        source_prompts: per source, its explicit ``system_prompt`` key (``None``: unset).

    Raises:
        ConfigError: two sources share a label (the entries named; set ``label`` on one).
    """

    def __init__(self, sources: Sequence[MixtureSource], system_prompt: str | None = None,
                 source_prompts: Sequence[str | None] | None = None) -> None:
        seen: dict[str, int] = {}
        for i, s in enumerate(sources):
            if not _LABEL.fullmatch(s.label):
                raise ConfigError(f"task.mixture[{i}]: its task's name {s.label!r} cannot name metrics (letters, digits, "
                                  f"_ . - only): set task.mixture[{i}].label")
            if s.label in seen:
                raise ConfigError(f"task.mixture[{i}] and task.mixture[{seen[s.label]}] are both named {s.label!r}: "
                                  f"give one a distinct task.mixture[{i}].label")
            seen[s.label] = i
        self.sources = list(sources)
        self.name = "mixture"
        prompts = list(source_prompts or [None] * len(self.sources))
        self.prompts = [p if p is not None else (system_prompt if system_prompt is not None else s.task.system_prompt)
                        for s, p in zip(self.sources, prompts)]
        self.system_prompt = self.prompts[0] if self.prompts else ""
        self._by_label = {s.label: s.task for s in self.sources}
        self._cache: dict[str, list[Problem]] = {}

    @property
    def labels(self) -> list[str]:
        """The sources' labels, in order."""
        return [s.label for s in self.sources]

    def source_problems(self, split: str) -> list[list[Problem]]:
        """Per source (in order), its problems of ``split`` as mixture problems (cached).

        Raises:
            ValueError: ``split`` is not ``"train"`` or ``"eval"``.
        """
        check_split(split)
        if split not in self._cache:
            self._cache[split] = [self._wrap(s.label, prompt, p) for s, prompt in zip(self.sources, self.prompts)
                                  for p in s.task.problems(split)]
        out: dict[str, list[Problem]] = {label: [] for label in self.labels}
        for p in self._cache[split]:
            out[p.metadata[SOURCE_KEY]].append(p)
        return [out[label] for label in self.labels]

    def check_training(self, curriculum: Any = None) -> None:
        """What a training run needs, checked before the model loads: every source has training problems,
        and ``weights_by_step`` (of ``task.curriculum``, if given) names exactly the sources.

        Raises:
            DataError: a source without training problems (``task.mixture[i]`` named).
            ConfigError: a ``weights_by_step`` point naming other sources (the point named).
        """
        for i, (label, ps) in enumerate(zip(self.labels, self.source_problems("train"))):
            if not ps:
                raise DataError(f"task.mixture[{i}] ({label}): no training problems")
        for j, pt in enumerate(getattr(curriculum, "weights_by_step", None) or []):
            if set(pt.weights) != set(self.labels):
                raise ConfigError(f"task.curriculum.weights_by_step[{j}].weights names {sorted(pt.weights)}; "
                                  f"the mixture's sources are {sorted(self.labels)}")

    def problems(self, split: str) -> list[Problem]:
        """Every source's problems of ``split``, source after source (each in its source's order)."""
        return [p for ps in self.source_problems(split) for p in ps]

    @staticmethod
    def _wrap(label: str, prompt: str, p: Problem) -> Problem:
        md = dict(p.metadata)
        kept = {k: md[k] for k in (SOURCE_KEY, PROMPT_KEY) if k in md}
        md.update({SOURCE_KEY: label, PROMPT_KEY: prompt})
        if kept:
            md[_INNER_KEYS] = kept
        return replace(p, uid=f"{label}/{p.uid}", metadata=md)

    @staticmethod
    def unwrap(problem: Problem) -> tuple[str, Problem]:
        """``(label, the source's own problem)`` of a mixture problem.

        Raises:
            KeyError: ``problem`` has no ``metadata["source"]`` (it is not a mixture problem).
        """
        md = dict(problem.metadata)
        label = md.pop(SOURCE_KEY)
        md.pop(PROMPT_KEY, None)
        md.update(md.pop(_INNER_KEYS, {}))
        return label, replace(problem, uid=problem.uid[len(label) + 1:], metadata=md)

    def verify(self, problem: Problem, completion: str) -> Verdict:
        """The source's verdict on ``completion`` for its own problem.

        Raises:
            KeyError: ``problem`` is not a problem of this mixture.
        """
        label, inner = self.unwrap(problem)
        return self._by_label[label].verify(inner, completion)


def build_mixture(cfg: Any, build_one: Any) -> MixtureTask:
    """The :class:`MixtureTask` of ``cfg`` (a ``TaskConfig`` with ``mixture``), each entry built by
    ``build_one(entry)``; a ``ConfigError`` of an entry is re-raised naming ``task.mixture[i]``.

    Raises:
        ConfigError: an entry's own error (``task.x`` → ``task.mixture[i].x``), or two entries with the same
            label.
    """
    sources = []
    for i, entry in enumerate(cfg.mixture):
        try:
            task: Task = build_one(entry)
        except ConfigError as exc:
            raise ConfigError(entry_error(str(exc), i)) from None
        sources.append(MixtureSource(entry.label or task.name, float(entry.weight), task))
    prompts = [e.system_prompt for e in cfg.mixture]
    return MixtureTask(sources, system_prompt=cfg.system_prompt, source_prompts=prompts)


def entry_error(message: str, i: int) -> str:
    """``message`` with its ``task.`` keys renamed to the entry's (``task.mixture[i].``)."""
    text = message.replace("task.", f"task.mixture[{i}].")
    return text if f"task.mixture[{i}]" in text else f"task.mixture[{i}]: {text}"


__all__ = ["MixtureSource", "MixtureTask", "PROMPT_KEY", "SOURCE_KEY", "build_mixture", "entry_error"]

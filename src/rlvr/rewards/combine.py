"""The ``rewards:`` list at work: each completion's reward is the weighted sum of its components.

``reward_i = Σ_c w_c · n_c(r_c,i)`` over the entries ``c`` that apply to row ``i`` (all rows, or its
mixture source's when the entry names ``sources``), where ``r_c`` is the component's raw score (the
verifier's, a reward model's, a judge's in [0, 1]) and ``n_c`` its normalisation (``none``, ``group``,
``running``; :mod:`rlvr.rewards.normalize`). Interpretation of TRL's ``reward_funcs`` with
``reward_weights`` (the weighted sum of several reward functions; code-precedent), with per-source
application for task mixtures.

:class:`CombinedScorer` has the :class:`~rlvr.rewards.scorer.Scorer` interface (``score(batch) ->
ScoreStats`` and the counters), so the trainer, the samplers that score mid-sampling and the overlap and
streaming paths use it unchanged. :func:`build_scorer` returns the plain :class:`Scorer` when
``rewards:`` is unset.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from typing import Any

import torch

from rlvr.errors import ConfigError
from rlvr.rewards.judge import JudgeReward
from rlvr.rewards.normalize import RunningMoments, group_zscore
from rlvr.rewards.reward_model import RewardModelReward
from rlvr.rewards.scorer import REWARD_DTYPE, Scorer, ScoreStats
from rlvr.tasks.mixture import SOURCE_KEY
from rlvr.types import RolloutBatch


def component_names(entries: list[Any], task_name: str) -> list[str]:
    """The ``reward_components`` keys of a ``rewards:`` list (the verifier's default is the task's name)."""
    return [e.name or (task_name if e.type == "verifier" else e.type) for e in entries]


def check_rewards(cfg: Any, task: Any) -> None:
    """The ``rewards:`` checks that need the task, run before any model loads (``rlvr train`` and
    :func:`rlvr.trainer.components.validate_run`).

    Raises:
        ConfigError: two components with one name (the verifier's default is the task's name), a
            ``sources`` label the mixture does not have, a mixture source no entry with a non-zero weight
            scores, or an ``api_key_env`` variable that is not set.
    """
    entries = cfg.rewards
    if not entries:
        return
    names = component_names(entries, getattr(task, "name", "task"))
    for i, n in enumerate(names):
        if n in names[:i]:
            raise ConfigError(f"rewards[{i}] and rewards[{names.index(n)}] are both named {n!r} (the verifier's "
                              f"default name is the task's): give rewards[{i}] a name: ...")
    labels = list(getattr(task, "labels", []) or [])
    for i, e in enumerate(entries):
        bad = sorted(set(e.sources or ()) - set(labels))
        if bad:
            raise ConfigError(f"rewards[{i}].sources: {bad} are not sources of task.mixture "
                              f"(its labels: {', '.join(labels) or 'none'})")
        if e.type == "judge" and e.client == "openai" and e.api_key_env:
            from rlvr.rewards.judge_clients import api_key_from_env

            api_key_from_env(e.api_key_env, f"rewards[{i}]:")
    for label in labels:
        if not any(e.weight != 0 and (e.sources is None or label in e.sources) for e in entries):
            raise ConfigError(f"rewards: no entry with a non-zero weight scores task.mixture source {label!r}, "
                              "so its completions would all score 0 (add it to an entry's sources)")


def build_scorer(cfg: Any, task: Any, tokenizer: Any, *, device: Any = None, system_prompt: str | None = None) -> Any:
    """The run's scorer: the task's :class:`Scorer`, or a :class:`CombinedScorer` over it when
    ``cfg.rewards`` is set (its reward models and judges loaded here, on ``device`` where they say
    ``device: trainer``).

    Raises:
        ConfigError: see :func:`check_rewards`. ModelLoadError: a reward model or judge cannot load.
    """
    has_verifier = not cfg.rewards or any(e.type == "verifier" for e in cfg.rewards)
    verifier = Scorer(task, tokenizer, fatal=cfg.reward_errors_fatal,
                      timeout_s=cfg.reward_timeout_s if has_verifier else 0.0,
                      num_workers=cfg.reward_num_workers if has_verifier else 1)
    if not cfg.rewards:
        return verifier
    check_rewards(cfg, task)
    names = component_names(cfg.rewards, getattr(task, "name", "task"))
    learned: dict[int, Any] = {}
    for i, (e, name) in enumerate(zip(cfg.rewards, names)):
        if e.type == "reward_model":
            learned[i] = RewardModelReward.from_config(e, trainer_device=device, system_prompt=system_prompt,
                                                       name=name)
        elif e.type == "judge":
            learned[i] = JudgeReward.from_config(e, trainer_device=device, name=name)
    return CombinedScorer(verifier, cfg.rewards, learned, names)


class CombinedScorer:
    """Scores a batch with every ``rewards:`` entry and sums them by weight.

    Args:
        verifier: the task's :class:`Scorer` (called for the rows the ``verifier`` entry covers, if any).
        entries: the ``rewards:`` entries (:class:`rlvr.config.rewards.RewardConfig`).
        learned: entry index → its component (``score(problems, texts) -> [n]``, ``pop_metrics()``,
            ``close()``) for the ``reward_model`` and ``judge`` entries.
        names: each entry's component name (:func:`component_names`).

    Fills ``batch.texts``, ``batch.rewards`` ``[N]`` (the weighted sum), ``batch.correct`` ``[N]`` (the
    verifier's where it scores the row; elsewhere: some learned component's raw score reached its
    ``correct_threshold``), ``batch.feedback`` (the verifier's) and ``batch.reward_components[name]``
    (each component's **raw** score, NaN on rows it does not score, so ``rewards/<name>/mean`` reads in
    the component's own units).
    """

    def __init__(self, verifier: Scorer, entries: list[Any], learned: dict[int, Any], names: list[str]) -> None:
        self.verifier = verifier
        self.entries = list(entries)
        self.learned = dict(learned)
        self.names = list(names)
        self.running = {names[i]: RunningMoments() for i, e in enumerate(self.entries) if e.normalize == "running"
                        and e.type != "verifier"}
        self._lock = threading.Lock()
        self._seconds = {names[i]: 0.0 for i in self.learned}

    # the Scorer interface the trainer and samplers read
    @property
    def task(self) -> Any:
        """The task (the verifier's)."""
        return self.verifier.task

    @property
    def tokenizer(self) -> Any:
        """The policy's tokenizer."""
        return self.verifier.tokenizer

    calls_total = property(lambda self: self.verifier.calls_total, doc="Verifier calls so far.")
    errors_total = property(lambda self: self.verifier.errors_total, doc="Failed verifier calls so far.")
    timeouts_total = property(lambda self: self.verifier.timeouts_total, doc="Timed-out verifier calls so far.")
    last_error = property(lambda self: self.verifier.last_error, doc="The newest failed verifier call.")

    def decode(self, batch: RolloutBatch) -> list[str]:
        """Completion texts ``[N]`` (:meth:`Scorer.decode`)."""
        return self.verifier.decode(batch)

    def _rows(self, entry: Any, labels: list[Any]) -> list[int]:
        if entry.sources is None:
            return list(range(len(labels)))
        return [i for i, lab in enumerate(labels) if lab in entry.sources]

    def score(self, batch: RolloutBatch) -> ScoreStats:
        """Fill the batch's reward fields in place (see the class docstring); returns the verifier's
        counters (an empty :class:`ScoreStats` when no verifier entry scores any row)."""
        texts = self.decode(batch)
        n = len(texts)
        problems = [batch.problems[pi] for pi in batch.prompt_index.tolist()]
        labels = [p.metadata.get(SOURCE_KEY) for p in problems]
        total = torch.zeros(n, dtype=torch.float64)
        correct: list[bool | None] = [None] * n
        feedback: list[str | None] = [None] * n
        comps: dict[str, torch.Tensor] = {}
        stats = ScoreStats()
        for i, e in enumerate(self.entries):
            rows = self._rows(e, labels)
            comp = torch.full((n,), math.nan, dtype=REWARD_DTYPE)
            if rows and e.type == "verifier":
                stats, raw = self._verify(batch, rows, correct, feedback)
                value = raw
            elif rows:
                t0 = time.perf_counter()
                raw = self.learned[i].score([problems[r] for r in rows], [texts[r] for r in rows]).to(REWARD_DTYPE)
                with self._lock:
                    self._seconds[self.names[i]] += time.perf_counter() - t0
                value = self._normalize(e, self.names[i], raw, batch.group_id[rows])
            if rows:
                comp[rows] = raw
                total[rows] += e.weight * value.double()
            comps[self.names[i]] = comp
        for r in range(n):
            if correct[r] is None:  # no verifier on this row: a learned component's threshold
                correct[r] = any(e.resolved_threshold is not None and e.type != "verifier"
                                 and not math.isnan(float(comps[self.names[i]][r]))
                                 and float(comps[self.names[i]][r]) >= e.resolved_threshold
                                 for i, e in enumerate(self.entries))
        batch.texts = texts
        batch.rewards = total.to(REWARD_DTYPE)
        batch.correct = torch.tensor(correct, dtype=torch.bool)
        batch.feedback = feedback
        batch.reward_components.update(comps)
        return stats

    def _verify(self, batch: RolloutBatch, rows: list[int], correct: list, feedback: list) -> tuple[ScoreStats, torch.Tensor]:
        """The verifier's scores of ``rows`` (the whole batch in one call when it covers every row)."""
        task_key = getattr(self.verifier.task, "name", "task")
        sub = batch if len(rows) == len(batch) else batch.select(rows)
        had = batch.reward_components.get(task_key) if sub is batch else None
        stats = self.verifier.score(sub)
        for k, r in enumerate(rows):
            correct[r] = bool(sub.correct[k])
            feedback[r] = sub.feedback[k]
        raw = sub.rewards.clone()
        if sub is batch:  # Scorer.score set reward_components[task name] and the batch's fields
            if had is None:
                batch.reward_components.pop(task_key, None)
            else:
                batch.reward_components[task_key] = had
        return stats, raw

    def _normalize(self, entry: Any, name: str, raw: torch.Tensor, group_id: torch.Tensor) -> torch.Tensor:
        if entry.normalize == "group":
            return group_zscore(raw, group_id)
        if entry.normalize == "running":
            with self._lock:
                return self.running[name].normalize(raw)
        return raw

    def round_metrics(self) -> dict[str, float]:
        """Each learned component's counters since the last call (``<name>/calls``, ``<name>/failures``
        and ``timeouts``; the judge's ``parse_failures``, ``cache_hits``, ``latency_s``; the reward model's
        ``seconds``), ``timing/rewards/<name>_s`` and, with ``normalize: running``,
        ``rewards/<name>/running_mean`` and ``running_std``."""
        m: dict[str, float] = {}
        for i, comp in self.learned.items():
            m.update(comp.pop_metrics())
        with self._lock:
            for name, s in self._seconds.items():
                m[f"timing/rewards/{name}_s"] = s
                self._seconds[name] = 0.0
            for name, rm in self.running.items():
                m[f"rewards/{name}/running_mean"] = rm.mean
                m[f"rewards/{name}/running_std"] = rm.std
        return m

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: ``{"running": {name: moments}}`` (JSON-serialisable)."""
        with self._lock:
            return {"running": {name: rm.state_dict() for name, rm in self.running.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; a component the checkpoint lacks starts afresh (with a warning)."""
        saved = (state or {}).get("running", {})
        for name, rm in self.running.items():
            if name in saved:
                rm.load_state_dict(saved[name])
            else:
                warnings.warn(f"rewards: the checkpoint holds no running statistics of {name!r}; "
                              "its normalisation starts afresh", stacklevel=2)

    def close(self) -> None:
        """Stop the verifier's workers and the judges' threads."""
        self.verifier.close()
        for comp in self.learned.values():
            comp.close()


__all__ = ["CombinedScorer", "build_scorer", "check_rewards", "component_names"]

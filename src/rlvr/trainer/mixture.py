"""The prompt stream of a task mixture: which source each prompt comes from, and the curriculum.

:class:`MixtureLoader` stands where :class:`rlvr.trainer.data.PromptLoader` stands for one task (same
``next`` / ``state_dict`` / ``load_state_dict`` / ``reshuffle``), so the samplers, the checkpoint and
the overlap pipeline see no difference. Every source has its own epoch-wrapping shuffle; slot ``n`` of
the run (the n-th prompt drawn) goes to the source that ``Random(seed, n)`` picks with the weights in
force. The weights are the entries' ``weight`` or ``task.curriculum.weights_by_step`` at the policy's
step, times the multipliers of the ``solved`` rule. The state is a few integers and floats, all in
``trainer_state.json``, so a resumed run draws exactly the prompts the uninterrupted run draws.
Design and keys: ``docs/mixtures.md``.
"""

from __future__ import annotations

import bisect
import random
from typing import Any, Sequence

from rlvr.errors import ConfigError
from rlvr.tasks.mixture import SOURCE_KEY
from rlvr.trainer.data import PromptLoader


def weights_at_step(points: Sequence[tuple[int, Sequence[float]]], step: int) -> list[float]:
    """Piecewise-linear weights: ``points`` = ``[(step_j, weights_j)]`` with increasing ``step_j``;
    linear between neighbouring knots, the first knot's weights before it and the last's after it.

    Example: knots ``(0, [1, 0])`` and ``(10, [0, 1])`` give ``[0.7, 0.3]`` at step 3.
    Interpretation: the usual shape of a data-mixture schedule (a linear warm-in of a hard source).
    """
    steps = [s for s, _ in points]
    j = bisect.bisect_right(steps, step)
    if j == 0:
        return list(points[0][1])
    if j == len(points):
        return list(points[-1][1])
    (s0, w0), (s1, w1) = points[j - 1], points[j]
    t = (step - s0) / (s1 - s0)
    return [a + t * (b - a) for a, b in zip(w0, w1)]


def pick(weights: Sequence[float], u: float) -> int:
    """The index whose cumulative normalised weight first exceeds ``u`` ∈ [0, 1) (inverse CDF); zero
    weights are never picked.

    Raises:
        ValueError: no weight is > 0.
    """
    total = float(sum(weights))
    if not total > 0:
        raise ValueError(f"task mixture: every source's weight is 0 ({list(weights)}); nothing to draw from")
    acc = 0.0
    last = max(i for i, w in enumerate(weights) if w > 0)
    for i, w in enumerate(weights):
        acc += w / total
        if w > 0 and u < acc:
            return i
    return last  # rounding: u just below 1


class MixtureLoader:
    """Draws prompts from several sources by weight; its position and curriculum state resume exactly.

    Args:
        labels: the sources' labels (``MixtureTask.labels``).
        problems: per source, its training problems (each non-empty).
        weights: the entries' ``weight`` (used when ``curriculum.weights_by_step`` is unset).
        seed: the run seed (source ``i`` shuffles with a seed derived from it and ``i``).
        curriculum: ``task.curriculum`` (:class:`rlvr.config.mixture.CurriculumConfig`) or ``None``.

    Raises:
        ValueError: a source has no training problems (named).
        ConfigError: ``weights_by_step`` names other sources than the mixture's
            (``task.curriculum.weights_by_step[j]`` named).
    """

    def __init__(self, labels: Sequence[str], problems: Sequence[Sequence[Any]], weights: Sequence[float],
                 seed: int, curriculum: Any = None) -> None:
        self.labels = list(labels)
        for label, ps in zip(self.labels, problems):
            if not ps:
                raise ValueError(f"task mixture: source {label!r} has no training problems")
        self.loaders = [PromptLoader(ps, seed=seed * 1_000_003 + 7_919 * (i + 1)) for i, ps in enumerate(problems)]
        self.problems = [p for ps in problems for p in ps]
        self.base_weights = [float(w) for w in weights]
        self.seed = seed
        self.points: list[tuple[int, list[float]]] | None = None
        self.solved = None if curriculum is None else curriculum.solved
        if curriculum is not None and curriculum.weights_by_step is not None:
            self.points = []
            for j, pt in enumerate(curriculum.weights_by_step):
                if set(pt.weights) != set(self.labels):
                    raise ConfigError(f"task.curriculum.weights_by_step[{j}].weights names {sorted(pt.weights)}; "
                                     f"the mixture's sources are {sorted(self.labels)}")
                self.points.append((pt.step, [float(pt.weights[x]) for x in self.labels]))
        self.drawn = 0
        self.step = 0
        self.multipliers = [1.0] * len(self.labels)
        self.last_weights = self.weights()  # those of the latest draw (what round_metrics reports)
        self.history: list[list[float]] = [[] for _ in self.labels]

    # ------------------------------------------------------------------ drawing
    def weights(self) -> list[float]:
        """The normalised weights in force: schedule (or base) × solved-rule multipliers, summing to 1."""
        base = self.base_weights if self.points is None else weights_at_step(self.points, self.step)
        w = [b * m for b, m in zip(base, self.multipliers)]
        total = sum(w)
        return [x / total for x in w] if total > 0 else w

    def set_step(self, step: int) -> None:
        """The optimizer step of the policy the next prompts are drawn for (``weights_by_step``'s x axis)."""
        self.step = int(step)

    def next(self, k: int) -> list[Any]:
        """The next ``k`` prompts; slot ``n`` goes to the source ``Random(seed·1_000_003 + n)`` picks.

        Raises:
            ValueError: every weight in force is 0.
        """
        w = self.last_weights = self.weights()
        out = []
        for _ in range(k):
            i = pick(w, random.Random(self.seed * 1_000_003 + self.drawn).random())
            self.drawn += 1
            out.append(self.loaders[i].next(1)[0])
        return out

    def reshuffle(self) -> None:
        """Every source starts a fresh shuffle (its next epoch); the slot counter goes on."""
        for loader in self.loaders:
            loader.reshuffle()

    # ------------------------------------------------------------------ curriculum
    def observe(self, counts: dict[str, tuple[float, float]]) -> list[str]:
        """Feed one generation round's ``{label: (correct rows, rows)}`` to the ``solved`` rule.

        A source with rows appends its pass rate to its window (the last ``window`` rounds that drew
        from it); a full window with mean ``>= threshold`` multiplies the source's weight by ``factor``
        and empties the window — unless that would leave no source with a positive multiplier.

        Returns:
            The labels whose weight was cut this round.
        """
        cut: list[str] = []
        if self.solved is None:
            return cut
        rule = self.solved
        for i, label in enumerate(self.labels):
            correct, rows = counts.get(label, (0.0, 0.0))
            if rows <= 0:
                continue
            h = self.history[i]
            h.append(float(correct) / float(rows))
            del h[:-rule.window]
            if len(h) == rule.window and sum(h) / len(h) >= rule.threshold:
                others = any(m > 0 for j, m in enumerate(self.multipliers) if j != i)
                if rule.factor > 0 or others:
                    self.multipliers[i] *= rule.factor
                    cut.append(label)
                h.clear()
        return cut

    def round_metrics(self, batch: Any) -> dict[str, float]:
        """Per-source scalars of a scored batch: ``reward/<label>/mean``, ``reward/<label>/pass_rate``,
        ``mixture/<label>/rows`` (completions) and ``mixture/<label>/weight`` (the normalised weight of the
        latest draw); a source with no row this round gets only its weight."""
        out: dict[str, float] = {}
        stats = source_stats(batch)
        for label, w in zip(self.labels, self.last_weights):
            out[f"mixture/{label}/weight"] = float(w)
            if label in stats:
                s = stats[label]
                out[f"reward/{label}/mean"] = s["reward_sum"] / s["rows"]
                out[f"reward/{label}/pass_rate"] = s["correct"] / s["rows"]
                out[f"mixture/{label}/rows"] = float(s["rows"])
        return out

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The position (slot counter, every source's shuffle) and the curriculum's state; plain JSON."""
        return {"kind": "mixture", "drawn": self.drawn, "step": self.step, "seed": self.seed,
                "sources": [loader.state_dict() for loader in self.loaders],
                "multipliers": list(self.multipliers), "history": [list(h) for h in self.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`.

        Raises:
            ValueError: the state is not a mixture's or has another number of sources.
        """
        if state.get("kind") != "mixture" or len(state.get("sources", [])) != len(self.loaders):
            raise ValueError(f"loader state is not that of this {len(self.loaders)}-source mixture: {sorted(state)}")
        self.drawn, self.step, self.seed = int(state["drawn"]), int(state["step"]), int(state["seed"])
        for loader, st in zip(self.loaders, state["sources"]):
            loader.load_state_dict(st)
        self.multipliers = [float(x) for x in state["multipliers"]]
        self.history = [[float(x) for x in h] for h in state["history"]]
        self.last_weights = self.weights()


def source_stats(batch: Any) -> dict[str, dict[str, float]]:
    """``{label: {"rows", "correct", "reward_sum"}}`` over a scored batch's rows, by their problem's
    ``metadata["source"]`` (rows of problems without one are left out)."""
    out: dict[str, dict[str, float]] = {}
    if len(batch) == 0 or batch.rewards is None:
        return out
    rewards = batch.rewards.tolist()
    correct = batch.correct.tolist() if batch.correct is not None else [False] * len(rewards)
    for r, pi in enumerate(batch.prompt_index.tolist()):
        label = batch.problems[pi].metadata.get(SOURCE_KEY)
        if label is None:
            continue
        s = out.setdefault(label, {"rows": 0.0, "correct": 0.0, "reward_sum": 0.0})
        s["rows"] += 1
        s["correct"] += float(bool(correct[r]))
        s["reward_sum"] += float(rewards[r])
    return out


def round_counts(batches: Sequence[Any], labels: Sequence[str], dp: Any = None) -> dict[str, tuple[float, float]]:
    """``{label: (correct rows, rows)}`` over a round's raw batches, summed over ranks when ``dp`` (a
    :class:`rlvr.distributed.DataParallel` of a multi-process job) is given, so every rank's curriculum
    sees the same counts and the ranks' loaders stay identical."""
    flat = [0.0] * (2 * len(labels))
    for b in batches:
        stats = source_stats(b)
        for i, label in enumerate(labels):
            if label in stats:
                flat[2 * i] += stats[label]["correct"]
                flat[2 * i + 1] += stats[label]["rows"]
    if dp is not None:
        flat = list(dp.sum(flat))
    return {label: (flat[2 * i], flat[2 * i + 1]) for i, label in enumerate(labels)}


def build_loader(task: Any, cfg: Any) -> Any:
    """The run's prompt loader: a :class:`MixtureLoader` for a :class:`~rlvr.tasks.mixture.MixtureTask`
    (weights from its sources, ``cfg.task.curriculum``), else a :class:`PromptLoader` over
    ``task.problems("train")``; both seeded with ``cfg.seed``."""
    from rlvr.tasks.mixture import MixtureTask

    if isinstance(task, MixtureTask):
        return MixtureLoader(task.labels, task.source_problems("train"), [s.weight for s in task.sources],
                             seed=cfg.seed, curriculum=cfg.task.curriculum)
    return PromptLoader(task.problems("train"), seed=cfg.seed)


__all__ = ["MixtureLoader", "build_loader", "pick", "round_counts", "source_stats", "weights_at_step"]

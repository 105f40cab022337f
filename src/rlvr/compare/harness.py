"""``rlvr compare``: run several arms (recipe + overrides) × seeds under one equal budget, then report.

Layout of a comparison folder ``OUT``::

    OUT/compare.yaml                 the resolved comparison spec (written once)
    OUT/<arm>/seed<k>/               one run: metrics.jsonl, curve.jsonl, config.yaml, result.json
    OUT/report.md, OUT/summary.json  the table (mean ± std over seeds)
    OUT/reward_curves.png, OUT/diagnostics.png

A run is finished when its ``result.json`` exists (written atomically, last); re-running the same
comparison skips finished runs and starts unfinished ones afresh, so an interrupted comparison
resumes where it stopped at run granularity.

Budget (the same for every arm, ``Budget``): ``steps`` optimizer updates, ``rollouts`` sampled
completions, or ``tokens`` generated completion tokens. Rollouts and tokens are counted at the
sampler, so rows that dynamic sampling (DAPO) or extra exploration (UEC-RL) generate and then
drop still count: every arm pays for all it generates. A draw that would exceed a rollout budget is
refused before generation; a draw that pushes the token count over a token budget is discarded
before any update uses it; either ends the run (:class:`BudgetExhausted`).

Source: interpretation of issue 8 (no paper); the fairness rule "count every generated rollout"
follows DAPO §3.2, whose dynamic sampling trades extra generation for full batches.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import yaml

from rlvr.compare.pieces import PIECE_FILE, Deadline, PieceState, TimeLimitReached
from rlvr.compare.report import BASELINE, read_curve, write_report  # noqa: F401 (re-exported)
from rlvr.errors import ConfigError, IdleRunError, RunStopped
from rlvr.text import plural
from rlvr.eval.plot import read_jsonl_rows, smooth  # noqa: F401 (re-exported)
from rlvr.eval.report import write_text_atomic

BudgetKind = Literal["steps", "rollouts", "tokens"]


class BudgetExhausted(RunStopped):
    """Raised inside a run when its next step would exceed the comparison budget (ends the run; a
    :class:`~rlvr.errors.RunStopped`, so the run's summary says ``stopped``, not ``failed``)."""


@dataclass(frozen=True)
class Budget:
    """What every arm may spend: ``kind`` ∈ {steps, rollouts, tokens} and the amount (≥ 1).

    Raises:
        ConfigError: unknown kind or a non-positive amount.
    """

    kind: BudgetKind
    amount: int

    def __post_init__(self) -> None:
        if self.kind not in ("steps", "rollouts", "tokens"):
            raise ConfigError(f"compare budget kind must be steps, rollouts or tokens, got {self.kind!r}")
        if int(self.amount) < 1:
            raise ConfigError(f"compare budget {self.kind} must be ≥ 1, got {self.amount}")

    @staticmethod
    def parse(value: str | dict[str, Any]) -> "Budget":
        """``"rollouts=2048"`` or ``{"rollouts": 2048}`` → ``Budget``.

        Raises:
            ConfigError: malformed text or more than one kind.
        """
        if isinstance(value, str):
            if "=" not in value:
                raise ConfigError(f"compare budget {value!r} must look like steps=N, rollouts=N or tokens=N")
            k, _, v = value.partition("=")
            value = {k.strip(): v.strip()}
        if not isinstance(value, dict) or len(value) != 1:
            raise ConfigError(f"compare budget must name exactly one of steps/rollouts/tokens, got {value!r}")
        (k, v), = value.items()
        try:
            return Budget(k, int(float(v)))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ConfigError(f"compare budget {k}: expected an integer, got {v!r}") from None


@dataclass
class Arm:
    """One algorithm under comparison: a name, config files/recipes, and ``key=value`` overrides."""

    name: str
    configs: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)

    @staticmethod
    def parse(text: str) -> "Arm":
        """``"grpo"``, ``"hi=dapo"``, ``"mix=grpo+my.yaml epsilon=0.3 beta=0.01"`` → ``Arm``.

        The first word is ``NAME=RECIPES`` (or just ``RECIPE``, which is then also the name); recipes
        are joined by ``+``; the other words are overrides.

        Raises:
            ConfigError: empty text or an invalid name.
        """
        words = text.split()
        if not words:
            raise ConfigError("compare --arm needs at least a recipe name")
        head, rest = words[0], words[1:]
        name, _, recipes = head.partition("=") if "=" in head else (head, "", head)
        return Arm(_check_name(name), [r for r in recipes.split("+") if r], rest)




def _check_name(name: str) -> str:
    if not name or any(c in name for c in "/\\ ") or name.startswith("."):
        raise ConfigError(f"compare arm name {name!r} must be a plain folder name")
    return name


@dataclass
class CompareSpec:
    """A whole comparison.

    Attributes:
        arms: the arms (distinct names).
        seeds: run seeds (each arm runs once per seed; ``seed=<k>`` is set on the run config).
        budget: the equal budget.
        output_dir: the comparison folder.
        base_configs: config files/recipes applied before each arm's own.
        common_configs: config files/recipes applied after each arm's own (e.g. the ``testbed``
            recipe: model, task, batch geometry and learning rate shared by every arm).
        common: overrides applied to every arm after its recipes (task, model, batch geometry,
            learning rate: whatever must be equal across arms), before the arm's own overrides.
        eval_num_samples, eval_ks, eval_limit: held-out evaluation after each run (pass@k over
            ``eval_limit`` problems of the eval split with ``eval_num_samples`` samples each).
        eval_baseline: also evaluate the untrained policy (the first arm's run config, per seed) the
            same way; the report shows it as the row ``initial`` (before → after at a glance).
        eval_curve_points: with ``n > 1``, also evaluate held-out pass@k during training each time the
            run has spent another ``1/n`` of its budget (``n − 1`` mid-run evaluations; the last point is
            the final evaluation). They land in ``curve.jsonl`` as ``eval/pass@k`` next to the step,
            rollout, token and wall-clock counters, so learning speed can be read on held-out problems
            (training reward is not comparable across samplers: FBOS-RL's feedback rows, UEC-RL's
            exploration rows and IB-TPO's branched leaves all sample other distributions). Evaluation
            time is left out of ``wall_s``.
        max_steps_cap: safety cap on optimizer steps for rollout/token budgets.
        max_idle_draws: a run ends (stop reason "stalled") after this many sampler draws in a row
            without an optimizer update.
    """

    arms: list[Arm]
    seeds: list[int]
    budget: Budget
    output_dir: str = "runs/compare"
    base_configs: list[str] = field(default_factory=list)
    common_configs: list[str] = field(default_factory=list)
    common: list[str] = field(default_factory=list)
    eval_num_samples: int = 8
    eval_ks: list[int] = field(default_factory=lambda: [1, 8])
    eval_limit: int | None = 64
    eval_baseline: bool = False
    eval_curve_points: int = 0
    max_steps_cap: int = 100_000
    max_idle_draws: int = 100

    def __post_init__(self) -> None:
        names = [a.name for a in self.arms]
        if not names:
            raise ConfigError("compare needs at least one arm")
        if len(set(names)) != len(names):
            raise ConfigError(f"compare arm names must be distinct, got {names}")
        if not self.seeds:
            raise ConfigError("compare needs at least one seed")
        if not self.eval_ks or any(not 1 <= k <= self.eval_num_samples for k in self.eval_ks):
            raise ConfigError(f"compare eval.ks={self.eval_ks}: every k must be between 1 and eval.num_samples="
                              f"{self.eval_num_samples}")
        if self.eval_baseline and BASELINE in names:
            raise ConfigError(f"compare arm name {BASELINE!r} is reserved for the untrained policy (eval.baseline)")

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "CompareSpec":
        """Build from a mapping (a ``compare.yaml``); arms are strings (see :meth:`Arm.parse`) or
        mappings ``{name, config: [..], overrides: [..]}``.

        Raises:
            ConfigError: unknown keys or bad values.
        """
        known = {"arms", "seeds", "budget", "output_dir", "base_configs", "common_configs", "common", "eval",
                 "max_steps_cap", "max_idle_draws"}
        bad = set(d) - known
        if bad:
            raise ConfigError(f"compare spec: unknown keys {sorted(bad)}; valid: {sorted(known)}")
        for key in ("arms", "base_configs", "common_configs", "common"):
            if key in d and d[key] is not None and not isinstance(d[key], list):
                raise ConfigError(f"compare spec: {key} must be a list, got {type(d[key]).__name__} {d[key]!r}"
                                  + ("; recipes shared by every arm go under common_configs" if key == "common" else ""))
        arms = []
        for a in d.get("arms") or []:
            if isinstance(a, str):
                arms.append(Arm.parse(a))
            elif isinstance(a, dict):
                bad_arm = set(a) - {"name", "config", "configs", "overrides"}
                if bad_arm or "name" not in a:
                    raise ConfigError(f"compare spec: arm {a!r}: keys are name, config (list of recipes), overrides; "
                                      f"unknown {sorted(bad_arm)}" if bad_arm else f"compare spec: arm {a!r} needs a name")
                cfgs = a.get("config", a.get("configs", []))
                arms.append(Arm(_check_name(str(a["name"])), [cfgs] if isinstance(cfgs, str) else list(cfgs),
                                [str(o) for o in a.get("overrides", [])]))
            else:
                raise ConfigError(f"compare spec: an arm must be a string or a mapping, got {a!r}")
        ev = d.get("eval") or {}
        if not isinstance(ev, dict) or set(ev) - {"num_samples", "ks", "limit", "baseline", "curve_points"}:
            raise ConfigError(f"compare spec: eval must be a mapping with keys num_samples, ks, limit, baseline, "
                              f"curve_points; got {ev!r}")
        seeds = d.get("seeds", [0])
        seeds = [seeds] if isinstance(seeds, int) else seeds
        if not isinstance(seeds, list) or not all(isinstance(x, int) for x in seeds):
            raise ConfigError(f"compare spec: seeds must be a list of integers, got {d.get('seeds')!r}")
        if "budget" not in d:
            raise ConfigError("compare spec: budget is required (steps=N, rollouts=N or tokens=N)")
        return CompareSpec(
            arms=arms, seeds=seeds, budget=Budget.parse(d["budget"]),
            output_dir=str(d.get("output_dir", "runs/compare")), base_configs=list(d.get("base_configs", [])),
            common_configs=list(d.get("common_configs", [])),
            common=[str(o) for o in d.get("common", [])], eval_num_samples=int(ev.get("num_samples", 8)),
            eval_ks=[int(k) for k in ev.get("ks", [1, 8])], eval_limit=ev.get("limit", 64),
            eval_baseline=bool(ev.get("baseline", False)), eval_curve_points=int(ev.get("curve_points", 0)),
            max_steps_cap=int(d.get("max_steps_cap", 100_000)), max_idle_draws=int(d.get("max_idle_draws", 100)),
        )

    def report_arms(self) -> list[str]:
        """Row names of the report: the untrained policy first (with ``eval_baseline``), then the arms."""
        return ([BASELINE] if self.eval_baseline else []) + [a.name for a in self.arms]

    def to_dict(self) -> dict[str, Any]:
        """The inverse of :meth:`from_dict` (YAML-serialisable)."""
        return {
            "output_dir": self.output_dir, "seeds": self.seeds, "budget": {self.budget.kind: self.budget.amount},
            "base_configs": self.base_configs, "common_configs": self.common_configs, "common": self.common,
            "arms": [{"name": a.name, "config": a.configs, "overrides": a.overrides} for a in self.arms],
            "eval": {"num_samples": self.eval_num_samples, "ks": self.eval_ks, "limit": self.eval_limit,
                     "baseline": self.eval_baseline, **({"curve_points": self.eval_curve_points}
                                                        if self.eval_curve_points else {})},
            "max_steps_cap": self.max_steps_cap,
        }

    def run_config(self, arm: Arm, seed: int, run_dir: Path):
        """The validated :class:`~rlvr.config.RLConfig` of one run.

        Order: ``base_configs``, arm configs, ``common_configs``, then ``common`` overrides, the arm's overrides, and
        finally ``seed``, ``logging.output_dir`` and (for a step budget) ``max_steps``.

        Raises:
            ConfigError: any invalid key or value (names the arm).
        """
        from rlvr.config import build_config
        from rlvr.trainer.components import validate_components

        steps = self.budget.amount if self.budget.kind == "steps" else self.max_steps_cap
        tail = [f"seed={seed}", f"logging.output_dir={run_dir}", f"max_steps={steps}", "save_steps=0"]
        try:
            cfg = build_config(self.base_configs + arm.configs + self.common_configs, self.common + arm.overrides + tail)
            validate_components(cfg)
        except ConfigError as exc:
            raise ConfigError(f"compare arm {arm.name!r}: {exc}") from None
        return cfg


class BudgetMeter:
    """Wraps a sampler: counts rollouts and generated tokens at the source and enforces the budget.

    Args:
        sampler: the trainer's sampler (anything with ``sample(problems, G, params, **kw)``).
        budget: the comparison budget.

    ``rollouts``/``tokens`` count only draws that were kept (a discarded over-budget draw is not
    counted; rows that only re-view generated tokens, the sampler's ``view_only_kinds``, are not
    counted either). Other attributes are forwarded to the wrapped sampler.

    Stall guard: with ``progress`` (a callable returning the optimizer step), ``max_idle_draws``
    draws in a row without a new optimizer step end the run (an arm whose every group is filtered
    out, e.g. all zero-pass prompts, would otherwise generate forever under a step budget).
    """

    def __init__(self, sampler: Any, budget: Budget, *, progress: Callable[[], int] | None = None,
                 max_idle_draws: int = 100) -> None:
        self._inner = sampler
        self.budget = budget
        self.rollouts = 0
        self.tokens = 0
        self._progress = progress
        self.max_idle_draws = max_idle_draws
        self._idle = 0
        self._last_step: int | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def sample(self, problems: Sequence[Any], num_generations: int, params: Any, **kw: Any):
        """Draw through the wrapped sampler; raise :class:`BudgetExhausted` instead of overspending."""
        b = self.budget
        if self._progress is not None:
            step = self._progress()
            self._idle = self._idle + 1 if step == self._last_step else 0
            self._last_step = step
            if self._idle >= self.max_idle_draws:
                raise BudgetExhausted(f"stalled: no optimizer update in {plural(self._idle, 'draw')} ({plural(self.rollouts, 'rollout')})")
        if b.kind == "rollouts" and self.rollouts + len(problems) * num_generations > b.amount:
            raise BudgetExhausted(f"rollout budget {b.amount} reached ({self.rollouts} used)")
        batch = self._inner.sample(problems, num_generations, params, **kw)
        n, toks = generated_counts(batch, tuple(getattr(self._inner, "view_only_kinds", ())))
        if b.kind == "rollouts" and self.rollouts + n > b.amount:
            raise BudgetExhausted(f"rollout budget {b.amount} reached ({self.rollouts} used, draw of {n} refused)")
        if b.kind == "tokens" and self.tokens + toks > b.amount:
            raise BudgetExhausted(f"token budget {b.amount} reached ({self.tokens} used, draw of {toks} discarded)")
        self.rollouts += n
        self.tokens += toks
        return batch


def generated_counts(batch: Any, view_only_kinds: tuple[str, ...] = ()) -> tuple[int, int]:
    """``(sequences, tokens)`` a sampler generated for ``batch``: rows whose ``context_kind`` is in
    ``view_only_kinds`` repeat another row's tokens under a second context (FBOS-RL's ECC view) and are
    not counted again. A sampler whose rows share generated prefixes (IB-TPO's tree: each leaf row holds
    its whole root-to-leaf path) reports the tokens it actually decoded in ``meta["generated_tokens"]``,
    which then wins over the sum of the rows' completion masks (that sum would charge each shared
    prefix once per leaf, and an equal-token budget would then be unfair to the tree)."""
    rows = batch.generated_rows(view_only_kinds)
    decoded = (getattr(batch, "meta", None) or {}).get("generated_tokens")
    toks = int(decoded) if decoded is not None else int(batch.completion_mask[rows].sum())
    return len(rows), toks


CURVE_KEYS = ("reward/mean", "reward/pass_rate", "reward/frac_zero_std_groups", "actor/entropy", "actor/grad_norm",
              "actor/clip_ratio/region", "completions/mean_length", "staleness/mean")


def curve_values(metrics: dict[str, Any], primary_phase: str | None = None) -> dict[str, float]:
    """The :data:`CURVE_KEYS` of one logged step.

    A key a schedule logs only per phase (FBOS-RL's alternate mode logs ``epa/actor/entropy`` on its EPA
    step and ``ecc/actor/entropy`` on its ECC step):

    * ``primary_phase`` given (the schedule's ``primary_phase``, e.g. ``"epa"``): the bare key takes that
      phase's value only, and every other phase's value is kept under its own prefixed name
      (``ecc/actor/entropy``). Interpretation, because averaging mixes unlike quantities: the ECC step's
      entropy is measured on the feedback-augmented prompt, not on the task's prompt, and its gradient is
      exactly 0 when no FAP rollout passes — averaged in, they inflate the entropy and halve the grad
      norm of the run summary (measured on the testbed: entropy 0.88 instead of 0.38, grad norm 0.59
      instead of 1.2; docs/results/replication.md §1.4).
    * no ``primary_phase``: the mean of the finite phase values.
    """
    out: dict[str, float] = {}
    for k in CURVE_KEYS:
        v = metrics.get(k)
        if isinstance(v, (int, float)) and math.isfinite(v):
            out[k] = float(v)
            continue
        phased = {name[: -len(k) - 1]: float(x) for name, x in metrics.items()
                  if name.endswith("/" + k) and isinstance(x, (int, float)) and math.isfinite(x)}
        if not phased:
            continue
        if primary_phase is None:
            out[k] = sum(phased.values()) / len(phased)
            continue
        for phase, x in phased.items():
            out[k if phase == primary_phase else f"{phase}/{k}"] = x
    return out


def _atomic_json(path: Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2))


def run_one(spec: CompareSpec, arm: Arm, seed: int, *, model_factory: Callable[[Any], tuple[Any, Any]] | None = None,
            task_factory: Callable[[Any], Any] | None = None, log: Callable[[str], None] = print,
            deadline: Deadline | None = None) -> dict[str, Any]:
    """Run one arm × seed to its budget, evaluate it, and write ``result.json`` (last, atomically).

    With a ``deadline`` (:mod:`rlvr.compare.pieces`) the run stops at the first step boundary after
    it, writes a checkpoint and ``piece.json``, and raises :class:`TimeLimitReached`; a later call
    resumes it from that checkpoint (an unfinished run without ``piece.json`` starts afresh).

    Args:
        model_factory: ``cfg -> (model, tokenizer)``; default :func:`rlvr.models.load_policy` on
            ``cfg.model`` (tests pass the tiny in-process model).
        task_factory: ``cfg -> Task``; default :func:`rlvr.tasks.build_task` on ``cfg.task``.

    Returns:
        the result dict (also written to ``OUT/<arm>/seed<k>/result.json``).

    Raises:
        ConfigError: invalid run configuration; other errors of the run propagate.
        TimeLimitReached: the ``deadline`` passed (the run is checkpointed, not finished).
    """
    from rlvr.trainer.checkpoint import load_checkpoint
    from rlvr.trainer.lifecycle import RunInterrupted
    from rlvr.trainer.logger import _drop_rows_after
    from rlvr.trainer.trainer import Trainer

    run_dir = Path(spec.output_dir) / arm.name / f"seed{seed}"
    cfg = spec.run_config(arm, seed, run_dir)
    piece = PieceState.load(run_dir)
    if piece is None:
        if run_dir.exists():
            shutil.rmtree(run_dir)  # an unfinished run without a piece checkpoint: start it afresh
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    model, tok, task = _load_model_and_task(cfg, model_factory, task_factory)
    trainer = Trainer(cfg, model, tok, task)
    if piece is not None:
        load_checkpoint(trainer, piece.checkpoint)
        log(f"compare: {arm.name} seed {seed}: resumed at step {trainer.global_step} ({piece.rollouts} rollouts, "
            f"piece {piece.pieces + 1})")
    meter = BudgetMeter(trainer.sampler, spec.budget, progress=lambda: trainer.global_step,
                        max_idle_draws=spec.max_idle_draws)
    if piece is not None:
        meter.rollouts, meter.tokens, meter._idle = piece.rollouts, piece.tokens, piece.idle_draws
        meter._last_step = piece.step
    trainer.sampler = meter
    curve_path = run_dir / "curve.jsonl"
    t0 = time.perf_counter() - (piece.wall_s if piece else 0.0)
    if piece is not None:  # rows of a later piece that was killed before its checkpoint are redone
        _drop_rows_after(curve_path, piece.step)
    curve_f = open(curve_path, "a" if piece else "w")
    paused = [0.0]  # seconds spent in mid-run evaluations (left out of wall_s)
    next_point = [piece.next_point if piece else 1]

    def spent() -> float:
        b = spec.budget
        used = {"steps": trainer.global_step, "rollouts": meter.rollouts, "tokens": meter.tokens}[b.kind]
        return used / b.amount

    def record(tr: Any, m: dict[str, float]) -> None:
        row = {"step": tr.global_step, "rollouts": meter.rollouts, "tokens": meter.tokens,
               "wall_s": round(time.perf_counter() - t0 - paused[0], 3)}
        row.update(curve_values(m, getattr(tr.schedule, "primary_phase", None)))
        n = spec.eval_curve_points
        if n > 1 and next_point[0] < n and spent() >= next_point[0] / n:
            while next_point[0] < n and spent() >= next_point[0] / n:
                next_point[0] += 1
            te, was_training = time.perf_counter(), tr.model.training
            row.update(_eval_keys(_held_out_eval(spec, cfg, tr.model, tok, task), task))
            tr.model.train(was_training)
            paused[0] += time.perf_counter() - te
        curve_f.write(json.dumps(row) + "\n")
        curve_f.flush()
        if deadline is not None and deadline.passed():
            tr.request_stop()  # checkpoint at this step boundary (the trainer's SIGTERM path)

    trainer.callbacks.append(record)
    stop = "max_steps"
    try:
        trainer.train()
    except RunInterrupted as exc:
        if trainer._stop_asked is None or exc.checkpoint is None:
            raise  # a real SIGINT/SIGTERM: the comparison stops as before
        PieceState(checkpoint=str(exc.checkpoint), step=trainer.global_step, rollouts=meter.rollouts,
                   tokens=meter.tokens, idle_draws=meter._idle, wall_s=round(time.perf_counter() - t0 - paused[0], 3),
                   next_point=next_point[0], pieces=(piece.pieces if piece else 0) + 1).save(run_dir)
        log(f"compare: {arm.name} seed {seed}: time limit reached at step {trainer.global_step} "
            f"({meter.rollouts} rollouts); checkpoint {exc.checkpoint}; run the comparison again to continue")
        raise TimeLimitReached(f"{arm.name} seed {seed}") from None
    except BudgetExhausted as exc:
        stop = f"budget: {exc}"
    except IdleRunError:  # the trainer's own guard (max_idle_rounds): a stalled arm, not a failed one
        stop = f"stalled: no trainable group in {trainer.idle.rounds} generation rounds (max_idle_rounds)"
    finally:
        curve_f.close()
        trainer.close()  # a vLLM server the run started must not outlive it (one per arm x seed)
    wall = time.perf_counter() - t0 - paused[0]
    log(f"compare: {arm.name} seed {seed}: {plural(trainer.global_step, 'step')}, {plural(meter.rollouts, 'rollout')}, "
        f"{plural(meter.tokens, 'token')}, {wall:.1f} s ({stop})")
    ev = _eval_keys(_held_out_eval(spec, cfg, trainer.model, tok, task), task)
    if spec.eval_curve_points > 1:  # the final evaluation closes the held-out learning curve
        with open(curve_path, "a") as f:
            f.write(json.dumps({"step": trainer.global_step, "rollouts": meter.rollouts, "tokens": meter.tokens,
                                "wall_s": round(wall, 3), **ev}) + "\n")
    curve = read_curve(run_dir)
    result = {
        "arm": arm.name, "seed": seed, "steps": trainer.global_step, "rollouts": meter.rollouts,
        "tokens": meter.tokens, "wall_s": round(wall, 2), "stop": stop,
        **curve_summary(curve), **ev,
    }
    _atomic_json(run_dir / "result.json", result)
    for done in [*run_dir.glob("checkpoint-*"), run_dir / PIECE_FILE]:  # the pieces' state is not needed now
        shutil.rmtree(done, ignore_errors=True) if done.is_dir() else done.unlink(missing_ok=True)
    return result


def curve_summary(curve: list[dict[str, Any]]) -> dict[str, float]:
    """Final/best training reward and final entropy / mean grad norm of one run.

    ``reward/final``: mean ``reward/mean`` over the last ``w`` logged generation rounds, with
    ``w = max(1, min(5, n // 4))``; ``reward/best``: the maximum of the ``w``-point moving average;
    ``entropy/final``: mean ``actor/entropy`` (nats/token) over the last ``w`` steps;
    ``grad_norm/mean``: mean pre-clip gradient norm over the run. NaN where nothing was logged.
    """
    out: dict[str, float] = {}

    def col(k: str) -> list[float]:
        return [float(r[k]) for r in curve if k in r]

    for key, name in (("reward/mean", "reward"), ("reward/pass_rate", "pass_rate")):
        ys = col(key)
        if ys:
            w = max(1, min(5, len(ys) // 4))
            out[f"{name}/final"] = sum(ys[-w:]) / w
            out[f"{name}/best"] = max(smooth(ys, w))
        else:
            out[f"{name}/final"] = out[f"{name}/best"] = math.nan
    ent = col("actor/entropy")
    w = max(1, min(5, len(ent) // 4)) if ent else 1
    out["entropy/final"] = sum(ent[-w:]) / w if ent else math.nan
    g = col("actor/grad_norm")
    out["grad_norm/mean"] = sum(g) / len(g) if g else math.nan
    z = col("reward/frac_zero_std_groups")
    out["zero_std_groups/mean"] = sum(z) / len(z) if z else math.nan
    return out


def _run_in_worker(spec: CompareSpec, arm: Arm, seed: int, threads: int) -> dict[str, Any] | None:
    import torch

    torch.set_num_threads(threads)
    return _guarded(spec, arm, seed, None, None, lambda m: print(m, flush=True))


def _load_model_and_task(cfg: Any, model_factory: Callable[[Any], tuple[Any, Any]] | None,
                         task_factory: Callable[[Any], Any] | None) -> tuple[Any, Any, Any]:
    """``(model, tokenizer, task)`` of a run config: the factories when given, else
    :func:`rlvr.models.load_policy` and :func:`rlvr.tasks.build_task`."""
    if model_factory is None:
        import rlvr.testbed  # noqa: F401 (registers the testbed model source)
        from rlvr.models import load_policy

        model, tok = load_policy(cfg.model)
    else:
        model, tok = model_factory(cfg)
    if task_factory is None:
        import rlvr.testbed  # noqa: F401 (registers the testbed task type)
        from rlvr.tasks import build_task

        task = build_task(cfg.task)
    else:
        task = task_factory(cfg)
    return model, tok, task


def _held_out_eval(spec: CompareSpec, cfg: Any, model: Any, tok: Any, task: Any) -> dict[str, Any]:
    """The comparison's held-out evaluation (same problems, samples and seed for every run)."""
    from rlvr.eval.evaluate import evaluate

    return evaluate(
        model, tok, task, num_samples=spec.eval_num_samples, ks=spec.eval_ks, temperature=cfg.eval.temperature,
        top_p=cfg.top_p, max_new_tokens=cfg.max_completion_length, max_prompt_length=cfg.max_prompt_length,
        system_prompt=cfg.task.system_prompt, prompts_per_batch=max(1, 64 // spec.eval_num_samples), seed=10_007,
        limit=spec.eval_limit,
    )


def _eval_keys(ev: dict[str, Any], task: Any) -> dict[str, float]:
    """The ``eval/*`` keys a run records from one evaluation: ``eval/pass@k``, ``eval/reward/mean`` and,
    when the eval problems carry ``metadata["level"]`` (the testbed), ``eval/level<L>/pass@k`` per level
    (unbiased pass@k over that level's problems, from ``per_problem`` correct counts)."""
    from rlvr.core.pass_at_k import pass_at_k

    out = {f"eval/{k}": v for k, v in ev.items() if k.startswith("pass@") or k in ("reward/mean",)}
    ks = sorted(int(k.split("@")[1]) for k in ev if k.startswith("pass@") and k.split("@")[1].isdigit())
    try:
        level_of = {p.uid: p.metadata.get("level") for p in task.problems("eval")}
    except Exception:  # noqa: BLE001 - a task without an eval split or metadata: no per-level keys
        return out
    per: dict[Any, list[tuple[int, int]]] = {}
    for rec in ev.get("per_problem") or []:
        lv = level_of.get(rec.get("uid"))
        if lv is not None and "correct" in rec and "n" in rec:
            per.setdefault(lv, []).append((int(rec["n"]), int(rec["correct"])))
    for lv, rows in sorted(per.items()):
        for k in ks:
            ok = [pass_at_k(n, c, k) for n, c in rows if k <= n]
            if ok:
                out[f"eval/level{lv}/pass@{k}"] = sum(ok) / len(ok)
    return out


def run_baseline(spec: CompareSpec, seed: int, *, model_factory: Callable[[Any], tuple[Any, Any]] | None = None,
                 task_factory: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """Evaluate the untrained policy of the first arm's run config (``seed``) like every trained run,
    and write ``OUT/initial/seed<k>/result.json`` (eval keys only)."""
    run_dir = Path(spec.output_dir) / BASELINE / f"seed{seed}"
    cfg = spec.run_config(spec.arms[0], seed, run_dir)
    model, tok, task = _load_model_and_task(cfg, model_factory, task_factory)
    ev = _eval_keys(_held_out_eval(spec, cfg, model, tok, task), task)
    result = {"arm": BASELINE, "seed": seed, "steps": 0, "rollouts": 0, "tokens": 0, **ev}
    run_dir.mkdir(parents=True, exist_ok=True)
    _atomic_json(run_dir / "result.json", result)
    return result


def _guarded(spec: CompareSpec, arm: Arm, seed: int, model_factory, task_factory, log,
             deadline: Deadline | None = None) -> dict[str, Any] | None:
    """:func:`run_one`, but a run that crashes writes ``error.txt`` and yields None (the others go on)."""
    import traceback

    try:
        return run_one(spec, arm, seed, model_factory=model_factory, task_factory=task_factory, log=log,
                       deadline=deadline)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - one failing arm must not lose the comparison
        run_dir = Path(spec.output_dir) / arm.name / f"seed{seed}"
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "error.txt").write_text(traceback.format_exc())
        log(f"compare: {arm.name} seed {seed}: FAILED ({type(exc).__name__}: {exc}); see {run_dir / 'error.txt'}")
        return None


def run_compare(spec: CompareSpec, *, model_factory=None, task_factory=None, log: Callable[[str], None] = print,
                report: bool = True, jobs: int = 1, stop_after_s: float | None = None) -> list[dict[str, Any]]:
    """Run every arm × seed not finished yet (finished = ``result.json`` exists), then write the report.

    ``stop_after_s`` (one job only) limits this call: once that many seconds have passed, the run in
    progress stops at its next step boundary with a checkpoint (resumed by the next call, see
    :mod:`rlvr.compare.pieces`) and no further run starts; the report then covers the finished runs.

    Every run config is validated before the first run starts, so a typo in the last arm fails at
    once. Runs go arm by arm, seed by seed; with ``jobs > 1`` that many runs go at once, each in its
    own (spawned) process with one torch thread (factories are then not allowed: each worker loads
    the model from ``cfg.model``). Wall times of parallel runs share the CPU: compare them only
    between runs of the same comparison.

    Raises:
        ValueError: ``jobs > 1`` together with a model or task factory or with ``stop_after_s``.

    A run that raises (other than a configuration error) leaves ``error.txt`` in its folder, is left
    out of the results and the report, and is retried on the next invocation.

    Returns:
        all results (finished earlier or now), in arm × seed order.

    Raises:
        ConfigError: an invalid arm configuration, or an existing ``compare.yaml`` in the output
            folder that differs from ``spec`` (finished runs would not be comparable).
    """
    out = Path(spec.output_dir)
    for arm in spec.arms:
        for seed in spec.seeds:
            spec.run_config(arm, seed, out / arm.name / f"seed{seed}")
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "compare.yaml"
    now = spec.to_dict()
    if saved.exists():
        old = yaml.safe_load(saved.read_text()) or {}
        keep = ("budget", "base_configs", "common_configs", "common", "eval", "max_steps_cap")

        def same(k: str) -> bool:  # adding the baseline evaluation later keeps finished runs comparable
            a, b = old.get(k), now.get(k)
            if k == "eval" and isinstance(a, dict) and isinstance(b, dict):
                a, b = {**a, "baseline": None}, {**b, "baseline": None}
            return a == b

        diff = [k for k in keep if not same(k)]
        old_arms = {a["name"]: a for a in old.get("arms", [])}
        diff += [f"arm {a['name']}" for a in now["arms"] if a["name"] in old_arms and old_arms[a["name"]] != a]
        if diff:
            raise ConfigError(f"{saved} was written for a different comparison ({', '.join(diff)}); "
                              "use another output_dir or delete it")
        merged = dict(now)
        merged["arms"] = list(old_arms.values()) + [a for a in now["arms"] if a["name"] not in old_arms]
        merged["seeds"] = sorted(set(old.get("seeds", [])) | set(spec.seeds))
        now = merged
    saved.write_text(yaml.safe_dump(now, sort_keys=False))
    if jobs > 1 and (model_factory is not None or task_factory is not None):
        raise ValueError("run_compare: jobs > 1 loads models in worker processes; factories are not supported")
    if jobs > 1 and stop_after_s is not None:
        raise ValueError("run_compare: stop_after_s needs jobs=1 (one run at a time is checkpointed)")
    deadline = Deadline(stop_after_s)
    results: dict[tuple[str, int], dict[str, Any]] = {}
    todo = []
    for arm in spec.arms:
        for seed in spec.seeds:
            res_path = out / arm.name / f"seed{seed}" / "result.json"
            if res_path.exists():
                log(f"compare: {arm.name} seed {seed}: finished earlier, skipped")
                results[(arm.name, seed)] = json.loads(res_path.read_text())
            else:
                todo.append((arm, seed))
    if jobs > 1 and len(todo) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {(a.name, s): pool.submit(_run_in_worker, spec, a, s, 1) for a, s in todo}
            for key, fut in futures.items():
                results[key] = fut.result()
    else:
        try:
            for i, (arm, seed) in enumerate(todo):
                if i and deadline.passed():
                    log(f"compare: time limit ({stop_after_s} s) reached; {len(todo) - i} run(s) left for the next call")
                    raise TimeLimitReached("before " + arm.name)
                results[(arm.name, seed)] = _guarded(spec, arm, seed, model_factory, task_factory, log, deadline)
        except TimeLimitReached:
            if report:
                write_report(out, arms=spec.report_arms(), seeds=spec.seeds, budget=spec.budget)
            return [r for r in results.values() if r is not None]
    if spec.eval_baseline:
        for seed in spec.seeds:
            if not (out / BASELINE / f"seed{seed}" / "result.json").exists():
                log(f"compare: {BASELINE} seed {seed}: evaluating the untrained policy")
                run_baseline(spec, seed, model_factory=model_factory, task_factory=task_factory)
    if report:

        write_report(out, arms=spec.report_arms(), seeds=spec.seeds, budget=spec.budget)
    return [r for r in (results[(a.name, s)] for a in spec.arms for s in spec.seeds) if r is not None]

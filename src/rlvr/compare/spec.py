"""What a comparison is: its arms (recipe + overrides), seeds, budget and evaluation settings
(:class:`CompareSpec`, :class:`Arm`), parsed from ``--arm`` text or a ``compare.yaml``, and the
validated run config of one arm × seed (:meth:`CompareSpec.run_config`).

Separate from :mod:`rlvr.compare.harness` because parsing and validating a spec needs no model and
changes with the spec's keys, not with how runs are executed, resumed or written; the CLI builds a
spec before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.compare.budget import Budget
from rlvr.compare.report import BASELINE
from rlvr.errors import ConfigError


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

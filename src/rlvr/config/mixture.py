"""The curriculum of a task mixture (``task.curriculum``): source weights as a function of the optimizer
step and of each source's recent pass rate (``docs/mixtures.md``).

Pure pydantic at the config layer; :mod:`rlvr.config.sections` attaches it to ``TaskConfig`` beside
``task.mixture`` and the trainer's mixture loader (:mod:`rlvr.trainer.mixture`) reads it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    """Unknown keys and NaN/inf refused, like every config section."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class WeightPoint(_Strict):
    """One knot of ``task.curriculum.weights_by_step``: at optimizer step ``step`` the sources' weights
    are ``weights`` (source label → weight ≥ 0; every source of the mixture must be named)."""

    step: int = Field(ge=0)
    weights: dict[str, float]

    @model_validator(mode="after")
    def _check(self) -> "WeightPoint":
        bad = {k: v for k, v in self.weights.items() if v < 0}
        if bad:
            raise ValueError(f"weights must be >= 0, got {bad}")
        if self.weights and not sum(self.weights.values()) > 0:
            raise ValueError("at least one weight must be > 0")
        return self


class SolvedRule(_Strict):
    """Down-weight a source the policy has solved: once its pass rate, averaged over the last ``window``
    generation rounds that drew from it, is ``>= threshold``, its weight is multiplied by ``factor``
    (0 drops it) and its window starts again empty.

    Interpretation of DAPO's dynamic sampling (Yu et al. 2025, §3.2: all-correct groups carry no
    gradient) and of UEC-RL's focus on unsolved prompts, moved from the prompt to the source level.
    """

    window: int = Field(4, ge=1)
    threshold: float = Field(0.9, gt=0, le=1)
    factor: float = Field(0.0, ge=0, lt=1)


class CurriculumConfig(_Strict):
    """``task.curriculum``: how a mixture's source weights change over a run.

    ``weights_by_step``: knots of a piecewise-linear schedule in the optimizer step (linear between
    knots, constant before the first and after the last), replacing the entries' ``weight``;
    ``solved``: the pass-rate rule (:class:`SolvedRule`), a multiplier on top of either.
    """

    weights_by_step: list[WeightPoint] | None = None
    solved: SolvedRule | None = None

    @model_validator(mode="after")
    def _check(self) -> "CurriculumConfig":
        pts = self.weights_by_step
        if pts is not None:
            if not pts:
                raise ValueError("weights_by_step needs at least one {step, weights} point")
            steps = [p.step for p in pts]
            if steps != sorted(set(steps)):
                raise ValueError(f"weights_by_step steps must be strictly increasing, got {steps}")
            names = [sorted(p.weights) for p in pts]
            if any(n != names[0] for n in names):
                raise ValueError(f"every weights_by_step point must name the same sources, got {names}")
        return self


__all__ = ["CurriculumConfig", "SolvedRule", "WeightPoint"]

"""The equal budget of a comparison: what it is (:class:`Budget`), how a draw is counted
(:func:`generated_counts`) and how it is enforced at the sampler (:class:`BudgetMeter`).

Budget (the same for every arm): ``steps`` optimizer updates, ``rollouts`` sampled completions, or
``tokens`` generated completion tokens. Rollouts and tokens are counted at the sampler, so rows that
dynamic sampling (DAPO) or extra exploration (UEC-RL) generate and then drop still count: every arm
pays for all it generates. A draw that would exceed a rollout budget is refused before generation; a
draw that pushes the token count over a token budget is discarded before any update uses it; either
ends the run (:class:`BudgetExhausted`).

Separate from :mod:`rlvr.compare.harness` (which runs the arms) because the fairness rule changes for
its own reasons (what counts as generated: FBOS-RL's second views, IB-TPO's shared prefixes) and is
read by the spec, the report and the sampler tests without running anything.

Source: interpretation of issue 8 (no paper); the fairness rule "count every generated rollout"
follows DAPO §3.2, whose dynamic sampling trades extra generation for full batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

from rlvr.errors import ConfigError, RunStopped
from rlvr.util.text import plural

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
                raise BudgetExhausted(f"stalled: no optimizer update in {plural(self._idle, 'draw')} "
                                      f"({plural(self.rollouts, 'rollout')})")
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
    its whole root-to-leaf path) reports the tokens it actually decoded in ``generated_tokens``,
    which then wins over the sum of the rows' completion masks (that sum would charge each shared
    prefix once per leaf, and an equal-token budget would then be unfair to the tree)."""
    rows = batch.generated_rows(view_only_kinds)
    decoded = getattr(batch, "generated_tokens", None)
    toks = int(decoded) if decoded is not None else int(batch.model_mask[rows].sum())
    return len(rows), toks

"""Rewards: the verifier's scorer, its worker pool, and the learned rewards combined with it.

Modules (``docs/rewards.md``):

* :mod:`rlvr.rewards.scorer`: :class:`Scorer`, a task's verifier over a batch, robust to failing reward
  functions (the single-reward path every run takes when ``rewards:`` is not set);
* :mod:`rlvr.rewards.pool`: :class:`VerifierPool`, the worker processes that cut off hung verifiers
  (imports no torch: its workers start fast);
* :mod:`rlvr.rewards.reward_model`: ``type: reward_model``, a sequence-classification model's score;
* :mod:`rlvr.rewards.judge` and :mod:`rlvr.rewards.judge_clients`: ``type: judge``, an LLM asked with a
  rubric (an OpenAI-compatible server or an in-process Hugging Face model);
* :mod:`rlvr.rewards.combine`: :class:`CombinedScorer`, the weighted sum of the ``rewards:`` entries,
  with their normalisation and metrics (:func:`build_scorer` picks it or the plain :class:`Scorer`).

The names below are loaded on first use (PEP 562), so that ``import rlvr.rewards.pool`` in a reward
worker does not import torch through this package.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "REWARD_DTYPE": "scorer", "RewardError": "scorer", "ScoreStats": "scorer", "Scorer": "scorer",
    "VerifierPool": "pool", "checked_score": "pool",
    "CombinedScorer": "combine", "build_scorer": "combine", "check_rewards": "combine",
    "RewardModelReward": "reward_model", "JudgeReward": "judge",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """``rlvr.rewards.<name>`` for the names of :data:`__all__`, imported from their module on first use.

    Raises:
        AttributeError: ``name`` is not one of them.
    """
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rlvr.rewards' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rlvr.rewards.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

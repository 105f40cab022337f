"""IB-TPO's advantages and checks (``docs/ib_tpo.md`` §2.2–2.6): the ``ib_tree`` batch-level advantage
estimator, the ``ib_logp_mismatch`` batch filter and the config check of the combination.

- ``ADV_ESTIMATORS["ib_tree"]``: :func:`ib_tree_advantages`, the step advantages of spec §2.6
  from the tree index and the batch's (shaped) rewards — so overlong shaping and ``kl_in_reward``
  reach the tree advantages; the math (values, IB statistics, advantages) is :mod:`rlvr.core.tree`.
- ``BATCH_FILTERS["ib_logp_mismatch"]``: logs ``ib/old_logp_mismatch`` (mean |trainer-recomputed −
  sampler| log-prob per token, spec §4) when the trainer computed ``old_logp``; passes rows through.
- ``CONFIG_CHECKS["ib_tpo"]``: ``sampler: tree`` and ``adv_estimator: ib_tree`` only together.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rlvr.core import tree as T
from rlvr.errors import ConfigError
from rlvr.parts import ADV_ESTIMATORS, BATCH_FILTERS, CONFIG_CHECKS, AdvantageContext
from rlvr.types import RolloutBatch
from rlvr.variants.ib_tpo.config import IBTPOConfig
from rlvr.variants.ib_tpo.tree_struct import TreeIndex


def _mean(x: list[float]) -> float:
    return sum(x) / len(x) if x else math.nan


@ADV_ESTIMATORS.register("ib_tree", config=IBTPOConfig, section="ib_tpo")
def ib_tree_advantages(batch: RolloutBatch, ctx: AdvantageContext) -> tuple[torch.Tensor, dict[str, float]]:
    """Tree step advantages ``[N, T]`` (each token carries its step's ``A(s)``) from ``tree_index``
    and ``batch.rewards`` (leaf rows; interior nodes get their values from the leaves below them).

    Returns the advantages and fills each index entry's ``values/H/I/IB/A``, with the reward-
    dependent ``ib/*`` metrics of spec §4 (``score_mean``, ``H_mean``, ``I_mean``, ``eff_rate_prompt``,
    ``eff_rate_node``, ``adv_global_abs``, ``adv_local_abs``, ``adv_reg_abs``, ``gate_frac``).

    Raises:
        ValueError: the batch has no tree index covering its rows (use ``sampler: tree``).

    Source: docs/ib_tpo.md §2.2–2.6 (values, IB statistics, step advantages), §4 (metrics).
    """
    ib = ctx.config
    entries = batch.tree_index
    if not entries or sum(len(e["rows"]) for e in entries) != len(batch):
        raise ValueError("adv_estimator=ib_tree needs the tree index of sampler: tree covering every row "
                         "(tree_index is missing or stale)")
    A = torch.zeros_like(batch.completion_mask)
    acc: dict[str, list[float]] = {k: [] for k in ("H", "I", "IB", "glob", "loc", "reg", "gate")}
    eff = [0, 0]
    leaf_rewards = []
    index = []
    for e in entries:
        idx = TreeIndex(**e)
        parent = idx.parent
        r = torch.zeros(len(parent), dtype=torch.float64)
        for row, path in zip(idx.rows, idx.paths):
            r[path[-1]] = float(batch.rewards[row])
        V = T.node_values(parent, r, value_est=ib.value_est)
        h = torch.tensor(idx.surprisal, dtype=torch.float64)
        stats = T.ib_statistics(parent, V, h, beta=ib.ib_beta, ib_form=ib.ib_form)
        adv = T.tree_advantages(
            parent, V, h, stats, r, ib_lambda=ib.ib_lambda, ib_beta=ib.ib_beta, ib_form=ib.ib_form,
            ib_local=ib.ib_local, ib_gate=ib.ib_gate, adv_scale=ib.adv_scale,
        )
        for row, path in zip(idx.rows, idx.paths):
            vals = [float(adv.A[s]) for s in path for _ in range(idx.span_lengths[s])]
            A[row, : len(vals)] = torch.tensor(vals)
        leaf_rewards.append(torch.tensor([float(batch.rewards[row]) for row in idx.rows]))
        branch = stats.K >= 2
        acc["H"] += stats.H[branch].tolist()
        acc["I"] += stats.I[branch].tolist()
        acc["IB"] += stats.IB[branch].tolist()
        nonroot = torch.arange(len(parent)) > 0
        acc["glob"] += adv.A_GL[nonroot].abs().tolist()
        acc["loc"] += adv.A_loc[nonroot].abs().tolist()
        acc["reg"] += adv.A_reg[nonroot].abs().tolist()
        par = torch.tensor([max(p, 0) for p in parent])
        acc["gate"] += adv.gate[nonroot & (stats.K[par] >= 2)].float().tolist()
        ne, nb = T.eff_rate_node(parent, V)
        eff[0] += ne
        eff[1] += nb
        idx.values, idx.H, idx.I, idx.IB, idx.A = V.tolist(), stats.H.tolist(), stats.I.tolist(), stats.IB.tolist(), adv.A.tolist()
        index.append({**e, "values": idx.values, "H": idx.H, "I": idx.I, "IB": idx.IB, "A": idx.A})
    batch.tree_index = index
    return A, {
        "ib/score_mean": _mean(acc["IB"]), "ib/H_mean": _mean(acc["H"]), "ib/I_mean": _mean(acc["I"]),
        "ib/eff_rate_prompt": T.eff_rate_prompt(leaf_rewards), "ib/eff_rate_node": eff[0] / eff[1] if eff[1] else math.nan,
        "ib/adv_global_abs": _mean(acc["glob"]), "ib/adv_local_abs": _mean(acc["loc"]),
        "ib/adv_reg_abs": _mean(acc["reg"]), "ib/gate_frac": _mean(acc["gate"]),
    }


ib_tree_advantages.per_token = True  # type: ignore[attr-defined]  # [N, T] advantages (for other checks)


@BATCH_FILTERS.register("ib_logp_mismatch")
def logp_mismatch_filter(cfg: Any):
    """``BATCH_FILTERS["ib_logp_mismatch"]`` factory: records ``ib/old_logp_mismatch`` in
    ``batch.metrics`` (mean over completion tokens of ``|old_logp − sampler_logp|``, nats)
    when both are present; never drops rows."""

    def apply(batch: RolloutBatch) -> RolloutBatch:
        if batch.old_logp is not None and batch.sampler_logp is not None and len(batch):
            m = batch.completion_mask
            diff = ((batch.old_logp - batch.sampler_logp).abs() * m).sum() / m.sum().clamp_min(1)
            batch.metrics["ib/old_logp_mismatch"] = float(diff)
        return batch

    return apply


@CONFIG_CHECKS.register("ib_tpo")
def check_ib_tpo(cfg: Any) -> None:
    """``sampler: tree`` and ``adv_estimator: ib_tree`` go together (the tree's rows are paths sharing
    prefixes, which group advantages would count several times; the tree estimator needs the tree).

    Raises:
        ConfigError: one is set without the other.
    """
    if (cfg.sampler == "tree") != (cfg.adv_estimator == "ib_tree"):
        raise ConfigError(
            f"sampler={cfg.sampler!r} with adv_estimator={cfg.adv_estimator!r}: the tree sampler and the "
            "ib_tree estimator only work together (set sampler: tree and adv_estimator: ib_tree)"
        )

"""Tree values, IB-Score estimators, tree advantages, prefix weights and Eff-Rate (IB-TPO).

Pure functions on a tree given as a **parent array**: ``parent[u]`` is the parent of node ``u``,
``parent[0] == -1`` is the root (the prompt ``q``), and every parent precedes its children
(``parent[u] < u``). ``U`` is the number of nodes. A node with no children is a leaf. Per-node
quantities are ``[U]`` float64 tensors; entries that do not apply to a node (e.g. ``Ĥ`` of a
leaf) are 0.

Source: ``docs/ib_tpo.md`` §2.3 (estimators), §2.6 (advantages), §2.7 (prefix weights), §2.9
(Eff-Rate); IB-TPO (Jiang et al., arXiv 2605.28109, ICML 2026) gives the structure, the formulas
are the spec's interpretations, each behind a named switch (``ib_tpo.*``). Units: nats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = [
    "IBStats",
    "TreeAdvantages",
    "IB_FORMS",
    "bernoulli_kl",
    "eff_rate_node",
    "eff_rate_prompt",
    "ib_statistics",
    "leaf_counts",
    "path_branch_counts",
    "path_node_weights",
    "root_to_leaf_paths",
    "step_surprisal",
    "tree_advantages",
    "tree_children",
    "node_values",
]

IB_FORMS = ("h_plus_beta_i", "i_minus_beta_h", "i_over_h")
VALUE_ESTIMATORS = ("recursive", "leaf_mean")
PREFIX_WEIGHTS = ("sqrt", "inv", "dedup")
_F64 = torch.float64


def tree_children(parent: Sequence[int]) -> list[list[int]]:
    """Children lists ``C(u)`` (in node order) of a parent array of ``U`` nodes.

    Raises:
        ValueError: empty tree, ``parent[0] != -1``, or a parent that does not precede its child.
    """
    parent = [int(p) for p in parent]
    if not parent or parent[0] != -1:
        raise ValueError("tree: parent[0] must be -1 (node 0 is the root)")
    kids: list[list[int]] = [[] for _ in parent]
    for u in range(1, len(parent)):
        p = parent[u]
        if not 0 <= p < u:
            raise ValueError(f"tree: parent[{u}]={p} must satisfy 0 <= parent[u] < u (parents precede children)")
        kids[p].append(u)
    return kids


def _all_equal(x: torch.Tensor) -> bool:
    return bool(x.numel() == 0 or (x.max() == x.min()))


def node_values(
    parent: Sequence[int], leaf_rewards: torch.Tensor, *, value_est: str = "recursive"
) -> torch.Tensor:
    """Node values ``V [U]`` float64 (≈ p(correct | path(u))).

    ``recursive`` (default): ``V(leaf) = r``, ``V(u) = (1/K(u)) Σ_c V(c)`` — each sampled child is one
    draw from π, so the estimate stays unbiased when some subtrees get extra branches (spec §2.3).
    ``leaf_mean``: the plain mean of the rewards of all leaves below ``u`` (TreeRL's default; biased
    toward heavily expanded subtrees). A node whose children's values are all equal gets exactly that
    value (no rounding), so a tree whose leaves share one reward has exactly that value everywhere.

    Args:
        parent: ``[U]`` parent array (see module docstring).
        leaf_rewards: ``[U]`` float, read at leaves only (any value elsewhere, e.g. NaN).
        value_est: ``recursive`` or ``leaf_mean`` (``ib_tpo.value_est``).

    Raises:
        ValueError: bad tree, wrong shape, unknown ``value_est`` or a non-finite leaf reward.
    """
    kids = tree_children(parent)
    r = torch.as_tensor(leaf_rewards, dtype=_F64).flatten()
    if r.numel() != len(kids):
        raise ValueError(f"node_values: leaf_rewards has {r.numel()} entries for {len(kids)} nodes")
    if value_est not in VALUE_ESTIMATORS:
        raise ValueError(f"node_values: value_est must be one of {VALUE_ESTIMATORS}, got {value_est!r}")
    U = len(kids)
    V = torch.zeros(U, dtype=_F64)
    lsum = torch.zeros(U, dtype=_F64)
    lcnt = torch.zeros(U, dtype=_F64)
    lmin = torch.full((U,), math.inf, dtype=_F64)
    lmax = torch.full((U,), -math.inf, dtype=_F64)
    for u in range(U - 1, -1, -1):  # children have larger indices: reverse order is post-order
        if not kids[u]:
            if not math.isfinite(float(r[u])):
                raise ValueError(f"node_values: leaf {u} has a non-finite reward {float(r[u])}")
            V[u] = r[u]
            lsum[u], lcnt[u], lmin[u], lmax[u] = r[u], 1.0, r[u], r[u]
            continue
        c = torch.tensor(kids[u])
        lsum[u], lcnt[u] = lsum[c].sum(), lcnt[c].sum()
        lmin[u], lmax[u] = lmin[c].min(), lmax[c].max()
        if value_est == "recursive":
            vc = V[c]
            V[u] = vc[0] if _all_equal(vc) else vc.mean()
        else:
            V[u] = lmin[u] if lmin[u] == lmax[u] else lsum[u] / lcnt[u]
    return V


def leaf_counts(parent: Sequence[int]) -> torch.Tensor:
    """``n(u) [U]`` long: number of leaves at or below ``u`` (a leaf counts itself).

    Raises:
        ValueError: bad tree.
    """
    kids = tree_children(parent)
    n = torch.zeros(len(kids), dtype=torch.long)
    for u in range(len(kids) - 1, -1, -1):
        n[u] = 1 if not kids[u] else sum(int(n[c]) for c in kids[u])
    return n


def root_to_leaf_paths(parent: Sequence[int]) -> list[list[int]]:
    """One node list per leaf (leaves in node order), root excluded: ``[u_1, ..., leaf]``.

    Raises:
        ValueError: bad tree.
    """
    kids = tree_children(parent)
    out = []
    for u in range(1, len(kids)):
        if not kids[u]:
            path = []
            v = u
            while v > 0:
                path.append(v)
                v = int(parent[v])
            out.append(path[::-1])
    return out


def step_surprisal(
    logps: Sequence[torch.Tensor | Sequence[float]], *, mode: str = "mean_surprisal", head_tokens: int = 16
) -> torch.Tensor:
    """Per-step surprisal ``ĥ [U]`` float64 from the sampler's behaviour log-probs of each step.

    ``mean_surprisal``: ``ĥ(c) = −(1/|c|) Σ_{t∈c} log π_old(y_t | prefix)`` (nats per token); its mean
    over sampled siblings is an unbiased estimate of the per-token step-entropy rate (spec §2.3).
    ``head_surprisal``: ``−Σ`` over the first ``head_tokens`` tokens of the step (nats, a sum as the
    spec states). A node with no tokens (the root) gets 0.

    Args:
        logps: ``U`` sequences of log-probs ``[L_u]`` (natural log, ≤ 0).
        mode: ``mean_surprisal`` or ``head_surprisal`` (``ib_tpo.step_entropy``).
        head_tokens: tokens summed in ``head_surprisal`` mode (``ib_tpo.head_tokens``, ≥ 1).

    Raises:
        ValueError: unknown mode or ``head_tokens < 1``.
    """
    if mode not in ("mean_surprisal", "head_surprisal"):
        raise ValueError(f"step_surprisal: mode must be mean_surprisal or head_surprisal, got {mode!r}")
    if head_tokens < 1:
        raise ValueError(f"step_surprisal: head_tokens must be >= 1, got {head_tokens}")
    out = torch.zeros(len(logps), dtype=_F64)
    for u, lp in enumerate(logps):
        x = torch.as_tensor(lp, dtype=_F64).flatten()
        if x.numel():
            out[u] = -x.mean() if mode == "mean_surprisal" else -x[:head_tokens].sum()
    return out


def bernoulli_kl(p: torch.Tensor, q: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """``KL(Bern(p) ‖ Bern(q))`` elementwise, in nats, with ``p, q`` clamped to ``[eps, 1 − eps]``.

    Shapes broadcast; float64. Exactly 0 where ``p == q``.

    Source: spec §2.3 (κ, the clamp 1e-6).
    """
    p = torch.as_tensor(p, dtype=_F64).clamp(eps, 1 - eps)
    q = torch.as_tensor(q, dtype=_F64).clamp(eps, 1 - eps)
    kl = p * torch.log(p / q) + (1 - p) * torch.log((1 - p) / (1 - q))
    return torch.where(p == q, torch.zeros_like(kl), kl.clamp_min(0.0))


@dataclass
class IBStats:
    """Monte Carlo IB quantities of every node (spec §2.3), all ``[U]`` float64 except ``K``.

    Attributes:
        K: ``[U]`` long, number of children.
        H: ``Ĥ(u)``, mean child surprisal (0 at leaves).
        I: ``Î(u)``, mean ``κ`` of the children (0 when ``K ≤ 1`` or all children values are equal).
        IB: ``IB̂(u)`` in the chosen ``ib_form`` (0 at leaves).
        kappa: ``κ(c) = KL(Bern(V(c)) ‖ Bern(V(parent(c))))`` (0 at the root).
        split: ``[U]`` bool, True where ``K ≥ 2`` and the children's values are not all equal.
    """

    K: torch.Tensor
    H: torch.Tensor
    I: torch.Tensor  # noqa: E741 - the spec's name
    IB: torch.Tensor
    kappa: torch.Tensor
    split: torch.Tensor


def ib_statistics(
    parent: Sequence[int],
    values: torch.Tensor,
    surprisal: torch.Tensor,
    *,
    beta: float = 1.0,
    ib_form: str = "h_plus_beta_i",
    eps: float = 1e-6,
) -> IBStats:
    """IB-Score estimators on a tree (spec §2.2–2.3).

    ``Ĥ(u) = mean_c ĥ(c)``, ``Î(u) = mean_c κ(c)``, and ``IB̂ = Ĥ + β·Î`` (``h_plus_beta_i``, default),
    ``Î − β·Ĥ`` (``i_minus_beta_h``) or ``Î / (Ĥ + eps)`` (``i_over_h``, diagnostics and branching
    only). Children are weighted uniformly. Properties: ``Î = 0`` when ``K ≤ 1`` or all children have
    equal value (set exactly), ``0 ≤ Î ≤ ln 2``, ``Ĥ ≥ 0`` for log-probs ≤ 0.

    Args:
        parent: ``[U]`` parent array.
        values: ``[U]`` node values (:func:`node_values`), in ``[0, 1]``.
        surprisal: ``[U]`` ``ĥ`` per node (:func:`step_surprisal`).
        beta: ``β ≥ 0`` (``ib_tpo.ib_beta``).
        ib_form: one of :data:`IB_FORMS` (``ib_tpo.ib_form``).
        eps: value clamp for κ and the ``i_over_h`` denominator.

    Raises:
        ValueError: bad tree, shape mismatch, unknown ``ib_form`` or ``beta < 0``.
    """
    kids = tree_children(parent)
    U = len(kids)
    V = torch.as_tensor(values, dtype=_F64).flatten()
    h = torch.as_tensor(surprisal, dtype=_F64).flatten()
    if V.numel() != U or h.numel() != U:
        raise ValueError(f"ib_statistics: values has {V.numel()} and surprisal {h.numel()} entries for {U} nodes")
    if ib_form not in IB_FORMS:
        raise ValueError(f"ib_statistics: ib_form must be one of {IB_FORMS}, got {ib_form!r}")
    if beta < 0:
        raise ValueError(f"ib_statistics: beta must be >= 0, got {beta}")
    par = torch.tensor([max(int(p), 0) for p in parent])
    kappa = bernoulli_kl(V, V[par], eps=eps)
    kappa[0] = 0.0
    K = torch.tensor([len(c) for c in kids], dtype=torch.long)
    H = torch.zeros(U, dtype=_F64)
    I = torch.zeros(U, dtype=_F64)  # noqa: E741
    split = torch.zeros(U, dtype=torch.bool)
    for u, c in enumerate(kids):
        if not c:
            continue
        ci = torch.tensor(c)
        H[u] = h[ci].mean()
        if len(c) >= 2 and not _all_equal(V[ci]):
            I[u] = kappa[ci].mean()
            split[u] = True
    if ib_form == "h_plus_beta_i":
        IB = H + beta * I
    elif ib_form == "i_minus_beta_h":
        IB = I - beta * H
    else:
        IB = I / (H + eps)
    IB = torch.where(K > 0, IB, torch.zeros_like(IB))
    return IBStats(K=K, H=H, I=I, IB=IB, kappa=kappa, split=split)


@dataclass
class TreeAdvantages:
    """Per-node step advantages of one tree (spec §2.6), all ``[U]`` float64 (0 at the root).

    Attributes:
        A: the final advantage ``(A_GL + A_IB) / D`` given to every token of the step.
        A_GL: ``V(s) − V(q)``.
        A_loc: ``V(s) − V(p)``.
        A_reg: the IB regulariser term (before ``λ``).
        gate: ``[U]`` bool, True where ``A_reg`` is applied (parent has ``K ≥ 2`` and, with the gate
            on, children that disagree).
        scale: the divisor ``D``.
    """

    A: torch.Tensor
    A_GL: torch.Tensor
    A_loc: torch.Tensor
    A_reg: torch.Tensor
    gate: torch.Tensor
    scale: float


def tree_advantages(
    parent: Sequence[int],
    values: torch.Tensor,
    surprisal: torch.Tensor,
    stats: IBStats,
    leaf_rewards: torch.Tensor,
    *,
    ib_lambda: float = 0.1,
    ib_beta: float = 1.0,
    ib_form: str = "h_plus_beta_i",
    ib_local: str = "full",
    ib_gate: bool = True,
    adv_scale: str = "leaf_std",
) -> TreeAdvantages:
    """Step-level advantages ``A(s) = (A_GL(s) + A_IB(s)) / D`` (spec §2.6).

    ``A_GL = V(s) − V(q)``; ``A_loc = V(s) − V(p)``; ``A_IB = A_loc + λ·A_reg`` with
    ``A_reg = [ĥ(s) − Ĥ(p)] + β[κ(s) − Î(p)]`` (``h_plus_beta_i``) or
    ``[κ(s) − Î(p)] − β[ĥ(s) − Ĥ(p)]`` (``i_minus_beta_h``), set to 0 when ``K(p) = 1`` or (gate on)
    the siblings' values are all equal. ``ib_local = value_only`` drops ``A_reg`` (IB acts only through
    branching). ``D`` = unbiased std of the tree's leaf rewards + 1e-6, or 1 when that std is 0 or
    there is one leaf or ``adv_scale = none``. Each sibling set's ``A_loc`` and ``A_reg`` sum to 0.

    Args:
        parent, values, surprisal, stats: as from :func:`node_values`, :func:`step_surprisal`,
            :func:`ib_statistics` on the same tree.
        leaf_rewards: ``[U]`` rewards, read at leaves.
        ib_lambda: ``λ ≥ 0``; ib_beta: ``β``; ib_form, ib_local, ib_gate, adv_scale: the spec switches.

    Raises:
        ValueError: ``ib_form = i_over_h`` with ``ib_local = full`` (not a differentiable objective),
            unknown switch values, or shape mismatches.
    """
    kids = tree_children(parent)
    U = len(kids)
    if ib_local not in ("full", "value_only"):
        raise ValueError(f"tree_advantages: ib_local must be full or value_only, got {ib_local!r}")
    if adv_scale not in ("leaf_std", "none"):
        raise ValueError(f"tree_advantages: adv_scale must be leaf_std or none, got {adv_scale!r}")
    if ib_form not in IB_FORMS:
        raise ValueError(f"tree_advantages: ib_form must be one of {IB_FORMS}, got {ib_form!r}")
    if ib_form == "i_over_h" and ib_local == "full":
        raise ValueError("tree_advantages: ib_form=i_over_h is only allowed with ib_local=value_only (spec §2.6)")
    V = torch.as_tensor(values, dtype=_F64).flatten()
    h = torch.as_tensor(surprisal, dtype=_F64).flatten()
    r = torch.as_tensor(leaf_rewards, dtype=_F64).flatten()
    if V.numel() != U or h.numel() != U or r.numel() != U:
        raise ValueError("tree_advantages: values, surprisal and leaf_rewards must all have one entry per node")
    par = torch.tensor([max(int(p), 0) for p in parent])
    A_GL = V - V[0]
    A_loc = V - V[par]
    dH = h - stats.H[par]
    dI = stats.kappa - stats.I[par]
    A_reg = dH + ib_beta * dI if ib_form == "h_plus_beta_i" else dI - ib_beta * dH
    gate = stats.K[par] >= 2
    if ib_gate:
        gate = gate & stats.split[par]
    gate[0] = False
    if ib_local == "value_only" or ib_lambda == 0:
        gate = torch.zeros_like(gate)
    A_reg = torch.where(gate, A_reg, torch.zeros_like(A_reg))
    A_GL[0] = A_loc[0] = 0.0
    leaves = torch.tensor([len(c) == 0 for c in kids])
    leaves[0] = False
    lr = r[leaves]
    D = 1.0
    if adv_scale == "leaf_std" and lr.numel() >= 2 and not _all_equal(lr):
        D = float(lr.std(unbiased=True)) + 1e-6
    A = (A_GL + A_loc + ib_lambda * A_reg) / D
    A[0] = 0.0
    return TreeAdvantages(A=A, A_GL=A_GL, A_loc=A_loc, A_reg=A_reg, gate=gate, scale=D)


def path_node_weights(parent: Sequence[int], paths: Sequence[Sequence[int]], mode: str = "sqrt") -> list[list[float]]:
    """Per-path, per-node token weights ``w`` that stop shared prefixes being over-weighted (spec §2.7).

    ``sqrt``: ``w(s) = 1/sqrt(n(s))`` (TreeRL's weighting, [code-precedent]); ``inv``: ``1/n(s)`` (each
    node counted once in total); ``dedup``: weight 1 on the first path (in ``paths`` order) that holds
    the node, 0 on the others (node-level de-duplicated training, interpretation: exact
    de-duplication through the weights; needs a tree's paths in one optimizer batch). ``n(s)`` = leaves
    below ``s``.

    Args:
        parent: ``[U]`` parent array.
        paths: node lists from :func:`root_to_leaf_paths`.
        mode: ``sqrt``, ``inv`` or ``dedup`` (``ib_tpo.prefix_weight``).

    Returns:
        ``paths``-shaped nested lists of floats in ``(0, 1]`` (``dedup``: ``{0, 1}``).

    Raises:
        ValueError: unknown mode or bad tree.
    """
    if mode not in PREFIX_WEIGHTS:
        raise ValueError(f"path_node_weights: mode must be one of {PREFIX_WEIGHTS}, got {mode!r}")
    n = leaf_counts(parent).tolist()
    seen: set[int] = set()
    out = []
    for path in paths:
        row = []
        for s in path:
            if mode == "sqrt":
                row.append(1.0 / math.sqrt(n[s]))
            elif mode == "inv":
                row.append(1.0 / n[s])
            else:
                row.append(0.0 if s in seen else 1.0)
                seen.add(s)
        out.append(row)
    return out


def path_branch_counts(parent: Sequence[int], K: torch.Tensor) -> torch.Tensor:
    """``[U]`` long: number of branch nodes (``K ≥ 2``) on ``path(root → u)``, both ends included.

    Used by the anti-clustering penalty ``score′(u) = IB̂(u) − γ·count(u)`` (spec §2.4; AEPO's idea).
    Interpretation: ``u`` itself counts when it already branched, so re-branching the same node is
    penalised like branching below an earlier fork.

    Raises:
        ValueError: bad tree or ``K`` of the wrong length.
    """
    kids = tree_children(parent)
    K = torch.as_tensor(K).flatten()
    if K.numel() != len(kids):
        raise ValueError(f"path_branch_counts: K has {K.numel()} entries for {len(kids)} nodes")
    out = torch.zeros(len(kids), dtype=torch.long)
    for u in range(len(kids)):
        out[u] = (out[int(parent[u])] if u > 0 else 0) + int(K[u] >= 2)
    return out


def eff_rate_prompt(leaf_rewards_per_tree: Sequence[torch.Tensor]) -> float:
    """Prompt-level Eff-Rate: share of trees whose leaf rewards are not all equal (spec §2.9).

    Comparable with GRPO's ``1 − frac_reward_zero_std``. Returns NaN for no trees.
    """
    if not leaf_rewards_per_tree:
        return math.nan
    eff = [not _all_equal(torch.as_tensor(r, dtype=_F64)) for r in leaf_rewards_per_tree]
    return sum(eff) / len(eff)


def eff_rate_node(parent: Sequence[int], values: torch.Tensor) -> tuple[int, int]:
    """Node-level Eff-Rate counts ``(informative, branch_nodes)``: branch nodes (``K ≥ 2``) and those
    whose children's values are not all equal (spec §2.9). Return counts so trees can be pooled.

    Raises:
        ValueError: bad tree.
    """
    kids = tree_children(parent)
    V = torch.as_tensor(values, dtype=_F64).flatten()
    branch = [c for c in kids if len(c) >= 2]
    informative = sum(not _all_equal(V[torch.tensor(c)]) for c in branch)
    return informative, len(branch)

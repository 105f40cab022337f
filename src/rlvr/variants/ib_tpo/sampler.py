"""IB-TPO tree sampling: IB-guided branching under a token budget and extraction of root-to-leaf paths
into one :class:`~rlvr.types.RolloutBatch`; registers ``SAMPLERS["tree"]``. Step segmentation and the
tree of token-id spans live in :mod:`rlvr.variants.ib_tpo.tree_struct`.

Source: ``docs/ib_tpo.md`` §2.1 (steps, tree), §2.4 (IBTree sampling), §2.5 (budget), §2.7
(extraction and weights); IB-TPO (Jiang et al., arXiv 2605.28109) for the structure ("branch where
the IB-Score is highest"), TreeRL (arXiv 2506.11902) for fork-and-continue. The math (values,
IB-Score, advantages) lives in :mod:`rlvr.core.tree`; this module only builds trees and packs them.

Contracts (spec implementation notes): the tree stores the exact sampled token ids and behaviour
log-probs, text is never re-tokenized; each round is ONE batched ``engine.generate`` call over every
prompt's picks; only newly generated tokens are charged to the budget.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any, Callable, Sequence

import torch

from rlvr.core import tree as T
from rlvr.parts import SAMPLERS, SamplerContext
from rlvr.samplers.group import generations_to_batch
from rlvr.types import Generation, GenerationRequest, RolloutBatch, SamplingParams
from rlvr.variants.ib_tpo.config import IBTPOConfig
from rlvr.variants.ib_tpo.tree_struct import PromptTree, TokenTexts, TreeIndex, segment_steps

__all__ = ["IBTreeSampler", "build_tree_sampler"]


# --------------------------------------------------------------------------------------------------
# the sampler


class IBTreeSampler:
    """IBTree sampling (spec §2.4) and prefix weights (§2.7); the tree advantages (§2.6) are the
    batch-level estimator ``ib_tree`` (:func:`rlvr.variants.ib_tpo.estimator.ib_tree_advantages`).

    Per prompt: ``M`` initial chains, then up to ``max_rounds − 1`` rounds that fork ``T``
    continuations at the ``N`` candidate nodes with the highest ``score′(u) = IB̂(u) −
    γ·#branch nodes on path(u)``, until the tree's decode-token budget is spent or it has
    ``L_target`` leaves. Every round is one batched generate call over all prompts. The returned
    batch is scored (rewards set) and carries per-token ``token_weights`` and the tree index.

    Args:
        engine: generation backend that continues arbitrary contexts (``rlvr.engines``).
        encoder: prompt → token ids (:class:`rlvr.samplers.group.PromptEncoder`).
        scorer: :class:`rlvr.rewards.Scorer`; each round's new leaves are scored in one ``score`` call.
        tokenizer: decodes leaves and single tokens (for paragraph steps).
        pad_token_id: right-padding id.
        ib: the ``ib_tpo`` section (:class:`rlvr.variants.ib_tpo.config.IBTPOConfig`).
        max_completion_length: cap on a root-to-leaf path in generated tokens.
        score_fn: optional override ``(tree, u, stats) -> float | None`` of the branch score (None
            excludes the node); for ablations and tests (e.g. forcing fork positions).
        token_budget: optional fixed decode-token budget per tree (e.g. a flat group's measured cost).
        seed: seed of the sampler's private RNG (``branch_score=random``, ``tie_break=random``).
    """

    def __init__(
        self,
        engine: Any,
        encoder: Any,
        scorer: Any,
        tokenizer: Any,
        pad_token_id: int,
        ib: Any,
        max_completion_length: int,
        *,
        score_fn: Callable[[PromptTree, int, T.IBStats], float | None] | None = None,
        token_budget: int | None = None,
        seed: int = 0,
    ) -> None:
        self.engine = engine
        self.encoder = encoder
        self.scorer = scorer
        self.tokenizer = tokenizer
        self.pad_token_id = pad_token_id
        self.ib = ib
        self.max_completion_length = int(max_completion_length)
        self.score_fn = score_fn
        self.token_budget = token_budget
        self.rng = random.Random(seed)
        self.mean_length: float | None = None  # L̄: mean path length of the previous call
        self.texts = TokenTexts(tokenizer)
        self.last_trees: list[PromptTree] = []
        self.score_errors = 0

    # ------------------------------------------------------------------------------ sizes
    def sizes(self, G: int) -> tuple[int, int, int]:
        """``(M, N, L_target)`` for a baseline group size ``G`` (spec §2.4 defaults)."""
        ib = self.ib
        M = ib.num_initial_chains or max(1, int(round(G * ib.initial_chain_frac)))
        N = ib.branches_per_round or max(1, G // 4)
        return M, N, max(M, int(math.ceil(ib.leaf_target_factor * G - 1e-9)))

    def budget(self, G: int, max_new_tokens: int) -> int:
        """Decode-token budget ``B_tok`` of one tree: ``G·L̄`` (``token_budget=mean_length`` once L̄ is
        known), else ``G·max_new_tokens·0.5``; a fixed ``token_budget`` argument wins."""
        if self.token_budget is not None:
            return int(self.token_budget)
        if self.ib.token_budget == "mean_length" and self.mean_length:
            return int(round(G * self.mean_length))
        return int(round(G * max_new_tokens * 0.5))

    def _segment(self, ids: Sequence[int]) -> list[int]:
        ib = self.ib
        return segment_steps(
            ids, self.texts, split=ib.step_split, delimiter=ib.step_delimiter, min_tokens=ib.step_min_tokens,
            max_tokens=ib.step_max_tokens, fixed_tokens=ib.fixed_step_tokens,
        )

    # ------------------------------------------------------------------------------ tree math
    def tree_stats(self, tree: PromptTree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, T.IBStats]:
        """``(leaf_rewards [U], values [U], surprisal [U], IBStats)`` of the tree as it stands."""
        ib = self.ib
        parent = tree.parent_array()
        r = torch.tensor([n.reward for n in tree.nodes], dtype=torch.float64)
        V = T.node_values(parent, r, value_est=ib.value_est)
        h = T.step_surprisal([n.logps for n in tree.nodes], mode=ib.step_entropy, head_tokens=ib.head_tokens)
        stats = T.ib_statistics(parent, V, h, beta=ib.ib_beta, ib_form=ib.ib_form)
        return r, V, h, stats

    def _remaining(self, tree: PromptTree) -> tuple[list[float], list[float]]:
        """Per node: (max, mean) tokens from the end of the node to the leaves below it."""
        U = len(tree.nodes)
        below: list[list[int]] = [[] for _ in range(U)]  # leaf path lengths under each node
        for leaf in tree.leaves:
            L = tree.nodes[leaf].end
            u = leaf
            while u >= 0:
                below[u].append(L)
                u = tree.nodes[u].parent
        mx, mean = [], []
        for u in range(U):
            rem = [L - tree.nodes[u].end for L in below[u]]
            mx.append(float(max(rem)) if rem else 0.0)
            mean.append(sum(rem) / len(rem) if rem else 0.0)
        return mx, mean

    def _picks(self, tree: PromptTree, N: int, cont: int, budget_left: int, leaves_left: int) -> list[tuple[int, int]]:
        """Branch nodes for this round with their projected cost: top-N by ``score′``, dropping picks
        whose projected cost exceeds the budget left (accumulated over the accepted picks)."""
        ib = self.ib
        _, _, _, stats = self.tree_stats(tree)
        mx, mean = self._remaining(tree)
        pbc = T.path_branch_counts(tree.parent_array(), stats.K)
        cands = []
        for u, node in enumerate(tree.nodes):
            if u == 0:
                if not ib.allow_root_branch:
                    continue  # the root is exempt from max_children: a root branch is a fresh chain
            elif not node.children or int(stats.K[u]) >= ib.max_children:
                continue
            if mx[u] < ib.min_remaining_tokens:
                continue
            if self.score_fn is not None:
                s = self.score_fn(tree, u, stats)
                if s is None or not math.isfinite(s):
                    continue
            elif ib.branch_score == "random":
                s = self.rng.random()
            else:
                base = stats.IB[u] if ib.branch_score == "ib" else stats.H[u]
                s = float(base) - ib.path_branch_penalty * int(pbc[u])
            tie = {"deeper": -node.depth, "shallower": node.depth}.get(ib.tie_break)
            cands.append((-s, tie if tie is not None else self.rng.random(), u))
        cands.sort()
        picks, left = [], budget_left
        max_picks = min(N, -(-leaves_left // cont))
        for _, _, u in cands[:max_picks]:
            cost = int(math.ceil(mx[u] if ib.projected_cost == "max_remaining" else mean[u])) * cont
            if cost <= left:
                picks.append((u, cost))
                left -= cost
        return picks

    # ------------------------------------------------------------------------------ sampling
    def _verify_leaves(self, items: list[tuple[PromptTree, int]], problems: Sequence[Any]) -> None:
        """Score new leaves with ONE ``scorer.score`` call on a batch of their whole paths (so the
        scorer's worker pool and timeouts apply); a truncated leaf gets reward 0 (spec §2.1)."""
        if not items:
            return
        gens = [
            Generation(token_ids=tree.path_tokens(leaf), logprobs=[0.0] * tree.nodes[leaf].end,
                       finish_reason=tree.nodes[leaf].finish or "eos")  # type: ignore[arg-type]
            for tree, leaf in items
        ]
        mini = generations_to_batch(
            [tree.prompt_ids for tree, _ in items], gens, group_ids=[0] * len(items),
            prompt_index=[tree.prompt_index for tree, _ in items], problems=list(problems),
            pad_token_id=self.pad_token_id, temperature=1.0, policy_version=0,
        )
        st = self.scorer.score(mini)
        self.score_errors += int(getattr(st, "errors", 0)) + int(getattr(st, "timeouts", 0))
        for j, (tree, leaf) in enumerate(items):
            node = tree.nodes[leaf]
            truncated = node.finish == "length"
            node.reward = 0.0 if truncated else float(mini.rewards[j])
            node.correct = bool(mini.correct[j]) and not truncated if mini.correct is not None else False
            node.text = mini.texts[j] if mini.texts else None
            node.feedback = mini.feedback[j] if mini.feedback else None

    def _generate(
        self, jobs: list[tuple[PromptTree, int, int]], params: SamplingParams, round_: int
    ) -> list[list[Generation]]:
        """One batched generate call for ``(tree, node, n)`` jobs; each request carries its path's
        remaining cap (``GenerationRequest.max_new_tokens``), and a continuation an engine returns past
        that cap is cut to it (counted in ``tokens_discarded``)."""
        requests, caps = [], []
        for tree, u, n in jobs:
            cap = max(1, self.max_completion_length - tree.nodes[u].end)
            requests.append(GenerationRequest(context_ids=tree.prompt_ids + tree.path_tokens(u), n=n, max_new_tokens=cap))
            caps.append(cap)
        seed = None if params.seed is None else (int(params.seed) + 104_729 * round_) % 2**31
        p = dataclasses.replace(params, max_new_tokens=max(caps), seed=seed)
        outs = self.engine.generate(requests, p)
        res = []
        for (tree, u, n), cap, gens, req in zip(jobs, caps, outs, requests):
            fixed = []
            for g in gens:
                if len(g.token_ids) > cap:
                    tree.tokens_discarded += len(g.token_ids) - cap
                    g = Generation(token_ids=list(g.token_ids[:cap]), logprobs=list(g.logprobs[:cap]), finish_reason="length")
                elif len(g.token_ids) == cap and g.finish_reason != "eos":
                    g = Generation(token_ids=list(g.token_ids), logprobs=list(g.logprobs), finish_reason="length")
                fixed.append(g)
            tree.tokens_prefill += len(req.context_ids)
            res.append(fixed)
        return res

    def grow(self, problems: Sequence[Any], num_generations: int, params: SamplingParams) -> list[PromptTree]:
        """Build one tree per problem (spec §2.4) and return them, leaves verified.

        Raises:
            RuntimeError: the engine returned an empty continuation.
        """
        ib = self.ib
        G = num_generations
        M, N, L_target = self.sizes(G)
        cont = ib.continuations_per_branch
        cap = self.max_completion_length
        B = self.budget(G, min(params.max_new_tokens, cap))
        self.score_errors = 0
        trees = [PromptTree(i, self.encoder(p)) for i, p in enumerate(problems)]

        def charge(tree: PromptTree) -> int:
            return tree.tokens_decode + (tree.tokens_prefill if ib.budget_counts == "decode_plus_prefill" else 0)

        def add(tree: PromptTree, u: int, gens: list[Generation], round_: int, new: list) -> None:
            for g in gens:
                if not g.token_ids:
                    raise RuntimeError("IBTreeSampler: the engine returned an empty continuation")
                tree.tokens_decode += len(g.token_ids)
                leaf = tree.attach(u, g, self._segment(g.token_ids), round_)
                if round_ > 1:
                    tree.branches += 1
                    tree.fork_fracs.append(tree.nodes[u].end / max(tree.nodes[leaf].end, 1))
                new.append((tree, leaf))

        outs = self._generate([(t, 0, M) for t in trees], params, 1)
        new: list[tuple[PromptTree, int]] = []
        for tree, gens in zip(trees, outs):
            add(tree, 0, gens, 1, new)
            tree.rounds = 1
        self._verify_leaves(new, problems)
        for round_ in range(2, ib.max_rounds + 1):
            jobs = []
            for tree in trees:
                if tree.done:
                    continue
                left = B - charge(tree)
                if left <= 0 or len(tree.leaves) >= L_target:
                    tree.done = True
                    continue
                picks = self._picks(tree, N, cont, left, L_target - len(tree.leaves))
                if not picks:
                    tree.done = True
                    continue
                jobs += [(tree, u, cont) for u, _ in picks]
            if not jobs:
                break
            outs = self._generate(jobs, params, round_)
            new = []
            for (tree, u, _), gens in zip(jobs, outs):
                add(tree, u, gens, round_, new)
                tree.rounds = round_
            self._verify_leaves(new, problems)
        lengths = [t.nodes[leaf].end for t in trees for leaf in t.leaves]
        if lengths:
            self.mean_length = sum(lengths) / len(lengths)
        self.last_trees = trees
        return trees

    def sample(
        self,
        problems: Sequence[Any],
        num_generations: int,
        params: SamplingParams,
        *,
        policy_version: int = 0,
        first_group_id: int = 0,
    ) -> RolloutBatch:
        """Grow one tree per problem and extract every root-to-leaf path as a row (spec §2.7).

        Returns a scored batch: ``context_ids`` = prompt ids, ``completion_ids`` = the whole path,
        ``sampler_logp`` = the concatenated behaviour log-probs, ``token_weights`` ``[N, T]`` (prefix
        weighting), ``group_id`` = ``first_group_id + tree``; ``tree_index`` holds a
        :class:`TreeIndex` per tree (as a dict) and ``metrics`` the sampling ``ib/*`` scalars.
        """
        trees = self.grow(problems, num_generations, params)
        return self.extract(trees, problems, params, policy_version=policy_version, first_group_id=first_group_id)

    def extract(
        self,
        trees: Sequence[PromptTree],
        problems: Sequence[Any],
        params: SamplingParams,
        *,
        policy_version: int = 0,
        first_group_id: int = 0,
    ) -> RolloutBatch:
        """Pack grown trees into one scored :class:`RolloutBatch`: a row per root-to-leaf path (built by
        :func:`rlvr.samplers.group.generations_to_batch`), prefix ``token_weights`` (reward-free) and a
        :class:`TreeIndex` per tree in ``tree_index`` (as plain dicts). The advantages are not set
        here: ``rlvr.parts.ADV_ESTIMATORS["ib_tree"]`` computes them from the index and the (shaped) rewards."""
        ib = self.ib
        gens, ctx, gids, pidx, weights, leaves, index = [], [], [], [], [], [], []
        for tree in trees:
            parent = tree.parent_array()
            paths = [tree.path_nodes(leaf) for leaf in tree.leaves]
            gid = first_group_id + tree.prompt_index
            index.append(TreeIndex(
                group_id=gid, parent=parent, span_lengths=[len(n.tokens) for n in tree.nodes],
                starts=[n.start for n in tree.nodes], paths=paths, rows=list(range(len(gens), len(gens) + len(paths))),
                surprisal=T.step_surprisal([n.logps for n in tree.nodes], mode=ib.step_entropy,
                                           head_tokens=ib.head_tokens).tolist(),
            ))
            for leaf, path, w in zip(tree.leaves, paths, T.path_node_weights(parent, paths, ib.prefix_weight)):
                node = tree.nodes[leaf]
                gens.append(Generation(tree.path_tokens(leaf), tree.path_logps(leaf), node.finish))
                weights.append([ws for ws, s in zip(w, path) for _ in range(len(tree.nodes[s].tokens))])
                ctx.append(list(tree.prompt_ids))
                gids.append(gid)
                pidx.append(tree.prompt_index)
                leaves.append(node)
        batch = generations_to_batch(
            ctx, gens, group_ids=gids, prompt_index=pidx, problems=list(problems), pad_token_id=self.pad_token_id,
            temperature=params.temperature, policy_version=policy_version,
        )
        W = torch.zeros_like(batch.completion_mask)
        for i, w in enumerate(weights):
            W[i, : len(w)] = torch.tensor(w)
        batch.token_weights = W
        batch.rewards = torch.tensor([n.reward for n in leaves], dtype=torch.float32)
        batch.correct = torch.tensor([n.correct for n in leaves], dtype=torch.bool)
        batch.texts = [n.text or "" for n in leaves]
        batch.feedback = [n.feedback for n in leaves]
        batch.reward_components[getattr(getattr(self.scorer, "task", None), "name", "task")] = batch.rewards.clone()
        batch.variable_group_sizes = True
        batch.tree_index = [dataclasses.asdict(i) for i in index]
        batch.metrics = self._metrics(trees)
        # decoded tokens, counted once: a leaf row repeats its shared prefix, so summing the rows'
        # completion masks would charge every branch point again (read by rlvr.compare's budget meter)
        batch.generated_tokens = int(sum(t.tokens_decode + t.tokens_discarded for t in trees))
        return batch

    def _metrics(self, trees: Sequence[PromptTree]) -> dict[str, float]:
        """The sampling metrics (``ib/*`` of spec §4 that do not depend on rewards; the estimator adds the rest)."""
        def mean(x: list[float]) -> float:
            return sum(x) / len(x) if x else math.nan

        nt = max(len(trees), 1)
        leaves = sum(len(t.leaves) for t in trees)
        decode = sum(t.tokens_decode for t in trees)
        lengths = [t.nodes[l].end for t in trees for l in t.leaves]
        Lbar = mean([float(x) for x in lengths])
        return {
            "ib/leaves_per_tree": leaves / nt, "ib/branches_per_tree": sum(t.branches for t in trees) / nt,
            "ib/rounds_used": mean([float(t.rounds) for t in trees]),
            "ib/leaves_per_budget": leaves * Lbar / decode if decode else math.nan,
            "ib/tokens_decode": float(decode), "ib/tokens_prefill": float(sum(t.tokens_prefill for t in trees)),
            "ib/tokens_discarded": float(sum(t.tokens_discarded for t in trees)),
            "ib/branch_depth_frac": mean([f for t in trees for f in t.fork_fracs]),
            "ib/verifier_errors": float(getattr(self, "score_errors", 0)),
        }


@SAMPLERS.register("tree", config=IBTPOConfig, section="ib_tpo")
def build_tree_sampler(ctx: SamplerContext) -> IBTreeSampler:
    """``SAMPLERS["tree"]`` factory: an :class:`IBTreeSampler` configured by ``ctx.cfg.ib_tpo``."""
    cfg = ctx.cfg
    return IBTreeSampler(
        ctx.engine, ctx.encoder, ctx.scorer, ctx.tokenizer, ctx.pad_token_id, cfg.ib_tpo,
        cfg.max_completion_length, seed=cfg.seed,
    )

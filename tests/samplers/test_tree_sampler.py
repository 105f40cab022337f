"""IB-TPO tree sampler (rlvr.variants.ib_tpo.sampler): step segmentation, budget efficiency with a synthetic
equal-cost engine (docs/ib_tpo.md §7.1), extraction invariants, sampler vs trainer log-probs on the
tiny model, no update from constant-reward trees, and the loss gradient with tree advantages."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from rlvr.testing import small_config
from rlvr.core import tree as T
from rlvr.tasks.base import Problem
from rlvr.types import Generation, SamplingParams
from rlvr.parts import AdvantageContext
from rlvr.variants.ib_tpo.config import IBTPOConfig
from rlvr.variants.ib_tpo.estimator import ib_tree_advantages
from rlvr.variants.ib_tpo.sampler import IBTreeSampler
from rlvr.variants.ib_tpo.tree_struct import PromptTree, TokenTexts, TreeIndex, segment_steps

EOS = 2


def _ib_tree(batch, ib):
    """The ``ib_tree`` estimator as the trainer runs it: its advantages stored, its metrics returned."""
    batch.advantages, metrics = ib_tree_advantages(batch, AdvantageContext(None, config=ib))
    return metrics


# ---------------------------------------------------------------------------------------------- fakes
class EqualCostEngine:
    """Every continuation runs to a fixed path length ``total`` (then EOS): a fork after ``f`` tokens
    costs ``total − f`` new tokens. Log-probs are −1 per token. Counts generate calls."""

    def __init__(self, prompt_len: int, total: int, seed: int = 0):
        self.prompt_len, self.total = prompt_len, total
        self.calls = 0
        self.rng = random.Random(seed)

    def generate(self, requests, params):
        self.calls += 1
        out = []
        for r in requests:
            n_new = self.total - (len(r.context_ids) - self.prompt_len)
            assert n_new > 0
            n = min(n_new, params.max_new_tokens)
            out.append([
                Generation(token_ids=[self.rng.randrange(10, 99) for _ in range(n_new - 1)][:n] + [EOS] * (n == n_new),
                           logprobs=[-1.0] * n, finish_reason="eos" if n == n_new else "length")
                for _ in range(r.n)
            ])
        return out


class FakeTok:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids)


class CoinScorer:
    def __init__(self, seed=0):
        self.rng = random.Random(seed)
        self.task = SimpleNamespace(name="coin")
        self.calls = 0

    def score(self, batch):
        self.calls += 1
        ok = [self.rng.random() < 0.5 for _ in range(len(batch))]
        batch.rewards = torch.tensor(ok, dtype=torch.float32)
        batch.correct = torch.tensor(ok)
        batch.texts, batch.feedback = [""] * len(batch), [None] * len(batch)
        return SimpleNamespace(errors=0)


def make_sampler(engine, *, prompt_len=5, cap=80, score_fn=None, budget=None, seed=0, scorer=None, **ib):
    cfg = IBTPOConfig(**{"step_split": "fixed", "fixed_step_tokens": 4, "min_remaining_tokens": 4, **ib})
    enc = lambda p: list(range(100, 100 + prompt_len))  # noqa: E731
    return IBTreeSampler(engine, enc, scorer or CoinScorer(seed), FakeTok(), 0, cfg, cap,
                         score_fn=score_fn, token_budget=budget, seed=seed)


PROBLEMS = [Problem(uid=f"p{i}", question="q", answer="1") for i in range(8)]
PARAMS = SamplingParams(max_new_tokens=80, seed=0)


# ---------------------------------------------------------------------------------------------- steps
def test_paragraph_segmentation_on_real_tokens(tiny):
    _, tok = tiny
    text = "First we add the numbers.\n\nThen 3 + 4 = 7.\n\nSo the answer is 7."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    ends = segment_steps(ids, TokenTexts(tok), min_tokens=1)
    pieces = [tok.decode(ids[a:b]) for a, b in zip([0] + ends[:-1], ends)]
    assert "".join(pieces) == text and len(pieces) == 3
    assert pieces[0].endswith("\n\n") and pieces[1].startswith("Then") and pieces[2].startswith("So")
    assert segment_steps(ids, TokenTexts(tok), min_tokens=len(ids)) == [len(ids)]  # all merged
    n1, n2 = ends[0], ends[1] - ends[0]
    if n2 < n1:  # a minimum between the two lengths merges the 2nd paragraph into the 3rd only
        assert segment_steps(ids, TokenTexts(tok), min_tokens=n2 + 1) == [ends[0], len(ids)]


def test_segmentation_rules_with_synthetic_texts():
    texts = {1: "a", 2: "\n", 3: "\n\n", 4: "b\n"}
    of = texts.__getitem__
    # delimiter straddling two tokens ("\n" + "\n") and inside one token
    assert segment_steps([1, 2, 2, 1, 3, 1, 1], of, min_tokens=1) == [3, 5, 7]
    # short steps merge into the next; the final step may stay short
    assert segment_steps([1, 3, 1, 1, 3, 1], of, min_tokens=3) == [5, 6]
    # long steps split after the last "\n" within the cap, else hard-cut at the cap
    assert segment_steps([1, 4, 1, 1, 1, 1, 1], of, min_tokens=1, max_tokens=3) == [2, 5, 7]
    assert segment_steps([1] * 7, of, min_tokens=1, max_tokens=3) == [3, 6, 7]
    assert segment_steps(list(range(10)), split="fixed", fixed_tokens=4) == [4, 8, 10]
    assert segment_steps([], of) == []
    with pytest.raises(ValueError, match="text_of"):
        segment_steps([1, 2], None)


# ---------------------------------------------------------------------------------------------- budget
def test_budget_efficiency_with_equal_cost_steps():
    """§7.1: chains of 20 equal-cost steps, uniform forks, G = 16, M = 8, budget of 16 full chains."""
    eng, scorer = EqualCostEngine(prompt_len=5, total=80), CoinScorer()
    s = make_sampler(eng, budget=16 * 80, branch_score="random", branches_per_round=4, scorer=scorer)
    trees = s.grow(PROBLEMS, 16, PARAMS)
    leaves = [len(t.leaves) for t in trees]
    assert sum(leaves) / len(leaves) >= 1.4 * 16
    for t in trees:
        assert t.tokens_decode <= 16 * 80  # cumulative projected cost never overshoots (equal-cost steps)
        assert t.tokens_decode == sum(len(n.tokens) for n in t.nodes)  # each generated token stored once
        for leaf in t.leaves:
            assert t.nodes[leaf].end == 80
    assert eng.calls == scorer.calls == max(t.rounds for t in trees)  # one generate and one score call per round


def test_early_forks_give_fewer_leaves_than_late_forks():
    def forced(lo, hi):
        return lambda tree, u, st: random.random() if lo <= tree.nodes[u].end < hi else None

    counts = {}
    for name, (lo, hi) in {"first": (1, 27), "last": (53, 80)}.items():
        random.seed(0)
        s = make_sampler(EqualCostEngine(5, 80), budget=16 * 80, score_fn=forced(lo, hi), branches_per_round=4)
        trees = s.grow(PROBLEMS, 16, PARAMS)
        counts[name] = sum(len(t.leaves) for t in trees) / len(trees)
    assert counts["first"] < counts["last"]


def test_budget_and_leaf_target_stop_and_root_exemption():
    s = make_sampler(EqualCostEngine(5, 80), budget=8 * 80, branch_score="ib")  # only the M chains fit
    trees = s.grow(PROBLEMS[:2], 16, PARAMS)
    assert [len(t.leaves) for t in trees] == [8, 8] and all(t.rounds == 1 for t in trees)
    s = make_sampler(EqualCostEngine(5, 80), budget=10**6, branch_score="ib", max_rounds=50)
    trees = s.grow(PROBLEMS[:2], 8, PARAMS)  # L_target = 12 leaves for G = 8
    assert [len(t.leaves) for t in trees] == [12, 12]
    for t in trees:
        assert all(len(n.children) <= 4 for n in t.nodes[1:])  # K_max for step nodes; the root is exempt


def test_truncated_continuations_are_cut_to_the_path_cap_and_score_zero():
    eng = EqualCostEngine(prompt_len=5, total=100)  # longer than the cap of 80: every leaf truncated
    s = make_sampler(eng, cap=80, budget=16 * 80, branch_score="random", scorer=CoinScorer(1))
    trees = s.grow(PROBLEMS[:2], 8, PARAMS)
    for t in trees:
        assert all(t.nodes[l].end == 80 and t.nodes[l].finish == "length" for l in t.leaves)
        assert all(t.nodes[l].reward == 0.0 for l in t.leaves)
        assert t.tokens_decode == sum(len(n.tokens) for n in t.nodes)
    assert sum(t.tokens_discarded for t in trees) > 0  # forks at different depths share one max_new_tokens


# ---------------------------------------------------------------------------------------------- extraction
def test_extracted_rows_are_concatenated_spans_with_step_advantages_and_weights():
    s = make_sampler(EqualCostEngine(5, 40), cap=40, budget=12 * 40, branch_score="ib", seed=3,
                     scorer=CoinScorer(3))
    batch = s.sample(PROBLEMS[:3], 8, PARAMS, first_group_id=100)
    assert batch.advantages is None  # the sampler never sets advantages: the ib_tree estimator does
    est_metrics = _ib_tree(batch, s.ib)
    assert batch.variable_group_sizes and set(batch.group_id.tolist()) == {100, 101, 102}
    for ti, tree in zip((TreeIndex(**d) for d in batch.tree_index), s.last_trees):
        for leaf, path, row in zip(tree.leaves, ti.paths, ti.rows):
            ids = [x for u in path for x in tree.nodes[u].tokens]
            k = int(batch.completion_mask[row].sum())
            assert batch.completion_ids[row, :k].tolist() == ids
            assert batch.sampler_logp[row, :k].tolist() == [x for u in path for x in tree.nodes[u].logps]
            assert batch.context_ids[row] == tree.prompt_ids
            assert float(batch.rewards[row]) == tree.nodes[leaf].reward
            n = T.leaf_counts(ti.parent)
            off = 0
            for u in path:
                L = ti.span_lengths[u]
                assert torch.allclose(batch.advantages[row, off : off + L], torch.tensor(ti.A[u], dtype=torch.float32))
                assert torch.allclose(batch.token_weights[row, off : off + L], torch.tensor(float(n[u]) ** -0.5))
                off += L
        # siblings' local advantages sum to zero on the sampled tree
        kids = T.tree_children(ti.parent)
        for p, c in enumerate(kids):
            if len(c) >= 2:
                assert sum(ti.values[x] - ti.values[p] for x in c) == pytest.approx(0.0, abs=1e-12)
    m = {**batch.metrics, **est_metrics}
    for key in ("ib/score_mean", "ib/H_mean", "ib/I_mean", "ib/eff_rate_prompt", "ib/eff_rate_node",
                "ib/leaves_per_tree", "ib/leaves_per_budget", "ib/tokens_decode", "ib/tokens_prefill",
                "ib/branch_depth_frac", "ib/gate_frac"):
        assert key in m
    assert m["ib/H_mean"] == pytest.approx(1.0)  # every log-prob is −1


def test_batch_reports_decoded_tokens_once_for_the_budget_meter():
    """Leaf rows repeat shared prefixes: the batch says how many tokens were really decoded, and
    rlvr compare's meter charges that (not the sum of the rows' masks, which counts prefixes per leaf)."""
    from rlvr.compare.budget import generated_counts

    s = make_sampler(EqualCostEngine(5, 40), cap=40, budget=12 * 40, branch_score="random", branches_per_round=2,
                     seed=1, scorer=CoinScorer(1))
    batch = s.sample(PROBLEMS[:2], 8, PARAMS)
    decoded = sum(t.tokens_decode + t.tokens_discarded for t in s.last_trees)
    assert any(t.branches for t in s.last_trees)
    assert batch.generated_tokens == decoded < int(batch.completion_mask.sum())
    assert generated_counts(batch) == (len(batch), decoded)


# ---------------------------------------------------------------------------------------------- tiny model
def _tree_trainer(tmp_path, tiny, task, *extra):
    from rlvr.trainer.trainer import Trainer

    factory, tok = tiny
    cfg = small_config(tmp_path, "sampler=tree", "adv_estimator=ib_tree", "max_completion_length=12",
                       "ib_tpo.step_split=fixed", "ib_tpo.fixed_step_tokens=3", "ib_tpo.min_remaining_tokens=3",
                       "ib_tpo.token_budget=half_max", *extra)
    tr = Trainer(cfg, factory(0), tok, task)
    tr.sampler.token_budget = 4 * 12  # room to branch (random weights never sample EOS)
    return tr


def test_trainer_logprobs_on_extracted_paths_match_the_sampler(tmp_path, tiny, toy_task):
    from rlvr.trainer.forward import completion_logprobs

    tr = _tree_trainer(tmp_path, tiny, toy_task)
    batch, metrics = tr.generate_batch()
    assert metrics["ib/branches_per_tree"] > 0 and "ib/score_mean" in metrics
    with torch.no_grad():
        logp, _ = completion_logprobs(tr.model.eval(), batch, pad_token_id=tr.pad_token_id, with_entropy=False)
    m = batch.completion_mask
    diff = ((logp - batch.sampler_logp).abs() * m).sum() / m.sum()
    assert float(diff) < 1e-2  # prefix/tokenisation bugs show up as O(1) differences


def _tree_with_rewards(prompt, spans, parents, rewards):
    t = PromptTree(0, prompt)
    for sp, p in zip(spans, parents):
        parent = t.nodes[p]
        from rlvr.variants.ib_tpo.tree_struct import TreeNode

        node = TreeNode(parent=p, tokens=list(sp), logps=[-1.0] * len(sp), start=parent.end, depth=parent.depth + 1)
        t.nodes.append(node)
        parent.children.append(len(t.nodes) - 1)
    for u, r in rewards.items():
        t.leaves.append(u)
        t.nodes[u].reward = r
        t.nodes[u].finish = "eos"
    return t


def test_constant_reward_tree_gives_no_update_and_the_gradient_matches_by_hand(tiny):
    from rlvr.core.objective import LossSettings
    from rlvr.trainer.forward import completion_logprobs
    from rlvr.trainer.update import policy_update

    factory, tok = tiny
    model = factory(1)
    ib = IBTPOConfig(ib_lambda=0.1)
    s = IBTreeSampler(None, None, SimpleNamespace(task=SimpleNamespace(name="t")), tok, 0, ib, 32)
    prompt = tok("1 + 2 =", add_special_tokens=False)["input_ids"]
    spans = [[11, 12, 13], [14, 15], [16], [17, 18], [19]]
    parents = [0, 1, 2, 1, 4]  # q → s1 → {s2 → s3 (leaf), s4 → s5 (leaf)}
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    settings = LossSettings(loss_agg_mode="token-mean")
    # 1) every leaf rewarded alike: advantages exactly 0, so no gradient at all
    same = s.extract([_tree_with_rewards(prompt, spans, parents, {3: 1.0, 5: 1.0})], [PROBLEMS[0]], PARAMS)
    _ib_tree(same, ib)
    assert same.advantages.abs().max() == 0
    policy_update(model, opt, same, settings, pad_token_id=0, rows_per_micro=8, step_optimizer=False)
    assert all(p.grad is None or p.grad.abs().max() == 0 for p in model.parameters())
    # 2) disagreeing leaves: gradient = ∇ of −Σ W·A·logp / Σ W (ratio 1 on-policy), by hand
    diff = s.extract([_tree_with_rewards(prompt, spans, parents, {3: 1.0, 5: 0.0})], [PROBLEMS[0]], PARAMS)
    _ib_tree(diff, ib)
    assert diff.advantages.abs().max() > 0
    policy_update(model, opt, diff, settings, pad_token_id=0, rows_per_micro=1, step_optimizer=False,
                  max_grad_norm=None)
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    logp, _ = completion_logprobs(model, diff, pad_token_id=0, with_entropy=False)
    W = diff.completion_mask * diff.token_weights
    (-(W * diff.advantages * logp).sum() / W.sum()).backward()
    for g, p in zip(got, model.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-6, rtol=1e-4)
    # shared step s1 has weight 1/sqrt(2) in both rows, and A(s1) = 0 (its own value equals the root's)
    assert torch.allclose(diff.token_weights[:, :3], torch.full((2, 3), 2 ** -0.5))
    assert diff.advantages[:, :3].abs().max() == 0


def test_tree_training_end_to_end_on_the_tiny_model(tmp_path, tiny, toy_task):
    import json

    tr = _tree_trainer(tmp_path, tiny, toy_task, "steps_per_generation=2", "batch_filters=[ib_logp_mismatch]",
                       "max_steps=2")
    last = tr.train()
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert "ib/leaves_per_tree" in rows[0] and rows[0]["ib/old_logp_mismatch"] < 1e-2
    assert "actor/entropy" in last


def test_ib_tree_estimator_and_tree_sampler_only_together(tmp_path):
    """Refused by config validation, before any model loads (either one alone used to be a silent
    no-op or a late error)."""
    from rlvr.errors import ConfigError
    from rlvr.trainer.components import validate_components

    for over in (["adv_estimator=ib_tree"], ["sampler=tree"],
                 ["sampler=tree", "adv_estimator=ib_tree", "dynamic_sampling.enable=true"],
                 ["sampler=tree", "adv_estimator=ib_tree", "batch_filters=[uec_retention]"]):
        with pytest.raises(ConfigError, match="sampler: tree|dynamic_sampling|per-sequence"):
            validate_components(small_config(tmp_path, *over))
    with pytest.raises(ValueError, match="sampler: tree"):  # called on a batch without a tree index
        _ib_tree(_toy_batch(), IBTPOConfig())


def _toy_batch():
    from rlvr.types import RolloutBatch

    return RolloutBatch(
        context_ids=[[1]], completion_ids=torch.tensor([[5]]), completion_mask=torch.ones(1, 1),
        group_id=torch.tensor([0]), prompt_index=torch.tensor([0]), is_truncated=torch.tensor([False]),
        sampling_temperature=torch.ones(1), logprob_temperature=torch.ones(1), policy_version=torch.zeros(1, dtype=torch.long),
        rewards=torch.ones(1),
    )

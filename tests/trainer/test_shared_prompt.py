"""Prompt sharing in the training forward: a group's prompt runs once, values and gradients unchanged."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.trainer.forward import batch_logprobs, completion_logprobs, length_buckets, micro_batches
from rlvr.types import RolloutBatch


def _batch(contexts, lengths, vocab=200, seed=0):
    """A RolloutBatch with the given contexts and ragged completion lengths (random tokens)."""
    g = torch.Generator().manual_seed(seed)
    n, T = len(lengths), max(max(lengths), 1)
    ids = torch.randint(3, vocab, (n, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).float()
    ids = torch.where(mask > 0, ids, torch.zeros_like(ids))
    return RolloutBatch(
        context_ids=[list(c) for c in contexts], completion_ids=ids, completion_mask=mask,
        group_id=torch.tensor([hash(tuple(c)) % 1000 for c in contexts]), prompt_index=torch.zeros(n, dtype=torch.long),
        is_truncated=torch.zeros(n, dtype=torch.bool), sampling_temperature=torch.ones(n),
        logprob_temperature=torch.linspace(0.7, 1.3, n), policy_version=torch.zeros(n, dtype=torch.long),
    )


def _cost(lengths, buckets, overhead):
    return sum(len(b) * max(lengths[i] for i in b) + overhead for b in buckets)


def test_length_buckets_hand_computed():
    # one long row and one short one: 2·100 + 5 = 205 as one bucket, (100 + 5) + (10 + 5) = 120 as two
    assert length_buckets([10, 100], overhead=5) == [[1], [0]]
    # a bucket costing 200 more than padding: one bucket (2·100 + 200 = 400 < 100 + 10 + 400)
    assert length_buckets([10, 100], overhead=200) == [[1, 0]]
    assert length_buckets([7, 7, 7, 7], overhead=1) == [[0, 1, 2, 3]]
    assert length_buckets([], overhead=3) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=6), st.integers(0, 30))
def test_length_buckets_is_an_optimal_contiguous_partition(lengths, overhead):
    buckets = length_buckets(lengths, overhead)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    for b in buckets:
        assert [lengths[i] for i in b] == sorted((lengths[i] for i in b), reverse=True)
    # brute force over every cut of the sorted order
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    best = min(
        _cost(lengths, [order[a:b] for a, b in zip((0,) + cuts, cuts + (len(order),))], overhead)
        for r in range(len(order))
        for cuts in itertools.combinations(range(1, len(order)), r)
    )
    assert _cost(lengths, buckets, overhead) == best


def test_micro_batches_keep_groups_and_pool_the_rest():
    ctx_a, ctx_b, ctx_c = [1, 2, 3], [4, 5], [6]
    contexts = [ctx_a] * 5 + [ctx_b] * 2 + [ctx_c]
    lengths = [3, 9, 1, 7, 5, 2, 8, 4]
    b = _batch(contexts, lengths)
    mbs = micro_batches(b, 4)
    assert sorted(i for m in mbs for i in m) == list(range(8))
    assert all(len(m) <= 4 for m in mbs)
    # group a fills one micro-batch alone, longest first; its remainder is pooled with b and c
    assert [1, 3, 4, 0] in mbs
    pooled = next(m for m in mbs if m != [1, 3, 4, 0])
    assert sorted(pooled) == [2, 5, 6, 7]
    total = [len(c) + k for c, k in zip(contexts, lengths)]
    assert [total[i] for i in pooled] == sorted((total[i] for i in pooled), reverse=True)
    # without keep_groups: one global sort by context + completion length
    flat = [i for m in micro_batches(b, 4, keep_groups=False) for i in m]
    assert [total[i] for i in flat] == sorted(total, reverse=True)


@pytest.mark.parametrize("lengths", [[12, 12, 12, 12], [60, 3, 41, 0, 7, 58, 1, 20]])
def test_shared_prompt_forward_equals_separate_rows(tiny, lengths):
    """Same log-probs, entropy and parameter gradients as running every row with its own prompt copy,
    including ragged completions split into several buckets and an empty completion."""
    factory, _ = tiny
    model = factory(0)
    ctx = list(range(5, 5 + 17))
    b = _batch([ctx] * len(lengths), lengths, vocab=model.config.vocab_size)
    weights = torch.randn(b.completion_mask.shape, generator=torch.Generator().manual_seed(1))

    def run(share):
        model.zero_grad()
        lp, ent = completion_logprobs(model, b, pad_token_id=0, share_prompt=share, entropy_grad=True)
        ((lp + 0.1 * ent) * weights).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        return lp.detach(), ent.detach(), grads

    lp0, e0, g0 = run(False)
    lp1, e1, g1 = run(True)
    assert torch.allclose(lp0, lp1, atol=1e-5) and torch.allclose(e0, e1, atol=1e-5)
    assert (lp1[b.completion_mask == 0] == 0).all()
    assert g0.abs().sum() > 0 and torch.allclose(g0, g1, atol=1e-5, rtol=1e-4)


def _full_row_reference(model, b):
    """Log-probs, entropy [n, T] and the model's gradient of the same loss, from one plain full forward per
    row over its whole ``context + completion`` (every token fed, the last one included)."""
    n, T = b.completion_mask.shape
    lp = torch.zeros(n, T)
    ent = torch.zeros(n, T)
    for i in range(n):
        k = int(b.completion_lengths[i])
        c = len(b.context_ids[i])
        ids = torch.tensor(b.context_ids[i] + b.completion_ids[i, :k].tolist())[None]
        z = model(input_ids=ids).logits[0, c - 1 : c - 1 + k] / float(b.logprob_temperature[i])
        logp = torch.log_softmax(z, -1)
        lp[i, :k] = logp.gather(1, b.completion_ids[i, :k, None]).squeeze(1)
        ent[i, :k] = -(logp.exp() * logp).sum(-1)
    return lp, ent


@pytest.mark.parametrize("contexts,lengths", [
    ([list(range(5, 22))] * 8, [60, 3, 41, 0, 7, 58, 1, 20]),
    ([list(range(5, 22))] * 3, [1, 1, 1]),  # one-token completions: no completion token is fed at all
    ([[5, 6, 7], [8, 9], [10, 11, 12, 13]], [9, 1, 4]),  # no shared context: the right-padded path
])
@pytest.mark.parametrize("share", [True, False])
def test_trained_logprobs_and_gradients_equal_full_row_forwards(tiny, contexts, lengths, share):
    """Neither path feeds a row's last completion token (it predicts nothing); log-probs, entropy and
    every parameter's gradient still equal one full forward per row over all of its tokens."""
    factory, _ = tiny
    model = factory(0)
    b = _batch(contexts, lengths, vocab=model.config.vocab_size, seed=3)
    weights = torch.randn(b.completion_mask.shape, generator=torch.Generator().manual_seed(1))

    def grads():
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    model.zero_grad()
    lp0, e0 = _full_row_reference(model, b)
    ((lp0 + 0.1 * e0) * weights).sum().backward()
    g0 = grads()
    model.zero_grad()
    fed = []
    hook = model.get_input_embeddings().register_forward_hook(lambda mod, inp, out: fed.append(inp[0].numel()))
    lp1, e1 = completion_logprobs(model, b, pad_token_id=0, share_prompt=share, entropy_grad=True)
    hook.remove()
    ((lp1 + 0.1 * e1) * weights).sum().backward()
    g1 = grads()
    if lengths == [1, 1, 1] and share:
        assert fed == [17]  # the shared context alone
    if lengths == [9, 1, 4] and not share:
        assert fed == [3 * 11]  # 3 rows × (longest context + completion − 1)
    m = b.completion_mask > 0
    assert torch.allclose(lp0[m], lp1[m], atol=1e-5) and torch.allclose(e0[m], e1[m], atol=1e-5)
    assert g0.abs().sum() > 0 and torch.allclose(g0, g1, atol=1e-5, rtol=1e-4)


def test_batch_logprobs_same_with_and_without_sharing(tiny):
    factory, _ = tiny
    model = factory(1)
    contexts = [[3, 4, 5, 6]] * 4 + [[7, 8]] * 4 + [[9, 10, 11]]
    b = _batch(contexts, [5, 9, 2, 30, 4, 4, 1, 16, 6], vocab=model.config.vocab_size, seed=2)
    lp0, e0 = batch_logprobs(model, b, pad_token_id=0, rows_per_micro=4, with_entropy=True, share_prompt=False)
    lp1, e1 = batch_logprobs(model, b, pad_token_id=0, rows_per_micro=4, with_entropy=True, share_prompt=True)
    assert torch.allclose(lp0, lp1, atol=1e-5) and torch.allclose(e0, e1, atol=1e-5)
    assert (lp1[:, :1] != 0).all()


def test_policy_update_gradients_same_with_and_without_sharing(tiny, toy_task, tmp_path):
    """The whole update path (grouped micro-batches, global normalisers) gives the same gradient and loss."""
    from rlvr.testing import small_config
    from rlvr.trainer.trainer import Trainer
    from rlvr.trainer.update import policy_update

    factory, tok = tiny
    tr = Trainer(small_config(tmp_path, "max_completion_length=12", "reward_timeout_s=0"), factory(0), tok, toy_task)
    batch, _ = tr.generate_batch()
    batch.advantages = torch.linspace(-1, 1, len(batch))

    def grads(share):
        res = policy_update(tr.model, tr.optimizer, batch, tr.settings, pad_token_id=tr.pad_token_id, rows_per_micro=4,
                            step_optimizer=False, max_grad_norm=None, share_prompt=share)
        g = torch.cat([p.grad.flatten() for p in tr.model.parameters() if p.grad is not None])
        tr.optimizer.zero_grad(set_to_none=True)
        return g, res.metrics["loss/policy"]

    g0, l0 = grads(False)
    g1, l1 = grads(True)
    assert g0.abs().sum() > 0 and torch.allclose(g0, g1, atol=1e-5, rtol=1e-4)
    assert l1 == pytest.approx(l0, abs=1e-6)

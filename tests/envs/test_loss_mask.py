"""The multi-turn loss mask (issue 26 item 3): environment tokens are inputs, never trained or counted.

A multi-turn row is ``prompt | turn 1 (model) | observation (env) | turn 2 (model)``; its ``loss_mask``
is 0 on the observation. Every consumer reads ``RolloutBatch.model_mask``.
"""

from __future__ import annotations

import copy

import pytest
import torch

from rlvr.core.aggregation import LOSS_AGG_MODES, compute_denominators
from rlvr.core.masks import loss_weights
from rlvr.core.objective import LossSettings, policy_objective
from rlvr.core.veto import veto_metrics
from rlvr.trainer.forward import completion_logprobs
from rlvr.trainer.metrics import rollout_metrics
from rlvr.trainer.update import policy_update
from rlvr.types import RolloutBatch

PROMPT = [1, 40, 41, 42]
TURN1 = [50, 51, 2]  # ends with EOS (id 2)
OBS = [1, 60, 61, 62, 2, 1, 63]  # environment/template tokens
TURN2 = [70, 71, 72, 2]


def _batch(rows: list[tuple[list[int], list[int], list[float]]], rewards=None) -> RolloutBatch:
    """Rows ``(context, completion, loss_mask)``, right-padded."""
    n, width = len(rows), max(len(c) for _, c, _ in rows)
    ids = torch.full((n, width), 2, dtype=torch.long)
    mask = torch.zeros((n, width))
    loss = torch.zeros((n, width))
    for i, (_, c, m) in enumerate(rows):
        ids[i, : len(c)] = torch.tensor(c)
        mask[i, : len(c)] = 1.0
        loss[i, : len(c)] = torch.tensor(m)
    return RolloutBatch(
        context_ids=[list(ctx) for ctx, _, _ in rows], completion_ids=ids, completion_mask=mask,
        group_id=torch.zeros(n, dtype=torch.long), prompt_index=torch.zeros(n, dtype=torch.long),
        is_truncated=torch.zeros(n, dtype=torch.bool), sampling_temperature=torch.ones(n),
        logprob_temperature=torch.ones(n), policy_version=torch.zeros(n, dtype=torch.long),
        loss_mask=loss, rewards=rewards, problems=[None],
    )


def _two_turn_rows(k: int = 2):
    seq = TURN1 + OBS + TURN2
    m = [1.0] * len(TURN1) + [0.0] * len(OBS) + [1.0] * len(TURN2)
    other = TURN1[:2] + [2]
    return [(PROMPT, seq, m)] * (k - 1) + [(PROMPT, other, [1.0] * len(other))]


ENV_SPAN = slice(len(TURN1), len(TURN1) + len(OBS))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_env_token_logits_get_exactly_zero_gradient(mode, level):
    """Every term (clipped surrogate with TIS, KL, entropy bonus) in every aggregation mode, token- and
    sequence-level ratios: the logits at environment positions get a gradient of exactly 0."""
    torch.manual_seed(0)
    batch = _batch(_two_turn_rows(3))
    n, T = batch.completion_ids.shape
    logits = torch.randn(n, T, 97, requires_grad=True)
    lsm = logits.log_softmax(-1)
    ids = batch.completion_ids.clamp(max=96)
    logp = lsm.gather(-1, ids[..., None])[..., 0]
    entropy = -(lsm.exp() * lsm).sum(-1)
    old = (logp + 0.3 * torch.randn(n, T)).detach()
    settings = LossSettings(loss_agg_mode=mode, loss_scale_factor=16.0, beta=0.1, entropy_coef=0.01,
                            importance_sampling_level=level, rollout_is_mode="token_truncate")
    W = loss_weights(batch, mask_truncated=False)
    loss, metrics = policy_objective(
        logp, old, torch.tensor([1.0, -0.5, 0.7]), W, settings, settings.denominators(W),
        ref_logp=old - 0.1, entropy=entropy, rollout_logp=old + 0.05,
    )
    loss.backward()
    g = logits.grad.abs().sum(-1)  # [n, T]
    assert torch.all(g[:2, ENV_SPAN] == 0)  # rows 0, 1 are two-turn rows
    assert torch.all(g[:2, : len(TURN1)] > 0) and torch.all(g[:2, ENV_SPAN.stop :][:, : len(TURN2)] > 0)
    model_tokens = 2 * (len(TURN1) + len(TURN2)) + 3
    assert float(metrics["_tokens"]) == model_tokens


def test_normalisers_count_model_tokens_only():
    batch = _batch(_two_turn_rows(3))
    W = loss_weights(batch, mask_truncated=False)
    d = compute_denominators(W, "token-mean")
    assert d.token_weight == 2 * (len(TURN1) + len(TURN2)) + 3 == float(batch.loss_mask.sum())
    assert batch.model_lengths.tolist() == [7, 7, 3]
    assert batch.completion_lengths.tolist() == [len(TURN1 + OBS + TURN2)] * 2 + [3]


def test_rollout_length_metrics_and_veto_metrics_count_model_tokens():
    batch = _batch(_two_turn_rows(2), rewards=torch.tensor([1.0, 0.0]))
    m = rollout_metrics(batch)
    assert m["completions/max_length"] == 7 and m["completions/mean_length"] == 5
    # μ-GRPO's trigger position: the first trigger after the observation is model token 3 of 7, not position 10
    lr = torch.zeros(2, batch.completion_ids.shape[1])
    lr[0, len(TURN1) + len(OBS)] = -20.0
    out = veto_metrics(lr, torch.tensor([-1.0, -1.0]), batch.model_mask, torch.ones_like(lr))
    assert out["mu_grpo/trigger_pos_frac"] == (3 / 7, 1.0)
    assert out["mu_grpo/veto_token_frac"][1] == 10.0


def test_overlong_penalty_reads_model_lengths():
    from types import SimpleNamespace

    from rlvr.trainer.rollout import shape_rewards

    batch = _batch(_two_turn_rows(2), rewards=torch.tensor([1.0, 1.0]))
    cfg = SimpleNamespace(overlong_buffer_len=4, max_completion_length=8, overlong_penalty_factor=1.0)
    shape_rewards(batch, cfg)  # 7 model tokens (not 14): 3 into the 4-token buffer before 8
    assert batch.reward_components["overlong"].tolist() == pytest.approx([-0.75, 0.0])


@pytest.fixture(scope="module")
def policy(tiny):
    make, tok = tiny
    return make(3), tok


def test_shared_prompt_forward_equals_separate_rows_with_env_tokens(policy):
    model, _ = policy
    batch = _batch(_two_turn_rows(3))
    a, _ = completion_logprobs(model, batch, pad_token_id=2, share_prompt=True, with_entropy=False)
    b, _ = completion_logprobs(model, batch, pad_token_id=2, share_prompt=False, with_entropy=False)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert torch.all(a[:2, ENV_SPAN] == 0) and torch.all(a[:2, : len(TURN1)] != 0)


def _grads(model, batch, advantages, mode):
    model = copy.deepcopy(model)
    batch.advantages = torch.tensor(advantages)
    res = policy_update(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, LossSettings(loss_agg_mode=mode),
                        pad_token_id=2, rows_per_micro=2, step_optimizer=False, share_prompt=False)
    return res, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("mode", ["token-mean", "token-sum"])
def test_two_turn_row_equals_its_turns_as_separate_rows(policy, mode):
    """One two-turn row with the observation masked gives the loss and gradients of the same tokens
    as separate rows: turn 1 under the prompt, turn 2 under prompt + turn 1 + observation (the token
    modes count the same tokens either way)."""
    model, _ = policy
    short = TURN1[:2] + [2]
    joint = _batch([(PROMPT, TURN1 + OBS + TURN2, [1.0] * 3 + [0.0] * 7 + [1.0] * 4), (PROMPT, short, [1.0] * 3)])
    split = _batch([(PROMPT, TURN1, [1.0] * 3), (PROMPT + TURN1 + OBS, TURN2, [1.0] * 4), (PROMPT, short, [1.0] * 3)])
    r1, g1 = _grads(model, joint, [1.0, -1.0], mode)
    r2, g2 = _grads(model, split, [1.0, 1.0, -1.0], mode)
    assert r1.metrics["actor/num_loss_tokens"] == r2.metrics["actor/num_loss_tokens"] == 10
    assert r1.metrics["loss/total"] == pytest.approx(r2.metrics["loss/total"], abs=1e-6)
    assert any(float(g.abs().sum()) > 0 for g in g1)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)

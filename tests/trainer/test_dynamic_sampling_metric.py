"""Issue 12 item 2: DAPO's dynamic-sampling filter reads the verifier's accuracy, before reward shaping."""

from __future__ import annotations

import pytest
import torch

from rlvr.config import build_config
from rlvr.parts import ADV_ESTIMATORS, AdvantageContext, compute_advantages
from rlvr.rewards import ScoreStats
from rlvr.trainer.rollout import collect_generation_batch
from rlvr.types import RolloutBatch

G = 4
# group 0: every answer wrong, lengths 2, 5, 6, 8 with max_completion_length 8 and a 4-token overlong
# buffer: soft penalties 0, −0.25, −0.5, −1 (so the *shaped* reward varies); group 1: two right, two wrong
LENGTHS = [2, 5, 6, 8, 3, 3, 3, 3]
CORRECT = [False, False, False, False, True, False, True, False]


def _dapo(*extra: str):
    return build_config(["dapo"], [f"num_generations={G}", "generation_batch_size=8", "max_completion_length=8",
                                   "overlong_buffer_len=4", "dynamic_sampling.max_num_gen_batches=1", *extra])


def _draw(k: int) -> RolloutBatch:
    n, T = 2 * G, max(LENGTHS)
    mask = (torch.arange(T)[None] < torch.tensor(LENGTHS)[:, None]).float()
    return RolloutBatch(
        context_ids=[[1, 2]] * n, completion_ids=torch.full((n, T), 3, dtype=torch.long), completion_mask=mask,
        group_id=torch.arange(n) // G, prompt_index=torch.arange(n) // G,
        is_truncated=torch.zeros(n, dtype=torch.bool), sampling_temperature=torch.ones(n),
        logprob_temperature=torch.ones(n), policy_version=torch.zeros(n, dtype=torch.long), problems=["p0", "p1"],
    )


def _score(batch: RolloutBatch) -> ScoreStats:
    batch.correct = torch.tensor(CORRECT)
    batch.rewards = batch.correct.float()
    batch.reward_components["toy"] = batch.rewards.clone()
    return ScoreStats(calls=len(batch))


def test_dapo_drops_an_all_wrong_group_of_mixed_lengths():
    cfg = _dapo()
    assert cfg.dynamic_sampling.enable and cfg.dynamic_sampling.metric == "acc"
    with pytest.warns(UserWarning, match="found 1 informative group of the 2 prompts"):  # 1 of 2 wanted: proceed
        batch, stats, _ = collect_generation_batch(_draw, _score, cfg, pad_token_id=0)
    assert batch.group_id.unique().tolist() == [1]
    assert stats.groups_kept == 1 and stats.shortfall == 1
    compute_advantages(ADV_ESTIMATORS[cfg.adv_estimator], batch, AdvantageContext(cfg))
    assert (batch.advantages[torch.tensor(CORRECT[G:])] > 0).all()  # only right answers are reinforced
    assert (batch.advantages[~torch.tensor(CORRECT[G:])] < 0).all()


def test_metric_reward_filters_on_the_shaped_total():
    # the old default, still available by name: the shaped reward varies, so the all-wrong group survives
    # and its shortest wrong answer gets a positive advantage
    cfg = _dapo("dynamic_sampling.metric=reward")
    batch, _, _ = collect_generation_batch(_draw, _score, cfg, pad_token_id=0)
    assert batch.group_id.unique().tolist() == [0, 1]
    compute_advantages(ADV_ESTIMATORS[cfg.adv_estimator], batch, AdvantageContext(cfg))
    assert batch.advantages[0] > 0 and not CORRECT[0]


def test_filter_metric_names():
    from rlvr.trainer.rollout import filter_metric

    b = _draw(2)
    _score(b)
    raw = b.rewards.clone()
    b.rewards = b.rewards - 0.1 * b.completion_lengths  # stand-in for shaping
    assert filter_metric(b, "acc", raw).tolist() == [float(c) for c in CORRECT]
    assert filter_metric(b, "score", raw) is raw
    assert filter_metric(b, "reward", raw) is b.rewards
    assert torch.equal(filter_metric(b, "toy", raw), raw)
    with pytest.raises(KeyError, match="acc, score, reward.*toy"):
        filter_metric(b, "nope", raw)

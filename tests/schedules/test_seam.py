"""The trainer/schedule seam: schedules see only the narrow plan context, steps are typed, impossible
combinations are refused by config validation before any model loads."""

from __future__ import annotations

import dataclasses

import pytest

from rlvr.errors import ConfigError
from rlvr.schedules import OptimizerStep, split_groups
from rlvr.testing import small_config
from rlvr.trainer.components import validate_components
from rlvr.trainer.trainer import Trainer


def test_a_schedule_sees_only_the_plan_context(tmp_path, tiny, toy_task):
    factory, tok = tiny
    tr = Trainer(small_config(tmp_path), factory(0), tok, toy_task)
    seen = []
    plan = tr.schedule.plan
    tr.schedule.plan = lambda b, ctx: seen.append((ctx, ctx.generation_round)) or plan(b, ctx)
    tr.train()
    ctx = seen[0][0]
    assert [r for _, r in seen] == [1, 2] and ctx is tr.plan_ctx and ctx.pad_token_id == tr.pad_token_id
    for name in ("model", "optimizer", "loader", "cfg", "schedule"):
        assert not hasattr(ctx, name), name
    batch, _ = tr.generate_batch()
    logp, ent = ctx.logprobs(batch, with_entropy=True)
    assert logp.shape == batch.completion_mask.shape and ent is not None
    assert not hasattr(batch, "meta")  # no free-form bag: what a step needs is a field of OptimizerStep


def test_optimizer_steps_are_frozen_and_start_actions_checked(tmp_path, tiny, toy_task):
    factory, tok = tiny
    tr = Trainer(small_config(tmp_path), factory(0), tok, toy_task)
    batch, _ = tr.generate_batch()
    step = OptimizerStep(batch, start=("reshuffle_prompts",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.phase = "x"  # type: ignore[misc]
    with pytest.raises(ValueError, match="unknown actions"):
        OptimizerStep(batch, start=("reset_model",))
    epoch = tr.loader.epoch
    tr._update(step)
    assert tr.loader.epoch == epoch + 1 and tr.loader.pos == 0


def test_split_groups_keeps_whole_groups_shuffled_or_in_order(tmp_path, tiny, toy_task):
    factory, tok = tiny
    tr = Trainer(small_config(tmp_path, "generation_batch_size=16"), factory(0), tok, toy_task)
    batch, _ = tr.generate_batch()
    in_order = split_groups(batch, 2, seed=None, passes=2)
    assert [b.group_id.tolist() for b in in_order[:2]] == [b.group_id.tolist() for b in in_order[2:]]
    assert [g for b in in_order[:2] for g in b.group_id.tolist()] == batch.group_id.tolist()
    shuffled = split_groups(batch, 4, seed=3)
    assert sorted(g for b in shuffled for g in b.group_id.tolist()) == sorted(batch.group_id.tolist())
    assert all(len(b) == 4 for b in shuffled)


@pytest.mark.parametrize("over, match", [
    (["kl_in_reward=true"], "needs beta > 0"),
    (["sampler=feedback"], "FBOS-RL parts only work together"),
    (["schedule=fbos", "sampler=feedback", "adv_estimator=fbos", "old_logprob_source=sampler"], "old_logprob_source=trainer"),
    (["schedule=fbos", "sampler=feedback", "adv_estimator=fbos", "fbos.initial_rollouts=4"], "initial_rollouts"),
    (["schedule=fbos", "sampler=feedback", "adv_estimator=fbos", "dynamic_sampling.enable=true"], "dynamic_sampling"),
    (["schedule=stagd"], "did you mean 'staged'"),
    (["adv_estimator=ib_tre"], "did you mean 'ib_tree'"),
])
def test_impossible_combinations_are_refused(tmp_path, over, match):
    with pytest.raises(ConfigError, match=match):
        validate_components(small_config(tmp_path, *over))

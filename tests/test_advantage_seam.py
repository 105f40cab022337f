"""The one advantage seam (``rlvr.parts.ADV_ESTIMATORS``): one registry and one signature for every
estimator, shape-checked, with job-wide statistics through the context so ``scale_rewards=batch`` is the
job's under ``torchrun`` for any estimator, not only GRPO."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.config import build_config
from rlvr.core.advantages import grpo_advantages, rloo_advantages
from rlvr.errors import ConfigError
from rlvr.parts import ADV_ESTIMATORS, AdvantageContext, compute_advantages
from rlvr.registry import UnknownNameError
from rlvr.types import RolloutBatch

R = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]  # two groups of 4


def _batch(rewards=R, g=4, T=3) -> RolloutBatch:
    n = len(rewards)
    return RolloutBatch(
        context_ids=[[1, 2]] * n, completion_ids=torch.ones(n, T, dtype=torch.long), completion_mask=torch.ones(n, T),
        group_id=torch.arange(n) // g, prompt_index=torch.arange(n) // g, is_truncated=torch.zeros(n, dtype=torch.bool),
        sampling_temperature=torch.ones(n), logprob_temperature=torch.ones(n), policy_version=torch.zeros(n, dtype=torch.long),
        rewards=torch.tensor(rewards),
    )


def _cfg(*o):
    return build_config(overrides=["num_generations=4", "generation_batch_size=8", *o])


def test_one_registry_and_one_signature_for_every_estimator():
    import rlvr.trainer.components  # noqa: F401 (the variants' estimators)

    assert {"grpo", "rloo", "ib_tree", "fbos"} <= set(ADV_ESTIMATORS)
    b, ctx = _batch(), AdvantageContext(_cfg())
    assert compute_advantages(ADV_ESTIMATORS["grpo"], b, ctx) == {}
    assert torch.equal(b.advantages, grpo_advantages(b.rewards, b.group_id))
    compute_advantages(ADV_ESTIMATORS["rloo"], b, ctx)
    assert torch.equal(b.advantages, rloo_advantages(b.rewards, b.group_id))
    assert b.advantages[0] == pytest.approx(1 - 0.0) and b.advantages[1] == pytest.approx(0 - 1 / 3)  # r_i - mean(others)
    with pytest.raises(UnknownNameError, match=r"adv_estimator: unknown name 'grop' .*did you mean 'grpo'\?") as e:
        ADV_ESTIMATORS["grop"]
    assert isinstance(e.value, ConfigError)


def test_a_wrong_shape_is_refused_naming_the_estimator():
    b = _batch()
    with pytest.raises(ValueError, match=r"adv_estimator='grpo' returned advantages of shape \(7,\); expected \(8,\) or \(8, 3\)"):
        compute_advantages(lambda batch, ctx: (torch.zeros(7), {}), b, AdvantageContext(_cfg()))


class _TwoRanks:
    """``reduce_sum`` of a fake 2-rank job: this rank's values plus the other rank's (``other``, fixed)."""

    def __init__(self, other_rewards):
        v = torch.tensor(other_rewards, dtype=torch.float64)
        self.other, self.calls = v, []

    def __call__(self, values):
        self.calls.append(list(values))
        if len(values) == 2:  # (count, sum)
            return [values[0] + self.other.numel(), values[1] + float(self.other.sum())]
        mean = None  # second pass: squared deviations from the job mean (recomputed as the other rank would)
        n, s = self.calls[-2]
        mean = (s + float(self.other.sum())) / (n + self.other.numel())
        return [values[0] + float(((self.other - mean) ** 2).sum())]


def test_batch_scaling_uses_the_job_std_for_any_estimator_honouring_it():
    other = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    cfg = _cfg("scale_rewards=batch")
    b = _batch()
    ctx = AdvantageContext(cfg, world_size=2, reduce_sum=_TwoRanks(other))
    compute_advantages(ADV_ESTIMATORS["grpo"], b, ctx)
    job = torch.tensor(R + other, dtype=torch.float64)
    want = grpo_advantages(b.rewards, b.group_id, scale_rewards="none") / (float(job.std()) + cfg.adv_eps)
    assert torch.allclose(b.advantages, want.float())
    assert not torch.allclose(b.advantages, grpo_advantages(b.rewards, b.group_id, scale_rewards="batch"))

    def my_estimator(batch, ctx):  # a user's estimator gets the same job-wide statistics
        return (batch.rewards - batch.rewards.mean()) / ctx.job_std(batch.rewards), {"mine/std": ctx.job_std(batch.rewards)}

    m = compute_advantages(my_estimator, _batch(), AdvantageContext(cfg, world_size=2, reduce_sum=_TwoRanks(other)))
    assert m["mine/std"] == pytest.approx(float(job.std()))


def test_a_rank_without_rows_still_joins_the_collectives():
    cfg = _cfg("scale_rewards=batch")
    calls = _TwoRanks(R)
    empty = _batch().select([])
    assert compute_advantages(ADV_ESTIMATORS["grpo"], empty, AdvantageContext(cfg, world_size=2, reduce_sum=calls)) == {}
    assert len(calls.calls) == 2 and empty.advantages is None  # both all-reduces, no advantages
    called = []
    compute_advantages(lambda b, c: called.append(1), empty, AdvantageContext(_cfg()))  # one process: not called
    assert called == [] and math.isfinite(AdvantageContext(cfg).job_std(torch.tensor(R)))


# ------------------------------------------------------------------ typed structure fields instead of meta
def test_select_and_concat_keep_the_row_references_aligned():
    b = _batch()
    b.fbos_parent_row = [-1, -1, 0, 1, -1, -1, 4, 5]
    b.tree_index = [{"rows": [0, 1, 2, 3], "paths": [[1], [2], [3], [4]], "parent": [-1, 0, 0, 0, 0]},
                    {"rows": [4, 5, 6, 7], "paths": [[1], [2], [3], [4]], "parent": [-1, 0, 0, 0, 0]}]
    b.generated_tokens, b.variable_group_sizes, b.metrics = 99, True, {"s/x": 1.0}
    s = b.select([6, 4, 2])
    assert s.fbos_parent_row == [1, -1, -1]  # row 6's parent (row 4) is now row 1; row 2's parent (0) is gone
    assert s.tree_index == [{"rows": [2], "paths": [[3]], "parent": [-1, 0, 0, 0, 0]},
                            {"rows": [1, 0], "paths": [[1], [3]], "parent": [-1, 0, 0, 0, 0]}]  # leaf order kept
    assert s.generated_tokens is None and s.variable_group_sizes and s.metrics == {"s/x": 1.0}
    assert s.metrics is not b.metrics
    assert b.select(range(8)).generated_tokens == 99
    c = RolloutBatch.concat([b, s], pad_token_id=0)
    assert c.fbos_parent_row == [-1, -1, 0, 1, -1, -1, 4, 5, 9, -1, -1]  # the second batch's rows start at 8
    assert [e["rows"] for e in c.tree_index] == [[0, 1, 2, 3], [4, 5, 6, 7], [10], [9, 8]]
    assert c.generated_tokens is None and c.variable_group_sizes and c.metrics == {"s/x": 1.0}
    assert RolloutBatch.concat([b, b], 0).generated_tokens == 198
    t = c.select([8, 9, 10])  # the selection's tree rows still point at the selection's rows
    assert [e["rows"] for e in t.tree_index] == [[2], [1, 0]] and t.fbos_parent_row == [1, -1, -1]

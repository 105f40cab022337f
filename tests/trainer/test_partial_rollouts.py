"""Partial rollouts (``streaming.partial_rollouts``, trainer/streaming.py + engines/partial.py) on the tiny model
in fp32, with the trainer's real update forced to land at one decode step of a chunk in flight: the recorded
per-token versions change at exactly that step, the behaviour log-probs before it are the old weights' and
after it the new weights' (recomputed by the trainer's forward), max_staleness drops by the oldest token, a
checkpoint keeps the per-token versions, and with the key off nothing changes."""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch

from rlvr.errors import ConfigError
from rlvr.models.tiny import build_tiny_model
from rlvr.samplers.group import generations_to_batch
from rlvr.testing import ToyTask, small_config
from rlvr.trainer.checkpoint import load_checkpoint
from rlvr.trainer.forward import batch_logprobs
from rlvr.trainer.streaming import StreamingPipeline, _groups, _PartialGate, token_staleness_metrics
from rlvr.trainer.trainer import Trainer
from rlvr.types import Generation

BOUNDARY = 4  # decode step of chunk 1 at which the trainer's first update is let through
BASE = ("model.dtype=fp32", "streaming.enable=true", "max_completion_length=12", "learning_rate=1e-2")


def _trainer(tmp_path, name, *extra, resume=None):
    policy, tok = build_tiny_model(0)
    tr = Trainer(small_config(tmp_path / name, *BASE, *extra), policy, tok, ToyTask())
    if resume is not None:
        load_checkpoint(tr, resume)
    return tr


def _train(tr):
    """Train ``tr``; returns ``(batches by update, weights after each update (0: the start), metrics)``."""
    recs: dict[int, object] = {}
    snaps = {tr.global_step: copy.deepcopy(tr.model)}
    orig_update = tr._update

    def update(ob):
        recs[tr.global_step + 1] = ob.batch
        return orig_update(ob)

    tr._update = update
    metrics = []
    tr.callbacks.append(lambda t, m: (snaps.__setitem__(t.global_step, copy.deepcopy(t.model)), metrics.append(dict(m))))
    try:
        tr.train()
    finally:
        tr.close()
    return recs, snaps, metrics


class _ForcedBoundary(_PartialGate):
    """Chunk 1 holds the weights at every decode step but ``BOUNDARY``, where it waits for the trainer's update
    and lets it through (the real :meth:`_PartialGate.between_steps`); other chunks never yield (as with the
    key off). Makes the one weight change of the test land at a known step."""

    def __init__(self, pipe, version, chunk_round, started):
        super().__init__(pipe, version)
        self.chunk_round, self.calls = chunk_round, 0
        if chunk_round == 1:
            started.set()

    def between_steps(self) -> int:
        step, self.calls = self.calls, self.calls + 1
        if self.chunk_round != 1 or step != BOUNDARY:
            return self.version
        gate, deadline = self._pipeline.gate, time.monotonic() + 120
        with gate._cond:
            while not gate._waiting:  # the trainer's update 1 is waiting for the gate
                assert time.monotonic() < deadline, "the trainer's update never came"
                gate._cond.wait(0.01)
        return super().between_steps()


def _force_boundary(tr):
    pipe = tr._pipeline
    started = threading.Event()
    pipe._partial_gate = lambda v: _ForcedBoundary(pipe, v, tr.rollout_round, started)
    guard = pipe.step_guard

    def step_guard():  # update 1 only once chunk 1 holds the weights at version 0
        assert started.wait(120)
        return guard()

    pipe.step_guard = step_guard


def test_versions_and_behaviour_logprobs_change_at_the_forced_boundary(tmp_path):
    tr = _trainer(tmp_path, "forced", "max_steps=2", "streaming.max_staleness=1", "streaming.partial_rollouts=true")
    _force_boundary(tr)
    recs, snaps, metrics = _train(tr)
    b = recs[2]  # chunk 1 (the second generation batch), trained by update 2
    assert b.token_version is not None and torch.equal(b.old_logp, b.sampler_logp)
    mask = b.completion_mask.bool()
    lens = mask.sum(1)
    assert int((lens > BOUNDARY).sum()) >= 2  # rows were in flight at the boundary
    t = torch.arange(mask.shape[1])[None, :].expand_as(mask)
    want = torch.where(t < BOUNDARY, 0, 1)
    assert torch.equal(b.token_version[mask], want[mask])  # (1) versions change at exactly the boundary
    assert torch.equal(b.policy_version, torch.zeros(len(b), dtype=torch.long))  # a row: its oldest token
    old, _ = batch_logprobs(snaps[0], b, pad_token_id=tr.pad_token_id, rows_per_micro=8)
    new, _ = batch_logprobs(snaps[1], b, pad_token_id=tr.pad_token_id, rows_per_micro=8)
    before, after = mask & (t < BOUNDARY), mask & (t >= BOUNDARY)
    lp = b.sampler_logp  # (2) the behaviour log-probs are those of the weights that sampled each token
    torch.testing.assert_close(lp[before], old[before], atol=1e-4, rtol=0)  # fp32 KV decode vs a full forward: ~1e-5 apart
    torch.testing.assert_close(lp[after], new[after], atol=1e-4, rtol=0)  # fp32 KV decode vs a full forward: ~1e-5 apart
    assert (lp[after] - old[after]).abs().max() > 1e-3 and (lp[before] - new[before]).abs().max() > 1e-3
    m = metrics[1]
    assert m["streaming/partial/spanned_frac"] == pytest.approx(float((lens > BOUNDARY).float().mean()))
    assert m["streaming/partial/weight_changes"] == 1.0
    stale = (1 - b.token_version)[mask].float()  # taken at global_step 1
    assert m["streaming/staleness/token_mean"] == pytest.approx(float(stale.mean()))
    assert m["streaming/staleness/token_frac/1"] == pytest.approx(float((stale == 1).float().mean()))
    assert m["streaming/staleness_frac/1"] == 1.0  # per row: the oldest token, sampled one update ago
    assert metrics[0]["streaming/partial/spanned_frac"] == 0.0  # chunk 0 ran before any update


def test_max_staleness_drops_by_the_oldest_token(tmp_path):
    """A group whose rows' newest tokens are fresh but whose oldest token is older than max_staleness is
    dropped at take; one whose every token is within the bound is kept."""
    tr = _trainer(tmp_path, "drop", "max_steps=1", "streaming.max_staleness=1", "streaming.partial_rollouts=true")
    pipe = tr._pipeline
    assert isinstance(pipe, StreamingPipeline) and pipe.partial
    gens = [Generation([5, 6, 7, 8], [-1.0] * 4, "length", versions=[3, 4, 5, 5]),
            Generation([5, 6], [-1.0] * 2, "length", versions=[5, 5])]
    stale = generations_to_batch([[1, 2]] * 2, gens, group_ids=[0, 0], prompt_index=[0, 0], problems=[None],
                                 pad_token_id=0, temperature=1.0, policy_version=3)
    fresh_gens = [Generation([5, 6, 7], [-1.0] * 3, "length", versions=[4, 4, 5]) for _ in range(2)]
    fresh = generations_to_batch([[1, 2]] * 2, fresh_gens, group_ids=[1, 1], prompt_index=[0, 0], problems=[None],
                                 pad_token_id=0, temperature=1.0, policy_version=4)
    assert stale.policy_version.tolist() == [3, 5] and fresh.policy_version.tolist() == [4, 4]
    assert stale.token_version[0].tolist() == [3, 4, 5, 5] and stale.token_version[1].tolist() == [5, 5, 0, 0]
    pipe._buf.extend([(stale, 0.0), (fresh, 0.0)])
    pipe._drop_stale(5)  # staleness 5 - 3 = 2 > 1 for the first group's oldest token; 5 - 4 = 1 for the second
    assert pipe.dropped_groups == 1 and [g for g, _ in pipe._buf] == [fresh]
    m = token_staleness_metrics(fresh, 5, 1)
    assert m["streaming/staleness/token_frac/1"] == pytest.approx(4 / 6)
    assert m["streaming/staleness/token_mean"] == pytest.approx(4 / 6)
    assert m["streaming/partial/spanned_frac"] == 1.0
    tr.close()


def test_off_leaves_streaming_unchanged(tmp_path):
    """partial_rollouts off (the default): the engine gets no decode gate, an update waits for the chunk in
    flight, every row has one version and no per-token versions, and no partial metrics are logged."""
    tr = _trainer(tmp_path, "off", "max_steps=3", "streaming.max_staleness=1")
    assert not tr._pipeline.partial
    seen = []
    orig = tr._pipeline._sample

    def sample(version):
        seen.append(tr.engine.decode_gate)
        return orig(version)

    tr._pipeline._sample = sample
    recs, _, metrics = _train(tr)
    assert seen and all(g is None for g in seen)
    for b in recs.values():
        assert b.token_version is None
        for g in dict.fromkeys(b.group_id.tolist()):
            assert len(set(b.policy_version[b.group_id == g].tolist())) == 1
    assert not any(k.startswith(("streaming/partial/", "streaming/staleness/")) for m in metrics for k in m)


def test_resume_keeps_the_per_token_versions(tmp_path):
    """A checkpoint pauses the producer after its chunk in flight (its rows finish, whatever versions they
    span), stores the buffer with ``token_version``; the resumed run trains those groups first, with them."""
    tr = _trainer(tmp_path, "a", "max_steps=3", "save_steps=3", "streaming.max_staleness=2",
                  "streaming.partial_rollouts=true", "streaming.chunk_prompts=1")
    _train(tr)
    ckpt = tmp_path / "a" / "checkpoint-3"
    resumed = _trainer(tmp_path, "b", "max_steps=4", "streaming.max_staleness=2", "streaming.partial_rollouts=true",
                       "streaming.chunk_prompts=1", resume=ckpt)
    saved = [g for g, _ in resumed._pipeline._buf]
    assert saved, "the producer ran ahead, so the buffer held groups at the checkpoint"
    for g in saved:
        assert g.token_version is not None
        mask = g.completion_mask.bool()
        oldest = g.token_version.masked_fill(~mask, 2**62).amin(1)
        assert torch.equal(g.policy_version, oldest)
    recs, _, _ = _train(resumed)
    first = recs[4]
    for g in saved[: resumed.cfg.prompts_per_generation]:
        rows = (first.group_id == int(g.group_id[0])).nonzero(as_tuple=True)[0]
        got = first.select(rows)
        assert torch.equal(got.token_version, g.token_version) and torch.equal(got.sampler_logp, g.sampler_logp)


def test_mu_grpo_reads_the_oldest_token_and_per_token_logprobs(tmp_path):
    """μ-GRPO (staged schedule, veto) with partial rollouts: the rows' ``policy_version`` is their oldest
    token's, ``staleness/max`` is read from it, and the veto's ``old_logp`` is each token's own behaviour
    log-prob (``sampler_logp``)."""
    tr = _trainer(tmp_path, "mu", "schedule=staged", "loss_masks=[veto]", "steps_per_generation=2",
                  "generation_batch_size=8", "epsilon=1.0", "epsilon_high=4.0", "max_steps=4",
                  "streaming.max_staleness=2", "streaming.partial_rollouts=true", "streaming.chunk_prompts=1")
    seen: list[tuple[int, object]] = []
    orig = tr._update

    def update(ob):
        seen.append((tr.global_step, ob.batch))
        return orig(ob)

    tr._update = update
    metrics = []
    tr.callbacks.append(lambda t, m: metrics.append(dict(m)))
    try:
        tr.train()
    finally:
        tr.close()
    assert len(seen) == 4
    for (step, b), m in zip(seen, metrics):
        mask = b.completion_mask.bool()
        assert torch.equal(b.policy_version, b.token_version.masked_fill(~mask, 2**62).amin(1))
        assert m["staleness/max"] == float((step - b.policy_version).max())
        assert torch.equal(b.old_logp, b.sampler_logp) and "mu_grpo/veto_token_frac" in m


def test_groups_with_and_without_token_versions_concatenate():
    """A buffer restored from a checkpoint of a run with the key the other way mixes groups with and without
    ``token_version``; they concatenate, the latter's tokens at their row's version."""
    from rlvr.trainer.streaming import _with_token_versions
    from rlvr.types import RolloutBatch

    a = generations_to_batch([[1]], [Generation([5, 6], [-1.0, -1.0], "length", versions=[2, 3])], group_ids=[0],
                             prompt_index=[0], problems=[None], pad_token_id=0, temperature=1.0, policy_version=2)
    b = generations_to_batch([[1]], [Generation([5, 6, 7], [-1.0] * 3, "length")], group_ids=[1], prompt_index=[0],
                             problems=[None], pad_token_id=0, temperature=1.0, policy_version=4)
    assert b.token_version is None
    with pytest.raises(ValueError, match="token_version"):
        RolloutBatch.concat([a, b], 0)
    both = RolloutBatch.concat(_with_token_versions([a, b]), 0)
    assert both.token_version.tolist() == [[2, 3, 0], [4, 4, 4]] and both.policy_version.tolist() == [2, 4]


def test_partial_rollouts_refusals(tmp_path):
    with pytest.raises(ConfigError, match="needs streaming.enable"):
        small_config(tmp_path, "streaming.partial_rollouts=true")
    with pytest.raises(ConfigError, match="needs engine=hf"):
        small_config(tmp_path, "streaming.enable=true", "streaming.partial_rollouts=true", "engine=vllm")
    with pytest.raises(ConfigError, match="needs sampler=group"):
        small_config(tmp_path, "streaming.enable=true", "streaming.partial_rollouts=true", "sampler=multiturn")

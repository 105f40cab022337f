"""Streaming rollouts (trainer/streaming.py) on the tiny model in fp32: every trained row carries the policy
version that sampled it and that version's behaviour log-probs (the hf engine in-process and a fake vLLM
server), staleness stays within max_staleness, groups stay whole, and a checkpoint keeps the buffer."""

from __future__ import annotations

import copy

import pytest
import torch
from fake_vllm_server import FakeVLLM, checksum

from rlvr.engines.hf import HFEngine
from rlvr.engines.vllm_engine import request_seed
from rlvr.errors import ConfigError
from rlvr.testing import ToyTask, small_config
from rlvr.models.tiny import build_tiny_model
from rlvr.trainer.checkpoint import load_checkpoint
from rlvr.trainer.components import SAMPLERS, SamplerContext
from rlvr.trainer.forward import batch_logprobs
from rlvr.trainer.trainer import Trainer

STREAM = ("model.dtype=fp32", "streaming.enable=true", "streaming.chunk_prompts=1")  # one prompt per generate call


def _train(tr):
    """Train ``tr`` recording each update's batch and the weights after each step: ``(recs, snaps)``."""
    recs: dict[int, object] = {}
    snaps = {tr.global_step: copy.deepcopy(tr.model)}
    orig_update = tr._update

    def update(ob):
        recs[tr.global_step + 1] = ob.batch
        return orig_update(ob)

    tr._update = update
    tr.callbacks.append(lambda t, m: snaps.__setitem__(t.global_step, copy.deepcopy(t.model)))
    metrics = []
    tr.callbacks.append(lambda t, m: metrics.append(dict(m)))
    try:
        tr.train()
    finally:
        tr.close()
    return recs, snaps, metrics


def _trainer(tmp_path, name, *extra, resume=None):
    policy, tok = build_tiny_model(0)
    tr = Trainer(small_config(tmp_path / name, *STREAM, *extra), policy, tok, ToyTask())
    if resume is not None:
        load_checkpoint(tr, resume)
    return tr


def _chunk_round(group_id: int) -> int:
    return group_id // 1_000_000  # Trainer._draw: group ids start at rollout_round * 1e6 (one round per chunk)


def test_hf_rows_are_what_their_version_samples(tmp_path):
    """Re-sampling each trained group with the weights of the version it records, and the chunk's seed,
    gives exactly its tokens and behaviour log-probs; the loss's old log-probs are those log-probs."""
    tr = _trainer(tmp_path, "hf", "max_steps=6", "streaming.max_staleness=2")
    recs, snaps, metrics = _train(tr)
    cfg = tr.cfg
    stale_rows = 0
    for step, b in recs.items():
        assert b.old_logp is not None and torch.equal(b.old_logp, b.sampler_logp)
        staleness = (step - 1) - b.policy_version  # the version at the batch's (mu = 1) update
        assert int(staleness.min()) >= 0 and int(staleness.max()) <= 2
        stale_rows += int((staleness > 0).sum())
        for g in dict.fromkeys(b.group_id.tolist()):
            rows = (b.group_id == g).nonzero(as_tuple=True)[0]
            assert len(rows) == cfg.num_generations  # groups are whole
            group = b.select(rows)
            v = int(group.policy_version[0])
            assert group.policy_version.tolist() == [v] * len(rows)
            r = _chunk_round(g)
            engine = HFEngine(snaps[v], tr.tokenizer)
            sampler = SAMPLERS[cfg.sampler](SamplerContext(cfg, engine, tr.encoder, tr.scorer, tr.tokenizer,
                                                           tr.pad_token_id))
            tr.rollout_round = r  # the chunk's seed (sampling_params reads rollout_round)
            again = sampler.sample([group.problems[int(group.prompt_index[0])]], cfg.num_generations,
                                   tr.sampling_params(), policy_version=v, first_group_id=g)
            w = group.completion_ids.shape[1]
            assert torch.equal(again.completion_ids[:, :w], group.completion_ids)
            assert torch.equal(again.sampler_logp[:, :w], group.sampler_logp)
            if v != step - 1:  # the test can tell versions apart: the current weights give other log-probs
                now, _ = batch_logprobs(snaps[step - 1], group, pad_token_id=tr.pad_token_id, rows_per_micro=8)
                mask = group.completion_mask.bool()
                assert not torch.allclose(now[mask], group.sampler_logp[mask], atol=1e-4)
    assert stale_rows > 0  # the producer ran ahead: some rows were trained by a later version
    for m in metrics:
        hist = [m[f"streaming/staleness_frac/{k}"] for k in range(3)]
        assert sum(hist) == pytest.approx(1.0)
        assert m["streaming/staleness_mean"] == pytest.approx(sum(k * h for k, h in enumerate(hist)))
        for k in ("buffer_wait_s", "trainer_wait_s", "engine_idle_frac", "trainer_idle_frac", "dropped_groups"):
            assert m[f"streaming/{k}"] >= 0
        assert 0 <= m["streaming/engine_idle_frac"] <= 1 and 0 <= m["streaming/trainer_idle_frac"] <= 1


def test_max_staleness_zero_is_on_policy(tmp_path):
    """max_staleness=0: the producer waits for every update, so each batch is sampled by the weights it trains."""
    tr = _trainer(tmp_path, "s0", "max_steps=4", "streaming.max_staleness=0", "streaming.chunk_prompts=2")
    recs, _, metrics = _train(tr)
    for step, b in recs.items():
        assert b.policy_version.tolist() == [step - 1] * len(b)
    assert all(m["streaming/staleness_frac/0"] == 1.0 and m["staleness/max"] == 0 for m in metrics)


def test_stale_groups_are_dropped_at_take(tmp_path):
    """A buffered group older than max_staleness is dropped when the trainer takes a batch, never trained."""
    from rlvr.trainer.streaming import StreamingPipeline, _groups

    tr = _trainer(tmp_path, "drop", "max_steps=1", "streaming.max_staleness=1")
    pipe = tr._pipeline
    assert isinstance(pipe, StreamingPipeline)
    b = tr._draw(2)
    scored = _groups(b)
    for g in scored:
        tr.scorer.score(g)
    scored[0].policy_version[:] = -5  # sampled long ago
    pipe._buf.extend((g, 0.0) for g in scored)
    pipe._drop_stale(tr.global_step)
    assert pipe.dropped_groups == 1 and len(pipe._buf) == 1 and pipe._buf[0][0] is scored[1]


def test_resume_keeps_the_buffer(tmp_path):
    """A checkpoint pauses the producer and stores the buffered groups; the resumed run trains them first,
    with the versions and behaviour log-probs they were sampled with."""
    tr = _trainer(tmp_path, "a", "max_steps=3", "save_steps=3", "streaming.max_staleness=2")
    _train(tr)
    ckpt = tmp_path / "a" / "checkpoint-3"
    resumed = _trainer(tmp_path, "b", "max_steps=5", "streaming.max_staleness=2", resume=ckpt)
    saved = [g for g, _ in resumed._pipeline._buf]
    assert saved, "the producer ran ahead, so the buffer held groups at the checkpoint"
    assert (ckpt / "queued-0.safetensors").exists()
    recs, _, _ = _train(resumed)
    first = recs[4]
    n = min(len(saved), resumed.cfg.prompts_per_generation)
    want = {int(g.group_id[0]) for g in saved[:n]}  # the oldest buffered groups (the schedule shuffles rows)
    assert want <= set(first.group_id.tolist())
    for g in saved[:n]:
        rows = (first.group_id == int(g.group_id[0])).nonzero(as_tuple=True)[0]
        got = first.select(rows)
        assert got.policy_version.tolist() == g.policy_version.tolist() and int(g.policy_version.max()) <= 3
        assert torch.equal(got.sampler_logp, g.sampler_logp) and torch.equal(got.completion_ids, g.completion_ids)


def test_vllm_server_rows_are_sampled_by_the_version_they_record(tmp_path):
    """With the server engine the weights are pushed between chunks: every completion request of a chunk
    reached a server holding exactly the weights of the version its rows record."""
    policy, tok = build_tiny_model(0)
    with FakeVLLM(copy.deepcopy(policy), tok) as fake:
        cfg = small_config(tmp_path / "v", *STREAM, "max_steps=5", "engine=vllm", f"vllm.url={fake.url}",
                           f"vllm.sync_dir={tmp_path / 'v' / 'sync'}", "vllm.seed_requests=true",
                           "streaming.max_staleness=2")
        tr = Trainer(cfg, policy, tok, ToyTask())
        recs, snaps, _ = _train(tr)
        calls = list(fake.calls)
    seed_round = {}
    for r in range(64):
        s = (cfg.seed * 1_000_003 + r * 7919) % 2**31
        seed_round[request_seed(s, 0)] = r  # one prompt per chunk (chunk_prompts=1)
    server_ck = {seed_round[body["seed"]]: ck for path, body, ck in calls if path == "/v1/completions"}
    for step, b in recs.items():
        assert torch.equal(b.old_logp, b.sampler_logp)
        for g in dict.fromkeys(b.group_id.tolist()):
            v = int(b.policy_version[b.group_id == g][0])
            assert 0 <= (step - 1) - v <= 2
            assert server_ck[_chunk_round(g)] == pytest.approx(checksum(snaps[v]), rel=1e-12)


def test_streaming_config_refusals(tmp_path):
    with pytest.raises(ConfigError, match="choose one"):
        small_config(tmp_path, "streaming.enable=true", "max_async_level=1", "engine=vllm")
    with pytest.raises(ConfigError, match="dynamic_sampling"):
        small_config(tmp_path, "streaming.enable=true", "dynamic_sampling.enable=true")
    with pytest.raises(ConfigError, match="chunk_prompts=3 must divide"):
        small_config(tmp_path, "streaming.enable=true", "streaming.chunk_prompts=3")
    with pytest.raises(ConfigError, match="disable_dropout"):
        small_config(tmp_path, "streaming.enable=true", "disable_dropout=false")
    with pytest.raises(ConfigError, match="streaming.max_staleness"):
        small_config(tmp_path, "streaming.enable=true", "streaming.max_staleness=-1")
    from rlvr.trainer.components import validate_components

    with pytest.raises(ConfigError, match="with streaming.enable later stages"):  # mu_grpo's own check
        validate_components(small_config(tmp_path, "streaming.enable=true", "schedule=staged",
                                         "mu_grpo.stage_prompt_draw=fresh_shuffle"))


def test_tis_weights_correct_stale_rows_towards_the_trainers_policy(tmp_path):
    """vllm_importance_sampling_correction: the ratio is taken against the trainer's forward at the take
    (μ = 1: no stored old_logp) and the rollout IS ratio π_train / π_behaviour is 1 up to fp32 noise on
    fresh batches and moves away from 1 on batches with stale rows."""
    tr = _trainer(tmp_path, "tis", "max_steps=6", "streaming.max_staleness=2",
                  "vllm_importance_sampling_correction=true")
    recs, _, metrics = _train(tr)
    seen_stale = False
    for step, m in enumerate(metrics, start=1):
        b = recs[step]
        assert b.old_logp is None  # μ = 1: the proximal policy is the current forward, sg(logp)
        lo, hi = m["actor/rollout_is_ratio/min"], m["actor/rollout_is_ratio/max"]
        if int((step - 1 - b.policy_version).max()) == 0:
            assert abs(lo - 1) < 1e-3 and abs(hi - 1) < 1e-3
        else:
            seen_stale = True
            assert max(abs(lo - 1), abs(hi - 1)) > 1e-3
    assert seen_stale

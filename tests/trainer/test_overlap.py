"""max_async_level (trainer/overlap.py) on a fake vLLM server: staleness is exactly the knob, behaviour
log-probs come from the weights that generated each row, and a resumed run is bitwise the same."""

from __future__ import annotations

import copy

import pytest
import torch
from fake_vllm_server import FakeVLLM, checksum

from rlvr.engines.vllm_engine import request_seed
from rlvr.models.tiny import build_tiny_model
from rlvr.testing import small_config
from rlvr.trainer.checkpoint import load_checkpoint
from rlvr.trainer.forward import batch_logprobs
from rlvr.trainer.trainer import Trainer


def _run(tmp_path, name, level, *extra, resume=None):
    """Train on a fresh fake server; returns (trainer, per-step records, fake calls)."""
    policy, tok = build_tiny_model(0)
    from rlvr.testing import ToyTask

    with FakeVLLM(copy.deepcopy(policy), tok) as fake:
        cfg = small_config(tmp_path / name, "max_steps=5", "engine=vllm", f"vllm.url={fake.url}",
                           f"vllm.sync_dir={tmp_path / name / 'sync'}", f"max_async_level={level}", "model.dtype=fp32",
                           "vllm.seed_requests=true", *extra)  # seeded draws: exact resume on the fake server  # fp32: log-probs compared exactly
        tr = Trainer(cfg, policy, tok, ToyTask())
        if resume is not None:
            load_checkpoint(tr, resume)
        recs: dict[int, dict] = {}
        snaps = {tr.global_step: copy.deepcopy(tr.model)}
        orig_update = tr._update

        def update(ob):
            recs[tr.global_step + 1] = {"batch": ob.batch}  # ob: an OptimizerStep
            return orig_update(ob)

        tr._update = update

        def after(t, m):
            recs[t.global_step].update(m)
            snaps[t.global_step] = copy.deepcopy(t.model)

        tr.callbacks.append(after)
        tr.train()
        tr.close()
        calls = list(fake.calls)
    return tr, recs, snaps, calls


@pytest.mark.parametrize("level", [1, 2])
def test_staleness_is_exactly_the_knob(tmp_path, level):
    tr, recs, _, _ = _run(tmp_path, f"k{level}", level)
    for step in range(1, 6):  # mu = 1: round j = step - 1 is generated from the weights after round max(0, j - k)
        j = step - 1
        m, b = recs[step], recs[step]["batch"]
        assert b.policy_version.tolist() == [max(0, j - level)] * len(b)
        assert m["staleness/max"] == m["staleness/mean"] == min(j, level)
        assert m["async/staleness_rounds"] == min(j, level)


def test_behaviour_logprobs_come_from_the_generating_version(tmp_path):
    """Each round's completions were sampled by the server holding exactly the weights of the version
    its rows record, and the loss's old log-probs equal those weights' log-probs of the tokens."""
    level = 1
    tr, recs, snaps, calls = _run(tmp_path, "prov", level)
    cfg = tr.cfg
    seed_round = {}
    for r in range(6):
        s = (cfg.seed * 1_000_003 + r * 7919) % 2**31
        for i in range(cfg.prompts_per_generation):
            seed_round[request_seed(s, i)] = r
    gens = [(seed_round[body["seed"]], ck) for path, body, ck in calls if path == "/v1/completions"]
    assert {r for r, _ in gens} == set(range(5))  # rounds 0..4, nothing generated past the last one
    for r, ck in gens:
        assert ck == pytest.approx(checksum(snaps[max(0, r - level)]), rel=1e-12)
    for step in range(1, 6):
        b = recs[step]["batch"]
        ver = int(b.policy_version[0])
        assert b.old_logp is not None and torch.equal(b.old_logp, b.sampler_logp)
        want, _ = batch_logprobs(snaps[ver], b, pad_token_id=tr.pad_token_id, rows_per_micro=8)
        mask = b.completion_mask.bool()
        assert torch.allclose(b.old_logp[mask], want[mask], atol=1e-4)
        if step > 1:  # stale rows: the current policy differs from the behaviour one
            now, _ = batch_logprobs(snaps[step - 1], b, pad_token_id=tr.pad_token_id, rows_per_micro=8)
            assert not torch.allclose(now[mask], want[mask], atol=1e-4)


@pytest.mark.parametrize("save_at", [2, 3])  # mu = 2: at a round boundary, and mid-round
def test_resume_is_exact(tmp_path, save_at):
    geo = ("steps_per_generation=2", "generation_batch_size=16", "max_steps=6", f"save_steps={save_at}")
    full, recs_a, _, _ = _run(tmp_path, "a", 2, *geo)
    ckpt = tmp_path / "a" / f"checkpoint-{save_at}"
    assert (ckpt / "queued-0.safetensors").exists() and (ckpt / "queued-1.safetensors").exists()
    resumed, recs_b, _, _ = _run(tmp_path, "b", 2, *geo, resume=ckpt)
    assert sorted(recs_b) == list(range(save_at + 1, 7))
    for step in range(save_at + 1, 7):
        a, b = recs_a[step]["batch"], recs_b[step]["batch"]
        assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.old_logp, b.old_logp)
        assert torch.equal(a.rewards, b.rewards) and a.policy_version.tolist() == b.policy_version.tolist()
    for (n, x), y in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(x, y), n


def test_async_needs_a_server_engine(tmp_path):
    from rlvr.errors import ConfigError

    with pytest.raises(ConfigError, match="max_async_level=1 needs engine=vllm"):
        small_config(tmp_path, "max_async_level=1")
    from rlvr.trainer.components import validate_components

    with pytest.raises(ConfigError, match="fresh_shuffle"):  # the mu_grpo section's check (rlvr.variants.mu_grpo.schedule)
        validate_components(small_config(tmp_path, "max_async_level=1", "engine=vllm", "schedule=staged",
                                         "mu_grpo.stage_prompt_draw=fresh_shuffle"))
    with pytest.raises(ConfigError, match="vllm_importance_sampling_correction with max_async_level"):
        small_config(tmp_path, "max_async_level=1", "engine=vllm", "vllm_importance_sampling_correction=true")

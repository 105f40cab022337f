"""UEC-RL replay stabiliser: buffer admission, FIFO, accumulation, replay cadence, stored values, checkpoint
state, and an end-to-end run of the uec_rl recipe on the tiny model (docs/uec_rl.md §7.3)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from rlvr.config import build_config
from rlvr.schedules.buffer import TrajectoryBuffer
from rlvr.variants.uec_rl.schedule import UECReplaySchedule
from rlvr.testing import ModelPlanContext
from rlvr.types import RolloutBatch


def make_batch(adv, gid=None, *, T=3, version=0, seed=0, kinds=None):
    n = len(adv)
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (n,), generator=gen)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    ids = torch.randint(20, 200, (n, T), generator=gen) * mask.long()
    return RolloutBatch(
        context_ids=[[1, 30 + i % 5] for i in range(n)],
        completion_ids=ids,
        completion_mask=mask,
        group_id=torch.tensor(gid if gid is not None else list(range(n))),
        prompt_index=torch.arange(n),
        is_truncated=torch.zeros(n, dtype=torch.bool),
        sampling_temperature=torch.ones(n),
        logprob_temperature=torch.ones(n),
        policy_version=torch.full((n,), version),
        rewards=(torch.tensor(adv) > 0).float(),
        advantages=torch.tensor(adv, dtype=torch.float32),
        sampler_logp=-torch.rand(n, T, generator=gen) * mask,
        correct=torch.tensor(adv) > 0,
        texts=[f"t{i}" for i in range(n)],
        context_kind=kinds or ["regular"] * n,
        problems=[SimpleNamespace(uid=f"p{seed}-{i}", question="q", answer="a", metadata={}) for i in range(n)],
    )


def test_buffer_admission_capacity_and_fifo():
    buf = TrajectoryBuffer(5, 0, admit=lambda b: b.advantages > 1.0)
    assert buf.push(make_batch([1.5, 0.5, 2.0, -3.0, 1.0001])) == 3  # only Â > A_0 = 1
    assert buf.data.advantages.tolist() == pytest.approx([1.5, 2.0, 1.0001])
    assert buf.push(make_batch([3.0, 4.0, 5.0, 0.0], seed=1)) == 3
    assert len(buf) == 5 and buf.full and buf.evicted_total == 1
    assert buf.seq == [1, 2, 3, 4, 5]  # the oldest (seq 0) went, the newest are kept
    assert buf.data.advantages.tolist() == pytest.approx([2.0, 1.0001, 3.0, 4.0, 5.0])
    old = buf.pop_oldest(2)
    assert old.advantages.tolist() == pytest.approx([2.0, 1.0001]) and buf.seq == [3, 4, 5]
    rows, pos = buf.sample(2, torch.Generator().manual_seed(0))
    assert len(buf) == 3 and len(rows) == 2  # sampling keeps the rows
    buf.remove(pos)
    assert len(buf) == 1
    for _ in range(4):
        buf.push(make_batch([9.0] * 4, seed=2))
        assert len(buf) <= 5
    assert len(buf.data.problems) <= 5  # problems compacted to the referenced ones
    with pytest.raises(ValueError):
        buf.pop_oldest(6)


def _schedule(tmp_path, *overrides):
    cfg = build_config(overrides=[
        "num_generations=2", "generation_batch_size=4", "per_device_train_batch_size=4",
        f"logging.output_dir={tmp_path}", "uec.update_size=4", "uec.replay_every=3", "uec.replay_capacity=6",
        *overrides,
    ])
    return cfg, UECReplaySchedule(cfg)


def test_accumulation_to_fixed_update_size(tmp_path, tiny):
    factory, tok = tiny
    tr = ModelPlanContext(factory(0), tok.pad_token_id, 1)
    cfg, sch = _schedule(tmp_path, "uec.replay_every=0")
    assert sch.plan(make_batch([0.5, -0.5, 0.7]), tr) == []  # 3 < N_upd = 4: no update
    assert sch.log[-1]["uec/update_skipped"] == 1 and len(sch.pending) == 3
    tr.generation_round = 2
    out = sch.plan(make_batch([0.2, -0.2, 0.3, -0.3, 0.9, -0.9], seed=1), tr)  # 9 rows: pop the oldest 8
    assert sum(len(b) for b in out) == 8 and len(sch.pending) == 1
    assert sch.pending.data.advantages.tolist() == pytest.approx([-0.9])  # the newest row waits
    assert len(out) == 2  # ⌊9/4⌋ = 2 optimizer batches of N_upd
    assert out[0].metrics["uec/pending_size"] == 1
    _, none = _schedule(tmp_path, "uec.accumulate=none", "uec.replay_every=0")
    assert sum(len(b) for b in none.plan(make_batch([0.5, -0.5, 0.7]), tr)) == 3


def test_replay_cadence_and_stored_values(tmp_path, tiny):
    factory, tok = tiny
    model = factory(0)
    tr = ModelPlanContext(model, tok.pad_token_id, 0)
    cfg, sch = _schedule(tmp_path)
    fired, stored = [], None
    for t in range(1, 10):
        tr.generation_round = t
        adv = [1.5, -1.5, 2.0, -0.2] if t <= 3 else [0.5, -0.5, 0.4, -0.4]  # admissions only in rounds 1–3
        out = sch.plan(make_batch(adv, seed=t, version=t), tr)
        replay = [b for b in out if b.phase == "replay"]
        if replay:
            fired.append(t)
        if t == 1:  # stored old_logp = the log-probs of the policy about to train on them (μ = 1)
            stored = sch.replay.state_dict()["tensors"]
            assert sch.replay.data.old_logp is not None and len(sch.replay) == 2
        with torch.no_grad():  # the policy moves between rounds
            for p in model.parameters():
                p.add_(0.01 * torch.randn_like(p))
        if t == 3:
            assert len(sch.replay) == 6 and sch.replay.full
            rb = replay[0].batch
            # the full buffer is replayed with its stored Â and old_logp, bit-identical to admission
            first = [i for i in range(len(rb)) if int(rb.policy_version[i]) == 1]
            assert torch.equal(rb.advantages[first], stored["advantages"])
            for i, j in zip(first, range(2)):
                k = int(rb.completion_mask[i].sum())
                assert k == int(stored["completion_mask"][j].sum())
                assert torch.equal(rb.old_logp[i, :k], stored["old_logp"][j, :k])
            assert replay[0].phase == "replay"
            assert out[0].metrics["uec/replay_fired"] == 1
    # fires exactly when t mod 3 == 0 and |replay| ≥ N_upd = 4 (round 3 holds 6 rows; rows stay after use)
    assert fired == [3, 6, 9]
    assert "uec/entropy_after_replay" in sch.log[3] and "uec/entropy_before_replay" in sch.log[2]
    _, small = _schedule(tmp_path, "uec.replay_min_size=10")
    for t in range(1, 7):
        tr.generation_round = t
        assert not [b for b in small.plan(make_batch([1.5, -1.5, 2.0, -0.2], seed=t), tr) if b.phase]


def test_schedule_state_roundtrip_through_safetensors_and_json(tmp_path, tiny):
    from safetensors.torch import load_file, save_file

    factory, tok = tiny
    tr = ModelPlanContext(factory(0), tok.pad_token_id, 1)
    cfg, sch = _schedule(tmp_path)
    sch.plan(make_batch([1.5, -1.5, 2.0, -0.2, 0.3], seed=1), tr)
    state = sch.state_dict()
    tensors = state.pop("tensors")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / "s.safetensors"))
    (tmp_path / "s.json").write_text(json.dumps(state))
    sch2 = UECReplaySchedule(cfg)
    sch2.load_state_dict({**json.loads((tmp_path / "s.json").read_text()), "tensors": load_file(str(tmp_path / "s.safetensors"))})
    for a, b in ((sch.replay, sch2.replay), (sch.pending, sch2.pending)):
        assert a.seq == b.seq and len(a) == len(b)
        for f in ("completion_ids", "advantages", "old_logp", "completion_mask"):
            x, y = getattr(a.data, f), getattr(b.data, f)
            assert (x is None and y is None) or torch.equal(x, y)
        assert a.data.context_ids == b.data.context_ids and a.data.context_kind == b.data.context_kind
    tr.generation_round = 3
    o1 = sch.plan(make_batch([0.5, -0.5, 0.6, -0.6], seed=3), tr)
    o2 = sch2.plan(make_batch([0.5, -0.5, 0.6, -0.6], seed=3), tr)
    assert [len(b) for b in o1] == [len(b) for b in o2]
    for b1, b2 in zip(o1, o2):
        assert torch.equal(b1.batch.advantages, b2.batch.advantages) and torch.equal(b1.batch.completion_ids, b2.batch.completion_ids)


def _half_hard_task():
    from rlvr.testing import ToyTask

    class HalfHard(ToyTask):
        """Odd problems are never solved (zero pass rate whatever the sampler draws, so the exploration
        path always runs); even ones pass on even lengths."""

        def verify(self, problem, completion):
            from rlvr.tasks.base import Verdict

            i = int(problem.uid.split("-")[1])
            ok = False if i % 2 else len(completion) % 2 == 0
            return Verdict(score=float(ok), correct=ok)

    return HalfHard()


def _uec_cfg(out, *extra):
    return build_config(
        ["uec_rl"], [
            "num_generations=4", "generation_batch_size=8", "per_device_train_batch_size=8",
            "max_completion_length=6", "max_prompt_length=64", "max_steps=5", "learning_rate=1e-3",
            f"logging.output_dir={out}", "logging.progress=false", "logging.tensorboard=false",
            "uec.explore_num_generations=6", "uec.update_size=4", "uec.replay_every=2",
            "uec.replay_adv_threshold=0.5", "uec.drop_truncated_positive=false", "uec.replay_min_size=1", *extra,
        ])


def test_uec_recipe_end_to_end_on_tiny_model(tmp_path, tiny):
    from rlvr.trainer.trainer import Trainer

    factory, tok = tiny
    tr = Trainer(_uec_cfg(tmp_path), factory(0), tok, _half_hard_task())
    tr.train()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows and rows[-1]["step"] == 5
    keys = set().union(*rows)
    for k in ("uec/hard_prompt_frac", "uec/retained_regular", "uec/pending_size", "uec/replay_size",
              "uec/replay_admitted", "reward/mean", "actor/entropy"):
        assert k in keys, k
    assert sum(h["uec/explore_rollouts"] for h in tr.sampler.history) > 0
    assert any(r.get("uec/replay_fired") for r in rows) and any(k.startswith("replay/actor/") for k in keys)


def test_ablation_switches_tempered_is_fresh_ratios_and_remove_after_use(tmp_path, tiny):
    from rlvr.core.uec import tempered_is_weights
    from rlvr.trainer.forward import batch_logprobs

    factory, tok = tiny
    model = factory(0)
    tr = ModelPlanContext(model, tok.pad_token_id, 1)
    cfg, sch = _schedule(tmp_path, "uec.explore_is_correction=tempered_is", "uec.explore_is_max_weight=3.0",
                         "uec.replay_every=0")
    b = make_batch([0.5, -0.5, 0.8, 0.9], kinds=["regular", "regular", "explore", "explore"])
    out = sch.plan(b, tr)
    rows = torch.cat([x.batch.token_weights for x in out]) if out else None
    assert rows is not None
    lp, _ = batch_logprobs(model, b, pad_token_id=tok.pad_token_id)
    want = tempered_is_weights(lp[2:], b.sampler_logp[2:], b.completion_mask[2:], 3.0)
    assert torch.equal(b.token_weights[:2], b.completion_mask[:2])  # regular rows: weight 1
    assert torch.allclose(b.token_weights[2:], want) and (b.token_weights <= 3.0).all()
    # fresh replay ratios and replayed rows removed after use
    _, fresh = _schedule(tmp_path, "uec.replay_recompute_old_logprob=true", "uec.replay_remove_after_use=true",
                         "uec.replay_every=1", "uec.replay_min_size=1")
    out = fresh.plan(make_batch([1.5, -1.5, 2.0, -0.2], seed=4), tr)
    rb = [x for x in out if x.phase == "replay"]
    assert rb and len(fresh.replay) == 0
    lp, _ = batch_logprobs(model, rb[0].batch, pad_token_id=tok.pad_token_id)
    assert torch.equal(rb[0].batch.old_logp, lp)


def test_token_diagnostics_per_kind(tmp_path, tiny):
    factory, tok = tiny
    tr = ModelPlanContext(factory(0), tok.pad_token_id, 1)
    _, sch = _schedule(tmp_path, "uec.token_diagnostics=true", "uec.replay_every=0")
    out = sch.plan(make_batch([0.5, -0.5, 0.8, 0.9], kinds=["regular", "regular", "explore", "explore"]), tr)
    m = out[0].metrics
    for kind in ("regular", "explore"):
        assert 0 <= m[f"uec/low_prob_positive_frac/{kind}"] <= 1
        assert m[f"uec/nll_entropy_proxy/{kind}"] > 0 and m[f"uec/token_entropy/{kind}"] > 0


def test_resume_restores_buffers_and_continues_identically(tmp_path, tiny):
    from rlvr.trainer.checkpoint import load_checkpoint
    from rlvr.trainer.trainer import Trainer

    factory, tok = tiny
    ref = Trainer(_uec_cfg(tmp_path / "ref", "save_steps=2"), factory(0), tok, _half_hard_task())
    seen_ref = []
    ref.callbacks.append(lambda t, m: seen_ref.append(dict(m)))
    ref.train()
    assert len(ref.schedule.replay) > 0  # the buffer that must survive the checkpoint is not empty
    res = Trainer(_uec_cfg(tmp_path / "ref", "save_steps=2"), factory(0), tok, _half_hard_task())
    load_checkpoint(res, tmp_path / "ref" / "checkpoint-2")
    seen = []
    res.callbacks.append(lambda t, m: seen.append(dict(m)))
    res.train()
    assert len(seen) == 3
    assert any(k.startswith("replay/") for m in seen for k in m)  # a replay update ran after the resume
    for a, b in zip(seen_ref[2:], seen):
        for k in ("loss/total", "actor/grad_norm"):
            key = next(x for x in a if x.endswith(k))
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    for buf_a, buf_b in ((ref.schedule.replay, res.schedule.replay), (ref.schedule.pending, res.schedule.pending)):
        assert buf_a.seq == buf_b.seq
        if buf_a.data is not None:
            assert torch.equal(buf_a.data.advantages, buf_b.data.advantages)
            assert torch.equal(buf_a.data.old_logp if buf_a.data.old_logp is not None else torch.zeros(0),
                               buf_b.data.old_logp if buf_b.data.old_logp is not None else torch.zeros(0))
    for p, q in zip(ref.model.parameters(), res.model.parameters()):
        assert torch.allclose(p, q, atol=1e-6)

"""Trainer: end to end on a tiny model, reproducibility, accumulation equivalence, schedule bookkeeping."""

from __future__ import annotations

import json

import pytest
import torch

from rlvr.testing import small_config
from rlvr.trainer.forward import build_inputs, completion_logprobs
from rlvr.trainer.trainer import Trainer
from rlvr.trainer.update import policy_update
from rlvr.trainer.forward import micro_batches


def make_trainer(tmp_path, tiny, task, *overrides, seed=0):
    factory, tok = tiny
    cfg = small_config(tmp_path, *overrides)
    return Trainer(cfg, factory(seed), tok, task)


def test_end_to_end_writes_metrics_tensorboard_and_final(tmp_path, tiny, toy_task):
    tr = make_trainer(tmp_path, tiny, toy_task)
    last = tr.train()
    assert tr.global_step == 2
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("reward/mean", "reward/std", "reward/pass_rate", "reward/frac_zero_std_groups",
                "rewards/toy/mean", "completions/mean_length", "completions/clipped_ratio", "actor/entropy",
                "actor/grad_norm", "actor/clip_ratio/low", "actor/clip_ratio/high",
                "actor/ratio", "actor/ratio/min", "actor/ratio/max", "loss/policy", "loss/total",
                "timing/generate_s", "timing/update_s", "perf/tokens_per_s", "perf/peak_memory_mb"):
        assert key in rows[0], key
    assert rows[0]["actor/grad_norm"] > 0
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert (tmp_path / "final" / "model.safetensors").exists()
    assert (tmp_path / "completions.jsonl").read_text().strip()
    assert last["actor/ratio"] == pytest.approx(1.0, abs=1e-6)  # μ = 1: on-policy


def test_same_seed_same_first_step(tmp_path, tiny, toy_task):
    a = make_trainer(tmp_path / "a", tiny, toy_task, "max_steps=1").train()
    b = make_trainer(tmp_path / "b", tiny, toy_task, "max_steps=1").train()
    for k in ("loss/total", "reward/mean", "actor/grad_norm", "actor/entropy"):
        assert a[k] == b[k], k
    c = make_trainer(tmp_path / "c", tiny, toy_task, "max_steps=1", "seed=1").train()
    assert (c["loss/total"], c["actor/entropy"]) != (a["loss/total"], a["actor/entropy"])


def test_completion_logprobs_match_full_forward(tiny, toy_task, tmp_path):
    tr = make_trainer(tmp_path, tiny, toy_task)
    batch, _ = tr.generate_batch()
    batch.logprob_temperature = torch.full((len(batch),), 0.7)
    logp, ent = completion_logprobs(tr.model, batch, pad_token_id=tr.pad_token_id, chunk_size=5)
    ids, attn, pos = build_inputs(batch, tr.pad_token_id)
    with torch.no_grad():
        full = torch.log_softmax(tr.model(input_ids=ids, attention_mask=attn).logits / 0.7, dim=-1)
    for i in range(len(batch)):
        for t in range(int(batch.completion_lengths[i])):
            want = full[i, pos[i, t], batch.completion_ids[i, t]]
            assert logp[i, t].item() == pytest.approx(want.item(), abs=1e-5)
    assert (logp[batch.completion_mask == 0] == 0).all()
    assert (ent[batch.completion_mask > 0] > 0).all()


def test_engine_logprobs_match_trainer(tiny, toy_task, tmp_path):
    """The sampler's behaviour log-probs agree with the trainer's forward (ρ ≡ 1 on-policy)."""
    tr = make_trainer(tmp_path, tiny, toy_task)
    batch, _ = tr.generate_batch()
    logp, _ = completion_logprobs(tr.model, batch, pad_token_id=tr.pad_token_id)
    m = batch.completion_mask > 0
    assert torch.allclose(logp[m], batch.sampler_logp[m], atol=1e-4)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_gradient_accumulation_equals_one_big_batch(tiny, toy_task, tmp_path, mode):
    tr = make_trainer(tmp_path, tiny, toy_task, f"loss_agg_mode={mode}")
    batch, _ = tr.generate_batch()
    batch.advantages = torch.linspace(-1, 1, len(batch))

    def grads(rows_per_micro):
        res = policy_update(tr.model, tr.optimizer, batch, tr.settings, pad_token_id=tr.pad_token_id,
                            rows_per_micro=rows_per_micro, step_optimizer=False)
        g = torch.cat([p.grad.flatten() for p in tr.model.parameters() if p.grad is not None])
        tr.optimizer.zero_grad(set_to_none=True)
        return g, res.metrics["loss/total"]

    g8, l8 = grads(8)
    for k in (1, 3):
        gk, lk = grads(k)
        assert lk == pytest.approx(l8, abs=1e-6)
        assert torch.allclose(gk, g8, atol=1e-6, rtol=1e-4)
    assert g8.abs().sum() > 0


def test_micro_batches_sorted_and_cut_to_own_width(tiny, toy_task, tmp_path):
    tr = make_trainer(tmp_path, tiny, toy_task)
    batch, _ = tr.generate_batch()
    groups = micro_batches(batch, 3, keep_groups=False)  # grouping: tests/trainer/test_shared_prompt.py
    assert sorted(i for g in groups for i in g) == list(range(len(batch)))
    totals = [len(batch.context_ids[i]) + int(batch.completion_lengths[i]) for g in groups for i in g]
    assert totals == sorted(totals, reverse=True)
    for g in groups:
        sub = batch.select(g)
        assert sub.completion_ids.shape[1] == max(1, int(batch.completion_lengths[g].max()))


def test_multi_update_schedule_ratio_one_at_first_update(tmp_path, tiny, toy_task):
    tr = make_trainer(tmp_path, tiny, toy_task, "steps_per_generation=2", "num_iterations=2", "max_steps=4")
    seen = []
    tr.callbacks.append(lambda t, m: seen.append(m))
    tr.train()
    assert tr.generation_round == 1  # 2 × 2 = 4 updates from one generation batch
    assert seen[0]["actor/ratio/min"] == pytest.approx(1.0, abs=1e-5)
    assert seen[0]["actor/ratio/max"] == pytest.approx(1.0, abs=1e-5)
    assert seen[-1]["staleness/max"] >= 1
    assert max(abs(m["actor/ratio/max"] - 1) for m in seen[1:]) > 0


def test_beta_zero_has_no_reference_model(tmp_path, tiny, toy_task):
    assert make_trainer(tmp_path, tiny, toy_task).ref_model is None
    tr = make_trainer(tmp_path, tiny, toy_task, "beta=0.1")
    assert tr.ref_model is not None and not any(p.requires_grad for p in tr.ref_model.parameters())
    last = tr.train()
    assert last["actor/kl"] >= 0


def test_dynamic_sampling_trains_exactly_p_informative_groups(tmp_path, tiny):
    from rlvr.testing import ToyTask

    class HalfConstant(ToyTask):
        def verify(self, problem, completion):
            from rlvr.tasks.base import Verdict

            if int(problem.uid.split("-")[1]) % 2 == 0:
                return Verdict(score=1.0, correct=True)  # constant group: no signal
            return super().verify(problem, completion)

    tr = make_trainer(tmp_path, tiny, HalfConstant(), "dynamic_sampling.enable=true", "generation_batch_size=16",
                      "num_generations=4")
    tr.loader.next(0)
    batch, metrics = tr.generate_batch()
    gids = batch.group_id.unique()
    assert len(gids) <= 4
    assert metrics["dynamic_sampling/num_gen_batches"] >= 2
    for g in gids:
        r = batch.rewards[batch.group_id == g]
        assert r.std() > 0


def test_reward_fn_exception_scores_zero_and_counts(tmp_path, tiny):
    from rlvr.testing import ToyTask

    task = ToyTask(fail_on={f"train-{i}" for i in range(16)})
    tr = make_trainer(tmp_path, tiny, task, "max_steps=1")
    last = tr.train()
    assert last["reward/verifier_errors"] == 8
    assert last["reward/mean"] == 0.0


def test_optimizer_is_fused_on_cpu_and_matches_the_default_update(tiny, tmp_path):
    from rlvr.trainer.optim import build_optimizer

    factory, _ = tiny
    cfg = small_config(tmp_path, "weight_decay=0.01")
    m1, m2 = factory(0), factory(0)
    for a, b in zip(m1.parameters(), m2.parameters()):
        a.grad = torch.randn_like(a)
        b.grad = a.grad.clone()
    opt = build_optimizer(m1.parameters(), cfg)
    assert opt.param_groups[0]["fused"] is True
    ref = torch.optim.AdamW(list(m2.parameters()), lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
                            eps=cfg.adam_epsilon, weight_decay=cfg.weight_decay)
    for _ in range(3):
        opt.step()
        ref.step()
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    assert any(not torch.equal(a, c) for a, c in zip(m1.parameters(), factory(0).parameters()))

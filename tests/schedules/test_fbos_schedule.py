"""FBOS-RL schedule on the tiny model: EPA gradient from rescued prompts (and none without FAP rollouts),
context separation, ratios at θ_old, alternate/joint combination, budget and update parity, and the
§4 metrics at every step (spec §2.9, §7.1–§7.5)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlvr.testing import ToyTask, small_config
from rlvr.core.fbos import view_advantages
from rlvr.samplers.feedback import KIND_FEEDBACK, KIND_ORIGINAL, KIND_ORIGINAL_OFFPOLICY, build_fap_text
from rlvr.tasks.base import Problem, Verdict
from rlvr.tasks.feedback import make_feedback
from rlvr.tasks.prompts import render_prompt
from rlvr.schedules import OptimizerStep
from rlvr.trainer.trainer import Trainer
from rlvr.trainer.update import policy_update
from rlvr.types import Generation

MARK = "<previous_attempt>"


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: oversubscribed threads make the tiny model far slower on the shared CPU."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

FBOS = ["sampler=feedback", "schedule=fbos", "adv_estimator=fbos", "reward_timeout_s=0"]


class AddTask:
    name = "add"
    system_prompt = "Answer with a number."

    def problems(self, split):
        return [Problem(uid=f"{split}-{i}", question=f"What is {i} + 4?", answer=str(i + 4)) for i in range(4)]

    def verify(self, problem, completion):
        got = completion.strip()
        ok = got == problem.answer
        return Verdict(score=float(ok), correct=ok, feedback=make_feedback(got or None, "boxed" if got else "none", ok))


class ScriptedEngine:
    """Initial rollouts all fail; the first FAP child of every call is correct, the others fail."""

    def __init__(self, tok):
        self.tok = tok
        self.eos_token_ids = {tok.eos_token_id}

    def generate(self, requests, params):
        out, first = [], True
        for r in requests:
            ctx = self.tok.decode(r.context_ids)
            gens = []
            for _ in range(r.n):
                if MARK in ctx and first:
                    text, first = ctx.split("What is ")[1].split(" + 4")[0], False
                    text = str(int(text) + 4)
                else:
                    text = "wrong answer here"
                ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
                gens.append(Generation(token_ids=ids, logprobs=[-1.0] * len(ids), finish_reason="eos"))
            out.append(gens)
        return out


def scripted_trainer(tmp_path, tiny, *overrides):
    factory, tok = tiny
    cfg = small_config(tmp_path, *FBOS, "num_generations=8", "generation_batch_size=8",
                       "per_device_train_batch_size=8", *overrides)
    return Trainer(cfg, factory(0), tok, AddTask(), engine=ScriptedEngine(tok))


def grads_of(tr, step):
    res = policy_update(tr.model, tr.optimizer, step.batch, step.loss_settings or tr.settings,
                        pad_token_id=tr.pad_token_id, rows_per_micro=3, step_optimizer=False, max_grad_norm=None,
                        loss_inputs=step.loss_inputs)
    g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in tr.model.parameters()])
    tr.optimizer.zero_grad(set_to_none=True)
    return g, res.metrics


def test_rescued_prompt_gives_epa_gradient_and_none_without_fap_rollouts(tmp_path, tiny):
    tr = scripted_trainer(tmp_path, tiny)
    batch, metrics = tr.generate_batch()
    assert metrics["fbos/rescued_frac"] == 1.0 and metrics["fbos/pass_rate_initial"] == 0.0
    epa, ecc = tr.schedule.plan(batch, tr.plan_ctx)
    assert (epa.phase, ecc.phase) == ("epa", "ecc")
    g, m = grads_of(tr, epa)
    assert g.abs().sum() > 0 and m["actor/grad_norm"] > 0

    def epa_step(b):
        return OptimizerStep(b, loss_settings=epa.loss_settings, loss_inputs=tr.schedule.loss_inputs(b))

    only_z = epa.batch.select([i for i, k in enumerate(epa.batch.context_kind) if k != KIND_ORIGINAL])
    gz, _ = grads_of(tr, epa_step(only_z))  # the feedback-guided rows alone: gradient through log π_θ(z | x)
    assert gz.abs().sum() > 0
    # control: the same prompt without its feedback-guided rollouts → zero-variance group → zero gradient
    keep = [i for i, k in enumerate(epa.batch.context_kind) if k == KIND_ORIGINAL]
    ctrl = epa.batch.select(keep)
    ctrl.advantages = view_advantages(ctrl.rewards, ctrl.group_id, torch.ones(len(ctrl), dtype=torch.bool))
    g0, m0 = grads_of(tr, epa_step(ctrl))
    assert (ctrl.advantages == 0).all() and torch.count_nonzero(g0) == 0 and m0["actor/grad_norm"] == 0


def test_feedback_text_changes_ecc_loss_but_not_epa_loss(tmp_path, tiny):
    tr = scripted_trainer(tmp_path, tiny)
    batch, _ = tr.generate_batch()
    assert batch.old_logp is not None  # prepared: old_logp of both views (sampling-time contexts)
    prob = batch.problems[0]

    def with_feedback(text):
        b = batch.select(range(len(batch)))
        for i, k in enumerate(b.context_kind):
            if k == KIND_FEEDBACK:
                fap = build_fap_text(prob.question, "wrong answer here", text)
                msgs = [{"role": "system", "content": tr.encoder.system_prompt}, {"role": "user", "content": fap}]
                b.context_ids[i] = tr.tokenizer(render_prompt(tr.tokenizer, msgs), add_special_tokens=False)["input_ids"]
        epa = b.select([i for i, k in enumerate(b.context_kind) if k != KIND_FEEDBACK])
        epa = OptimizerStep(epa, loss_settings=dataclasses.replace(tr.settings, policy_loss="fbos_epa"),
                            loss_inputs=tr.schedule.loss_inputs(epa))
        ecc = OptimizerStep(b.select([i for i, k in enumerate(b.context_kind) if k == KIND_FEEDBACK]))
        return grads_of(tr, epa), grads_of(tr, ecc)

    (ga, ma), (gc, mc) = with_feedback("Your final answer is incorrect.")
    (ga2, ma2), (gc2, mc2) = with_feedback("Totally different checker text, much longer than before.")
    assert torch.equal(ga, ga2) and ma["loss/policy"] == ma2["loss/policy"]
    assert mc["loss/policy"] != pytest.approx(mc2["loss/policy"], abs=1e-7)
    assert not torch.allclose(gc, gc2)


def test_ratio_is_one_at_theta_old_for_initial_and_ecc_tokens(tmp_path, tiny):
    tr = scripted_trainer(tmp_path, tiny)
    batch, _ = tr.generate_batch()
    epa, ecc = tr.schedule.plan(batch, tr.plan_ctx)
    for ob in (epa, ecc):
        _, m = grads_of(tr, ob)
        assert m["actor/ratio/min"] == pytest.approx(1.0, abs=1e-4)
        assert m["actor/ratio/max"] == pytest.approx(1.0, abs=1e-4)
        assert m["actor/clip_ratio/region"] == 0.0
    w = epa.metrics["fbos/offpolicy_weight_mean"]
    off = torch.tensor([k != KIND_ORIGINAL for k in epa.batch.context_kind])
    p = batch.old_logp[: len(epa)].exp()  # EPA rows come first in the batch
    want = ((p / (p + 0.1)) * batch.completion_mask[: len(epa)])[off].sum() / batch.completion_mask[: len(epa)][off].sum()
    assert w == pytest.approx(float(want), rel=1e-5)


def test_joint_gradient_is_sum_of_epa_and_ecc_gradients(tmp_path, tiny):
    tr = scripted_trainer(tmp_path, tiny)
    batch, _ = tr.generate_batch()
    epa, ecc = tr.schedule.plan(batch, tr.plan_ctx)
    g_epa, m_epa = grads_of(tr, epa)
    g_ecc, m_ecc = grads_of(tr, ecc)
    tr.cfg.fbos.combine_mode = "joint"
    (joint,) = tr.schedule.plan(batch, tr.plan_ctx)
    assert joint.phase == "joint" and joint.metrics["fbos/optimizer_steps_per_step"] == 1
    g_joint, m_joint = grads_of(tr, joint)
    assert torch.allclose(g_joint, g_epa + g_ecc, atol=1e-6, rtol=1e-4)
    assert m_joint["loss/policy"] == pytest.approx(m_epa["loss/policy"] + m_ecc["loss/policy"], abs=1e-6)
    um = joint.metrics
    assert um["loss/epa"] == pytest.approx(m_epa["loss/policy"], abs=1e-6)
    assert um["loss/ecc"] == pytest.approx(m_ecc["loss/policy"], abs=1e-6)


SPEC_METRICS = [  # spec §4 → rlvr names (grad_norm/<view> is logged by the trainer as <view>/actor/grad_norm)
    "entropy/x_initial", "epa/actor/grad_norm", "ecc/actor/grad_norm", "fbos/fap_success_rate",
    "fbos/rescued_frac", "fbos/zero_adv_frac_before", "fbos/zero_adv_frac_after", "fbos/triggered_frac",
    "fbos/offpolicy_weight_mean", "fbos/meta_ref_frac", "fbos/optimizer_steps_per_step", "loss/epa", "loss/ecc",
    "fbos/tokens_generated/initial", "fbos/tokens_generated/feedback", "fbos/fap_prompt_tokens",
]


def test_alternate_takes_two_updates_per_step_and_logs_every_spec_metric(tmp_path, tiny):
    factory, tok = tiny
    cfg = small_config(tmp_path, *FBOS, "max_steps=4")  # G = 4 (2 + 2), 2 prompts per step
    tr = Trainer(cfg, factory(0), tok, ToyTask())
    seen = []
    tr.callbacks.append(lambda t, m: seen.append(dict(m)))
    tr.train()
    assert tr.global_step == 4 and tr.generation_round == 2  # 2 optimizer steps per training step
    phases = [next(k.split("/")[0] for k in m if k.endswith("actor/grad_norm")) for m in seen]
    assert phases == ["epa", "ecc", "epa", "ecc"]
    for step in range(2):
        merged = {**seen[2 * step], **seen[2 * step + 1]}
        missing = [k for k in SPEC_METRICS if k not in merged]
        assert not missing, missing
        assert merged["fbos/optimizer_steps_per_step"] == 2
        assert merged["fbos/sequences_per_prompt"] == 4 and merged["fbos/sequences_per_prompt_min"] == 4


def test_grpo_equal_updates_control_and_update_order(tmp_path, tiny):
    factory, tok = tiny
    tr = Trainer(small_config(tmp_path / "g", "steps_per_generation=2", "max_steps=2", "reward_timeout_s=0"),
                 factory(0), tok, ToyTask())
    tr.train()
    assert tr.global_step == 2 and tr.generation_round == 1  # GRPO control: 2 optimizer steps per training step
    tr = Trainer(small_config(tmp_path / "e", *FBOS, "max_steps=2", "fbos.update_order=ecc_first"),
                 factory(0), tok, ToyTask())
    seen = []
    tr.callbacks.append(lambda t, m: seen.append(m))
    tr.train()
    assert [next(k.split("/")[0] for k in m if k.endswith("actor/grad_norm")) for m in seen] == ["ecc", "epa"]
    assert seen[0]["ecc/actor/ratio/max"] == pytest.approx(1.0, abs=1e-4)  # ECC first: at θ_old


def test_resume_between_epa_and_ecc_continues_identically(tmp_path, tiny):
    from rlvr.trainer.checkpoint import load_checkpoint

    factory, tok = tiny
    over = [*FBOS, "max_steps=4", "save_steps=1"]
    ref = Trainer(small_config(tmp_path / "ref", *over), factory(0), tok, ToyTask())
    seen_ref = []
    ref.callbacks.append(lambda t, m: seen_ref.append(m))
    ref.train()
    res = Trainer(small_config(tmp_path / "ref", *over), factory(0), tok, ToyTask())
    load_checkpoint(res, tmp_path / "ref" / "checkpoint-1")  # EPA done, ECC of round 1 pending
    seen = []
    res.callbacks.append(lambda t, m: seen.append(m))
    res.train()
    assert len(seen) == 3
    for a, b in zip(seen_ref[1:], seen):
        for k in ("loss/total", "actor/grad_norm"):
            key = next(x for x in a if x.endswith(k))
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    for p, q in zip(ref.model.parameters(), res.model.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


def test_generic_reward_metrics_count_each_generated_sequence_once(tmp_path, tiny):
    """One prompt, G = 8: 4 initial rollouts fail, 4 FAP rollouts of which the engine makes 1 correct.
    The batch holds 12 rows (the FAP rollouts twice, once per view); reward/* sees the 8 generated."""
    tr = scripted_trainer(tmp_path, tiny)
    batch, metrics = tr.generate_batch()
    assert len(batch.context_kind) == 12 and batch.context_kind.count(KIND_FEEDBACK) == 4
    assert metrics["reward/pass_rate"] == pytest.approx(1 / 8)
    assert metrics["reward/mean"] == pytest.approx(1 / 8)


def test_positive_only_epa_view_drops_negative_feedback_guided_rows(tmp_path, tiny):
    """``fbos.epa_fb_positive_only``: the EPA step keeps only the feedback-guided rows with Â > 0 (the
    schedule applies it; the ECC view keeps every FAP rollout)."""
    tr = scripted_trainer(tmp_path, tiny, "fbos.epa_fb_positive_only=true")
    batch, _ = tr.generate_batch()
    off = [i for i, k in enumerate(batch.context_kind) if k == KIND_ORIGINAL_OFFPOLICY]
    assert any(batch.advantages[i] < 0 for i in off)  # something to drop
    epa, ecc = tr.schedule.plan(batch, tr.plan_ctx)
    kept = [float(a) for a, k in zip(epa.batch.advantages, epa.batch.context_kind) if k == KIND_ORIGINAL_OFFPOLICY]
    assert kept and all(a > 0 for a in kept)
    assert len(ecc) == sum(k == KIND_FEEDBACK for k in batch.context_kind)


def test_primary_phase_names_the_update_on_the_original_prompt(tmp_path):
    from rlvr.schedules.fbos import AlternatingViews

    assert AlternatingViews(small_config(tmp_path, *FBOS)).primary_phase == "epa"
    assert AlternatingViews(small_config(tmp_path, *FBOS, "fbos.combine_mode=joint")).primary_phase == "joint"

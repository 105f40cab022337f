"""FBOS-RL schedule on the tiny model: EPA gradient from rescued prompts (and none without FAP rollouts),
context separation, ratios at θ_old, alternate/joint combination, budget and update parity, and the
§4 metrics at every step (spec §2.9, §7.1–§7.5); an ECC phase without signal is skipped (no zero-gradient
AdamW step), the same way on every rank, and resume stays exact."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlvr.testing import ToyTask, small_config
from rlvr.core.fbos import view_advantages
from rlvr.types import KIND_FEEDBACK, KIND_ORIGINAL, KIND_ORIGINAL_OFFPOLICY
from rlvr.variants.fbos_rl.fap import build_fap_text
from rlvr.tasks.prompts import render_prompt
from rlvr.schedules import OptimizerStep
from rlvr.trainer.trainer import Trainer
from rlvr.trainer.update import policy_update

from fbos_fixtures import MARK, AddTask, ScriptedEngine, answer_in, first_fap_correct


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: oversubscribed threads make the tiny model far slower on the shared CPU."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

FBOS = ["sampler=feedback", "schedule=fbos", "adv_estimator=fbos", "reward_timeout_s=0"]


def scripted_trainer(tmp_path, tiny, *overrides, script=None):
    """One prompt of :class:`AddTask` per round, G = 8 (4 initial + 4 FAP rollouts). Default script: the
    initial rollouts all fail, the first FAP child of every round is correct, the others fail."""
    factory, tok = tiny
    cfg = small_config(tmp_path, *FBOS, "num_generations=8", "generation_batch_size=8",
                       "per_device_train_batch_size=8", *overrides)
    script = script or first_fap_correct(wrong="wrong answer here")
    return Trainer(cfg, factory(0), tok, AddTask(n=4), engine=ScriptedEngine(tok, script, logprob=-1.0))


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
    # the scripted rounds always give the ECC phase signal (one FAP child passes): with none it is
    # skipped (test_ecc_step_without_signal_is_skipped_and_logged)
    tr = scripted_trainer(tmp_path, tiny, "max_steps=4")
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
        assert merged["fbos/sequences_per_prompt"] == 8 and merged["fbos/sequences_per_prompt_min"] == 8
        assert merged["fbos/ecc_skipped"] == 0


def test_grpo_equal_updates_control_and_update_order(tmp_path, tiny):
    factory, tok = tiny
    tr = Trainer(small_config(tmp_path / "g", "steps_per_generation=2", "max_steps=2", "reward_timeout_s=0"),
                 factory(0), tok, ToyTask())
    tr.train()
    assert tr.global_step == 2 and tr.generation_round == 1  # GRPO control: 2 optimizer steps per training step
    tr = scripted_trainer(tmp_path / "e", tiny, "max_steps=2", "fbos.update_order=ecc_first")
    seen = []
    tr.callbacks.append(lambda t, m: seen.append(m))
    tr.train()
    assert [next(k.split("/")[0] for k in m if k.endswith("actor/grad_norm")) for m in seen] == ["ecc", "epa"]
    assert seen[0]["ecc/actor/ratio/max"] == pytest.approx(1.0, abs=1e-4)  # ECC first: at θ_old


def test_resume_between_epa_and_ecc_continues_identically(tmp_path, tiny):
    from rlvr.trainer.checkpoint import load_checkpoint

    over = ["max_steps=4", "save_steps=1"]
    ref = scripted_trainer(tmp_path / "ref", tiny, *over)
    seen_ref = []
    ref.callbacks.append(lambda t, m: seen_ref.append(m))
    ref.train()
    assert phases(seen_ref) == ["epa", "ecc", "epa", "ecc"]
    res = scripted_trainer(tmp_path / "ref", tiny, *over)
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
    from rlvr.variants.fbos_rl.schedule import AlternatingViews

    assert AlternatingViews(small_config(tmp_path, *FBOS)).primary_phase == "epa"
    assert AlternatingViews(small_config(tmp_path, *FBOS, "fbos.combine_mode=joint")).primary_phase == "joint"


# ----------------------------------------------------------------------------- ECC phase without signal
WRONG = "wrong answer here"


def ecc_without_signal(ctx, k):
    """The first initial rollout of a round is correct (the EPA union group varies: 1 of 8), every FAP
    rollout fails: the ECC group's rewards are all 0, so are its advantages."""
    return WRONG if MARK in ctx or k > 0 else answer_in(ctx)


def ecc_signal_on_even_answers(ctx, k):
    """As :func:`ecc_without_signal`, but for the problems with an even answer (4 + 0, 4 + 2) the first FAP
    child is correct too: their rounds have an ECC step, the others none (stateless, so a resumed run's
    fresh engine continues the script)."""
    ans = answer_in(ctx)
    if MARK in ctx:
        return ans if k == 0 and int(ans) % 2 == 0 else WRONG
    return ans if k == 0 else WRONG


def phases(rows):
    return [next(k.split("/")[0] for k in m if k.endswith("actor/grad_norm")) for m in rows]


def test_ecc_step_without_signal_is_skipped_and_logged(tmp_path, tiny):
    tr = scripted_trainer(tmp_path, tiny, script=ecc_without_signal)
    batch, _ = tr.generate_batch()
    ecc_rows = [i for i, k in enumerate(batch.context_kind) if k == KIND_FEEDBACK]
    assert len(ecc_rows) == 4 and (batch.advantages[ecc_rows] == 0).all()  # FAP rows, but no signal
    (epa,) = tr.schedule.plan(batch, tr.plan_ctx)
    assert epa.phase == "epa" and (epa.batch.advantages != 0).any()
    assert epa.metrics["fbos/ecc_skipped"] == 1.0 and epa.metrics["fbos/optimizer_steps_per_step"] == 1
    assert epa.metrics["fbos/ecc_rows"] == 4
    # why: after the EPA update, AdamW moves the weights on the zero-gradient ECC batch (momentum)
    tr._update(epa)
    before = [p.detach().clone() for p in tr.model.parameters()]
    g, _ = grads_of(tr, OptimizerStep(batch.select(ecc_rows)))
    assert torch.count_nonzero(g) == 0
    tr._update(OptimizerStep(batch.select(ecc_rows)))
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))
    # a KL or entropy term is signal even at zero advantages: the ECC step stays
    tr.cfg.entropy_coef = 0.01
    s = dataclasses.replace(tr.settings, entropy_coef=0.01)
    ctx = type("Ctx", (), {"settings": s, "logprobs": tr.plan_ctx.logprobs, "any_rank": tr.plan_ctx.any_rank})()
    assert [st.phase for st in tr.schedule.plan(batch, ctx)] == ["epa", "ecc"]


def test_weights_are_untouched_by_an_ecc_phase_without_signal(tmp_path, tiny):
    """Two rounds whose ECC phase has no signal: only the EPA updates run, so the ECC-first order (whose
    first step would be the zero-gradient ECC one) ends with bit-identical weights to EPA-first."""
    runs = {}
    for order in ("epa_first", "ecc_first"):
        tr = scripted_trainer(tmp_path / order, tiny, "max_steps=2", f"fbos.update_order={order}",
                              script=ecc_without_signal)
        rows = []
        tr.callbacks.append(lambda t, m: rows.append(dict(m)))
        tr.train()
        assert phases(rows) == ["epa", "epa"] and tr.generation_round == 2
        assert [m["fbos/ecc_skipped"] for m in rows] == [1.0, 1.0]
        runs[order] = [p.detach().clone() for p in tr.model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(runs["epa_first"], runs["ecc_first"]))


def test_ecc_step_with_signal_is_unchanged(tmp_path, tiny):
    tr = scripted_trainer(tmp_path, tiny)  # the first FAP child is correct: the ECC group varies
    batch, _ = tr.generate_batch()
    epa, ecc = tr.schedule.plan(batch, tr.plan_ctx)
    assert (epa.phase, ecc.phase) == ("epa", "ecc") and len(ecc) == 4
    assert epa.metrics["fbos/ecc_skipped"] == 0.0 and epa.metrics["fbos/optimizer_steps_per_step"] == 2


def test_ecc_decision_is_the_jobs_so_every_rank_plans_the_same_steps(tmp_path, tiny):
    """Under torchrun another rank may have ECC signal: this rank then takes the ECC step too, in its
    place in the order, with zero-advantage rows or none at all (no FAP rollout here)."""
    class OtherRankHasSignal:
        def __init__(self, ctx):
            self.settings, self.logprobs = ctx.settings, ctx.logprobs

        def any_rank(self, flag):
            return True

    tr = scripted_trainer(tmp_path, tiny, "fbos.update_order=ecc_first",
                          script=lambda ctx, k: answer_in(ctx))  # every initial rollout passes: no FAP rows
    batch, _ = tr.generate_batch()
    assert KIND_FEEDBACK not in batch.context_kind
    (epa,) = tr.schedule.plan(batch, tr.plan_ctx)
    assert epa.metrics["fbos/ecc_skipped"] == 1.0
    ecc, epa = tr.schedule.plan(batch, OtherRankHasSignal(tr.plan_ctx))
    assert (ecc.phase, len(ecc), epa.phase) == ("ecc", 0, "epa")
    assert ecc.metrics["fbos/ecc_skipped"] == 0.0 and ecc.metrics["fbos/optimizer_steps_per_step"] == 2


def test_resume_across_rounds_with_and_without_ecc_is_exact(tmp_path, tiny):
    from rlvr.trainer.checkpoint import load_checkpoint

    over = ["max_steps=6", "save_steps=1"]
    ref = scripted_trainer(tmp_path / "ref", tiny, *over, script=ecc_signal_on_even_answers)
    seen_ref = []
    ref.callbacks.append(lambda t, m: seen_ref.append(dict(m)))
    ref.train()
    skipped = [m["fbos/ecc_skipped"] for m in seen_ref if "fbos/ecc_skipped" in m]
    assert 0.0 in skipped and 1.0 in skipped  # both kinds of round
    assert ref.generation_round == 4 and sorted(phases(seen_ref)) == ["ecc"] * 2 + ["epa"] * 4
    for k in (1, 3):  # steps: epa ecc | epa | epa | epa ecc -> between EPA and ECC, and after a skipped round
        res = scripted_trainer(tmp_path / "ref", tiny, *over, script=ecc_signal_on_even_answers)
        load_checkpoint(res, tmp_path / "ref" / f"checkpoint-{k}")
        seen = []
        res.callbacks.append(lambda t, m: seen.append(dict(m)))
        res.train()
        assert phases(seen) == phases(seen_ref)[k:], k
        for a, b in zip(seen_ref[k:], seen):
            for key in [x for x in a if x.endswith(("loss/total", "actor/grad_norm")) or x == "fbos/ecc_skipped"]:
                assert b[key] == a[key], (k, key)
        assert all(torch.equal(p, q) for p, q in zip(ref.model.parameters(), res.model.parameters())), k

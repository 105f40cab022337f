"""FBOS-RL feedback sampler with a scripted engine (no model): trigger policy, FAP construction,
round-robin parents, budget parity, the two views of the same tokens (spec §2.2–§2.6, §7.1, §7.2, §7.4)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlvr.core.advantages import grpo_advantages
from rlvr.rewards import Scorer
from rlvr.samplers.group import PromptEncoder
from rlvr.types import KIND_FEEDBACK, KIND_ORIGINAL, KIND_ORIGINAL_OFFPOLICY, SamplingParams
from rlvr.parts import AdvantageContext
from rlvr.variants.fbos_rl.config import FBOSConfig
from rlvr.variants.fbos_rl.estimator import fbos_advantages
from rlvr.variants.fbos_rl.fap import build_fap_text, feedback_for_level, round_robin_parents
from rlvr.variants.fbos_rl.sampler import FeedbackSampler

from fbos_fixtures import MARK, AddTask, ScriptedEngine, first_fap_correct


def make_sampler(tok, script, **fbos):
    task = AddTask()
    engine = ScriptedEngine(tok, script)
    enc = PromptEncoder(tok, task.system_prompt, 256)
    s = FeedbackSampler(engine, enc, Scorer(task, tok), tok, tok.pad_token_id, FBOSConfig(**fbos),
                        max_prompt_length=256)
    sample = s.sample

    def sample_with_advantages(*a, **k):  # the trainer runs the fbos estimator on what the sampler returns
        b = sample(*a, **k)
        cfg = SimpleNamespace(scale_rewards="group", adv_eps=1e-6, adv_std_unbiased=True)
        b.advantages, _ = fbos_advantages(b, AdvantageContext(cfg, config=s.cfg))
        return b

    s.sample = sample_with_advantages
    return s, engine, task


def fap_requests(engine):
    return [r for r in engine.requests if MARK in engine.tok.decode(r.context_ids)]


def test_zero_success_prompt_is_rescued_by_exactly_g2_fap_rollouts(tiny):
    _, tok = tiny
    s, engine, task = make_sampler(tok, first_fap_correct("4"))  # problem 0: 0 + 4
    b = s.sample(task.problems("train")[:1], 8, SamplingParams(max_new_tokens=16))
    assert sum(r.n for r in fap_requests(engine)) == 4  # G2 FAP-conditioned generations
    kinds = b.context_kind
    assert kinds.count(KIND_ORIGINAL) == 4 and kinds.count(KIND_ORIGINAL_OFFPOLICY) == 4
    assert kinds.count(KIND_FEEDBACK) == 4
    epa = torch.tensor([k != KIND_FEEDBACK for k in kinds])
    r_union = b.rewards[epa]
    assert r_union.tolist() == [0, 0, 0, 0, 1, 0, 0, 0]
    assert torch.allclose(b.advantages[epa], grpo_advantages(r_union, b.group_id[epa]))
    assert (b.advantages[epa] != 0).all()
    assert b.metrics["fbos/rescued_frac"] == 1.0
    assert b.metrics["fbos/zero_adv_frac_before"] == 1.0
    assert b.metrics["fbos/zero_adv_frac_after"] == 0.0
    ecc = ~epa
    assert torch.allclose(b.advantages[ecc], grpo_advantages(b.rewards[ecc], b.group_id[ecc]))
    assert len(set(b.group_id[ecc].tolist()) & set(b.group_id[epa].tolist())) == 0


def test_two_views_share_tokens_but_not_contexts(tiny):
    _, tok = tiny
    s, engine, task = make_sampler(tok, first_fap_correct("4"))
    prob = task.problems("train")[0]
    b = s.sample([prob], 8, SamplingParams())
    x = s.encoder(prob)
    off = [i for i, k in enumerate(b.context_kind) if k == KIND_ORIGINAL_OFFPOLICY]
    ecc = [i for i, k in enumerate(b.context_kind) if k == KIND_FEEDBACK]
    for i, j in zip(off, ecc):
        assert b.context_ids[i] == x  # EPA: x ⊕ z, no FAP tokens
        assert MARK not in tok.decode(b.context_ids[i]) and "incorrect" not in tok.decode(b.context_ids[i])
        fap = tok.decode(b.context_ids[j])
        assert MARK in fap and "Your final answer `wrong 99` is incorrect." in fap
        assert prob.question in fap and "Feedback from the automatic checker:" in fap
        assert torch.equal(b.completion_ids[i], b.completion_ids[j])
        assert torch.equal(b.completion_mask[i], b.completion_mask[j])  # loss mask = exactly the z tokens
        assert int(b.completion_mask[i].sum()) == len(engine.tok("wrong 99", add_special_tokens=False)["input_ids"]) + 1 \
            or int(b.completion_mask[i].sum()) == len(engine.tok("4", add_special_tokens=False)["input_ids"]) + 1


@pytest.mark.parametrize("trigger", ["any_fail", "all_fail"])
def test_trigger_policy_and_budget_parity(tiny, trigger):
    _, tok = tiny
    # prompt 0 (answer 4): 1 of 4 initial correct; prompt 1 (answer 5): all fail; prompt 2 (6): all correct
    answers = {"What is 0 + 4?": ["4", "x", "x", "x"], "What is 1 + 4?": ["x"] * 4, "What is 2 + 4?": ["6"] * 4}
    calls = {}

    def script(ctx, k):
        for q, outs in answers.items():
            if q in ctx and MARK not in ctx:
                i = calls.get(q, 0)
                calls[q] = i + 1
                return outs[i % 4] if i < 4 else "fill"
        return "fap"

    s, engine, task = make_sampler(tok, script, trigger=trigger)
    b = s.sample(task.problems("train")[:3], 8, SamplingParams())
    m = b.metrics
    assert m["fbos/sequences_per_prompt"] == 8 and m["fbos/sequences_per_prompt_min"] == 8
    gen_per_prompt = [0, 0, 0]
    for r in engine.requests:
        for p, q in enumerate(answers):
            if q in tok.decode(r.context_ids):
                gen_per_prompt[p] += r.n
    assert gen_per_prompt == [8, 8, 8]  # exactly G generated sequences per prompt
    kinds_of = lambda p: [k for k, pi in zip(b.context_kind, b.prompt_index.tolist()) if pi == p]  # noqa: E731
    assert kinds_of(1).count(KIND_FEEDBACK) == 4  # all-fail prompts always get G2 FAP rollouts
    assert kinds_of(2).count(KIND_FEEDBACK) == 0 and kinds_of(2).count(KIND_ORIGINAL) == 8  # plain fill
    if trigger == "any_fail":
        assert kinds_of(0).count(KIND_FEEDBACK) == 4 and m["fbos/triggered_frac"] == pytest.approx(2 / 3)
    else:
        assert kinds_of(0).count(KIND_FEEDBACK) == 0 and kinds_of(0).count(KIND_ORIGINAL) == 8
        assert m["fbos/triggered_frac"] == pytest.approx(1 / 3)


def test_round_robin_parents_and_shared_prefill_requests(tiny):
    assert round_robin_parents([3, 5, 7], 4) == [3, 5, 7, 3]
    with pytest.raises(ValueError):
        round_robin_parents([], 2)
    _, tok = tiny
    outs = iter(["4", "a", "b", "c"])

    def script(ctx, k):
        return next(outs, "z") if MARK not in ctx else "z"

    s, engine, task = make_sampler(tok, script)
    s.sample(task.problems("train")[:1], 8, SamplingParams())
    reqs = fap_requests(engine)
    assert [r.n for r in reqs] == [2, 1, 1]  # failures a, b, c; slot 4 goes back to a
    assert ["a", "b", "c"] == [tok.decode(r.context_ids).split(MARK)[1].split("</previous_attempt>")[0].strip()
                               for r in reqs]


def test_feedback_levels_never_leak_the_answer_by_default():
    fb = "The final answer was not in \\boxed{}. Your final answer `12` is incorrect."
    assert feedback_for_level("answer_wrong", fb, answer="7") == fb
    assert feedback_for_level("format", fb, answer="7") == "The final answer was not in \\boxed{}."
    assert "`12`" not in feedback_for_level("format", "Your final answer `12` is incorrect.")
    assert feedback_for_level("gt_hint", fb, answer="7").endswith("The correct final answer is `7`.")
    assert feedback_for_level("none", fb) is None
    assert feedback_for_level("answer_wrong", None) == "The final answer is incorrect."
    with_fb = build_fap_text("Q?", "my try", "bad")
    assert with_fb.startswith("Q?\n\nHere is a previous attempt at this problem:\n<previous_attempt>\nmy try\n")
    assert "Feedback from the automatic checker:\nbad\n" in with_fb and with_fb.endswith("in \\boxed{}.")
    assert "Feedback from the automatic checker" not in build_fap_text("Q?", "my try", None)


def test_fap_level_none_has_no_feedback_block_and_cap_truncates(tiny):
    _, tok = tiny
    long = " ".join(["step"] * 200)
    s, engine, task = make_sampler(tok, lambda ctx, k: long if MARK not in ctx else "z",
                                   feedback_level="none", prev_attempt_max_tokens=50)
    b = s.sample(task.problems("train")[:1], 4, SamplingParams())
    ctx = tok.decode(fap_requests(engine)[0].context_ids)
    assert "Feedback from the automatic checker" not in ctx
    attempt = ctx.split(MARK)[1].split("</previous_attempt>")[0]
    assert len(tok(attempt.strip(), add_special_tokens=False)["input_ids"]) <= 51
    s2, engine2, _ = make_sampler(tok, lambda ctx, k: long if MARK not in ctx else "z", fap_max_prompt_length=120)
    b2 = s2.sample(task.problems("train")[:1], 4, SamplingParams())
    assert all(len(r.context_ids) <= 120 for r in fap_requests(engine2))
    assert b2.metrics["fbos/fap_truncated"] >= 1
    assert b.metrics["fbos/fap_truncated"] == 0


def test_meta_reference_filter_initial_only_and_positive_only(tiny):
    _, tok = tiny

    def script(ctx, k):
        if MARK in ctx:
            return "4" if k % 2 == 0 else "as the previous attempt said"
        return "no"

    s, _, task = make_sampler(tok, script, epa_filter_meta_refs=True)
    b = s.sample(task.problems("train")[:1], 8, SamplingParams())
    assert b.context_kind.count(KIND_FEEDBACK) == 4  # ECC keeps all FAP rollouts
    off_texts = [t for t, k in zip(b.texts, b.context_kind) if k == KIND_ORIGINAL_OFFPOLICY]
    assert off_texts and all("previous attempt" not in t for t in off_texts)
    assert b.metrics["fbos/meta_ref_frac"] == 0.5
    s, _, _ = make_sampler(tok, script, epa_group="initial_only")
    b = s.sample(task.problems("train")[:1], 8, SamplingParams())
    assert KIND_ORIGINAL_OFFPOLICY not in b.context_kind and b.context_kind.count(KIND_FEEDBACK) == 4
    assert (b.advantages[:4] == 0).all()  # EPA = GRPO on the (all-fail) initial rollouts
    # epa_fb_positive_only is applied by the fbos schedule (tests/schedules/test_fbos_schedule.py)

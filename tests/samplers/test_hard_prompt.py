"""UEC-RL hard-prompt sampler and retention filter (docs/uec_rl.md §7.1, §7.2)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlvr.config import build_config
from rlvr.core.advantages import grpo_advantages
from rlvr.variants.uec_rl.sampler import EXPLORE_GROUP_OFFSET, HardPromptSampler
from rlvr.parts import ADV_ESTIMATORS, AdvantageContext, compute_advantages
from rlvr.types import Generation, SamplingParams
from rlvr.variants.uec_rl.retention import make_retention_filter

G, GX, T_EXP = 5, 20, 1.2


class StubEngine:
    """Sample ``j`` of a request is the single token ``100 + j``; records every call."""

    eos_token_ids = {2}

    def __init__(self, truncated=()):
        self.calls = []
        self.truncated = set(truncated)

    def generate(self, requests, params):
        self.calls.append((list(requests), params))
        return [
            [Generation([100 + j], [-1.0], "length" if (params.temperature != 1.0 and j in self.truncated) else "eos")
             for j in range(r.n)]
            for r in requests
        ]


class StubScorer:
    """Regular rows: prompt 0 passes 0/5, prompt 1 passes 1/5 (sample 0), prompt 2 passes 5/5, prompt 3 0/5.
    Exploration rows: prompt 0 passes on samples 2, 7, 11; prompt 3 never."""

    def score(self, batch):
        ok = []
        for i in range(len(batch)):
            p = int(batch.problems[int(batch.prompt_index[i])].uid)
            j = int(batch.completion_ids[i, 0]) - 100
            if float(batch.sampling_temperature[i]) == 1.0:
                ok.append(p == 2 or (p == 1 and j == 0))
            else:
                ok.append(p == 0 and j in (2, 7, 11))
        batch.correct = torch.tensor(ok)
        batch.rewards = batch.correct.float()
        batch.texts = [""] * len(batch)
        return SimpleNamespace(errors=0)


def _sampler(engine, **kw):
    encoder = lambda p: [1, 10 + int(p.uid)]  # noqa: E731 - context ids per problem
    return HardPromptSampler(engine, encoder, StubScorer(), 0, explore_num_generations=GX,
                             explore_temperature=T_EXP, **kw)


def _problems(n):
    return [SimpleNamespace(uid=str(i), question=f"q{i}", answer="1") for i in range(n)]


def test_extra_rollouts_exactly_and_only_for_zero_pass_prompts():
    eng = StubEngine()
    batch = _sampler(eng).sample(_problems(3), G, SamplingParams(max_new_tokens=4, seed=3), first_group_id=40)
    assert len(eng.calls) == 2
    reqs, params = eng.calls[1]
    assert [(list(r.context_ids), r.n) for r in reqs] == [([1, 10], GX)]  # only prompt 0 (pass rate 0)
    assert params.temperature == T_EXP and params.max_new_tokens == 4
    assert len(batch) == 3 * G + GX
    reg, exp = slice(0, 3 * G), slice(3 * G, None)
    assert batch.sampling_temperature[reg].eq(1.0).all() and batch.logprob_temperature[reg].eq(1.0).all()
    assert batch.sampling_temperature[exp].eq(T_EXP).all() and batch.logprob_temperature[exp].eq(1.0).all()
    assert batch.context_kind == ["regular"] * 15 + ["explore"] * GX
    assert batch.prompt_index[exp].eq(0).all() and batch.group_id[exp].eq(40 + EXPLORE_GROUP_OFFSET).all()
    assert batch.group_id[reg].tolist() == [40] * 5 + [41] * 5 + [42] * 5
    assert all(c == [1, 10] for c in batch.context_ids[15:])
    assert batch.variable_group_sizes is True
    m = batch.metrics
    assert m["uec/hard_prompt_frac"] == pytest.approx(1 / 3)
    assert m["uec/explore_rollouts"] == GX and m["uec/explore_solve_frac"] == 1.0
    assert m["uec/explore_pass_rate"] == pytest.approx(3 / 20)


def test_no_hard_prompt_no_exploration_call():
    eng = StubEngine()
    batch = _sampler(eng).sample(_problems(3)[1:], G, SamplingParams(max_new_tokens=4))
    assert len(eng.calls) == 1 and len(batch) == 2 * G
    assert batch.metrics["uec/explore_rollouts"] == 0
    eng0 = StubEngine()
    _sampler(eng0, hard_pass_rate_max=0.0).sample(_problems(1), G, SamplingParams(), first_group_id=0)
    assert len(eng0.calls) == 2
    eng1 = StubEngine()
    HardPromptSampler(eng1, lambda p: [1], StubScorer(), 0, explore_num_generations=0).sample(
        _problems(1), G, SamplingParams())
    assert len(eng1.calls) == 1  # G' = 0: the "no exploration" ablation


def _prepared(tmp_path, engine, problems, *overrides, **kw):
    cfg = build_config(overrides=[f"num_generations={G}", f"generation_batch_size={G * len(problems)}",
                                  f"logging.output_dir={tmp_path}", *overrides])
    batch = _sampler(engine, **kw).sample(problems, G, SamplingParams(max_new_tokens=4), first_group_id=0)
    compute_advantages(ADV_ESTIMATORS["grpo"], batch, AdvantageContext(cfg))
    return cfg, batch


def test_retention_and_advantages_wiring(tmp_path):
    probs = _problems(4)  # prompts 0 and 3 are hard; prompt 3's exploration group never succeeds
    cfg, batch = _prepared(tmp_path, StubEngine(truncated={11}), probs)
    exp0 = batch.group_id == EXPLORE_GROUP_OFFSET
    # exploration advantages = core GRPO on the G' group alone (unbiased std, adv_eps = 1e-6)
    want = grpo_advantages(batch.rewards[exp0], torch.zeros(GX, dtype=torch.long), adv_eps=1e-6)
    assert torch.equal(batch.advantages[exp0], want)
    out = make_retention_filter(cfg)(batch)
    kinds = out.context_kind
    assert (out.advantages != 0).all()
    assert all(float(a) > 0 for a, k in zip(out.advantages, kinds) if k == "explore")
    assert not (out.is_truncated & (out.advantages > 0)).any()
    assert not (out.group_id == EXPLORE_GROUP_OFFSET + 3).any()  # zero-success exploration group: nothing
    # retained: prompt 1's 5 regular rows (|Â| > 0.05) and exploration successes 2 and 7 (11 was truncated)
    assert sorted(int(c) - 100 for c, k in zip(out.completion_ids[:, 0], kinds) if k == "explore") == [2, 7]
    assert kinds.count("regular") == 5 and out.group_id[:5].eq(1).all()
    m = out.metrics
    assert (m["uec/retained_regular"], m["uec/retained_explore"], m["uec/dropped_truncated_positive"]) == (5, 2, 1)
    assert m["uec/hard_prompt_frac"] == 0.5  # sampler metrics are kept


def test_code_style_filters_and_pooled_grouping(tmp_path):
    cfg, batch = _prepared(tmp_path, StubEngine(), _problems(3), "uec.explore_filter=abs",
                           "uec.explore_adv_floor=0.3", "uec.regular_adv_floor=null")
    out = make_retention_filter(cfg)(batch)
    neg = [float(a) for a, k in zip(out.advantages, out.context_kind) if k == "explore" and a < 0]
    assert len(neg) == 17  # |Â| > 0.3 admits the 17 failures of a 3/20 group (Â ≈ −0.41)
    assert out.context_kind.count("regular") == 15  # floor None keeps all regular rows, zero-advantage too
    _, pooled = _prepared(tmp_path, StubEngine(), _problems(3), explore_adv_grouping="pooled")
    assert pooled.group_id[15:].eq(0).all()
    g0 = pooled.group_id == 0  # 5 failures + 20 exploration rows in one group of 25
    assert torch.allclose(pooled.advantages[g0], grpo_advantages(pooled.rewards[g0], torch.zeros(25, dtype=torch.long)))


def test_exploration_logprobs_at_temperature_one(tiny, toy_task):
    """Sampled at t′ (behaviour log-probs at t′) but trained at temperature 1 (the trainer's forward)."""
    from rlvr.engines.hf import HFEngine
    from rlvr.samplers.group import PromptEncoder
    from rlvr.trainer.forward import build_inputs, completion_logprobs

    factory, tok = tiny
    model = factory(0)

    class FailAll:
        def score(self, batch):
            batch.correct = torch.zeros(len(batch), dtype=torch.bool)
            batch.rewards = torch.zeros(len(batch))
            batch.texts = [""] * len(batch)
            return SimpleNamespace(errors=0)

    enc = PromptEncoder(tok, "Answer.", 64)
    s = HardPromptSampler(HFEngine(model, tok), enc, FailAll(), tok.pad_token_id, explore_num_generations=3,
                          explore_temperature=1.5)
    batch = s.sample(toy_task.problems("train")[:2], 2, SamplingParams(max_new_tokens=5, seed=1))
    exp = torch.tensor([k == "explore" for k in batch.context_kind])
    assert int(exp.sum()) == 6 and batch.logprob_temperature[exp].eq(1.0).all()
    logp, _ = completion_logprobs(model, batch, pad_token_id=tok.pad_token_id, with_entropy=False)
    ids, attn, pos = build_inputs(batch, tok.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits
    t1 = torch.log_softmax(logits, -1)
    t15 = torch.log_softmax(logits / 1.5, -1)
    for i in exp.nonzero().flatten().tolist():
        for t in range(int(batch.completion_lengths[i])):
            tokid = batch.completion_ids[i, t]
            assert float(logp[i, t]) == pytest.approx(float(t1[i, pos[i, t], tokid]), abs=1e-4)
            assert float(batch.sampler_logp[i, t]) == pytest.approx(float(t15[i, pos[i, t], tokid]), abs=1e-4)

"""The multi-turn sampler, token-in/token-out (issue 26 item 2), on a scripted engine: batching of
turns, tokens appended as sampled, observation tokens = the chat template's rendering, limits."""

from __future__ import annotations

import pytest
import torch
from conftest import EOS, CountingEnv, ScriptedEngine

from rlvr.tasks.base import Problem
from rlvr.types import SamplingParams

PROBLEMS = [Problem(uid="p0", question="1 + 1 =", answer="2"), Problem(uid="p1", question="2 + 2 =", answer="4")]
PARAMS = SamplingParams(max_new_tokens=6, seed=5)


def _answer(tok):
    ids = tok("ok", add_special_tokens=False)["input_ids"]
    return lambda ctx: ids + [EOS]


def test_turn_one_groups_each_prompt_and_later_turns_are_one_call(make_sampler, tiny):
    _, tok = tiny
    eng = ScriptedEngine(_answer(tok))
    s = make_sampler(eng, lambda: CountingEnv(3))
    b = s.sample(PROBLEMS, 3, PARAMS, first_group_id=10)
    assert len(eng.calls) == 3  # one engine call per turn
    assert [(n, cap) for _, n, cap in eng.calls[0]] == [(3, None), (3, None)]  # G samples of each prompt
    assert [n for _, n, _ in eng.calls[1]] == [1] * 6 and [n for _, n, _ in eng.calls[2]] == [1] * 6
    for i, (ctx, _, _) in enumerate(eng.calls[2]):  # later contexts are prompt + everything so far
        assert ctx == b.context_ids[i] + b.completion_ids[i, : len(ctx) - len(b.context_ids[i])].tolist()
    assert b.group_id.tolist() == [10] * 3 + [11] * 3
    assert b.rewards.tolist() == [0.75] * 6 and b.correct.all()
    m = b.metrics
    assert m["env/turns_mean"] == 3 and m["env/finish/env_done"] == 1.0 and m["env/turn_reward/2"] == 0.25


def test_tokens_are_the_whole_conversation_rendered_once(make_sampler, tiny):
    """Context + completion equal the tokenised chat-template rendering of the whole conversation;
    model tokens carry loss_mask 1 and the engine's log-probs, observation tokens 0."""
    _, tok = tiny
    answer = tok("ok", add_special_tokens=False)["input_ids"]
    b = make_sampler(ScriptedEngine(_answer(tok)), lambda: CountingEnv(2)).sample(PROBLEMS[:1], 2, PARAMS)
    conv = [{"role": "user", "content": "1 + 1 ="}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "obs 1"}, {"role": "assistant", "content": "ok"}]
    whole = tok(tok.apply_chat_template(conv, tokenize=False), add_special_tokens=False)["input_ids"]
    k = int(b.completion_mask[0].sum())
    row = b.context_ids[0] + b.completion_ids[0, :k].tolist()
    assert row == whole[: len(row)] and len(whole) - len(row) == 1  # the template's "\n" after the last EOS
    model = [1.0] * (len(answer) + 1)
    obs = k - 2 * len(model)
    assert b.loss_mask[0, :k].tolist() == model + [0.0] * obs + model
    assert b.sampler_logp[0, :k].tolist() == [-0.5] * len(model) + [0.0] * obs + [-0.5] * len(model)
    assert b.model_lengths.tolist() == [2 * len(model)] * 2
    assert b.metrics["env/env_tokens"] == obs and b.metrics["env/model_tokens"] == 2 * len(model)


def test_token_budget_caps_turns_and_stops_before_an_observation_that_does_not_fit(make_sampler, tiny):
    _, tok = tiny
    long = lambda ctx: [7] * 10  # never ends by itself
    eng = ScriptedEngine(long)
    b = make_sampler(eng, lambda: CountingEnv(5), max_tokens=8).sample(PROBLEMS[:1], 2, SamplingParams(max_new_tokens=6))
    assert eng.calls[0][0][2] is None  # 8 left >= the 6-token cap
    assert b.completion_mask.sum(1).tolist() == [6, 6]  # the observation (> 1 token left) was not appended
    assert b.metrics["env/finish/length"] == 1.0 and b.is_truncated.all()
    eng2 = ScriptedEngine(lambda ctx: [7, EOS])
    b2 = make_sampler(eng2, lambda: CountingEnv(5), max_tokens=20).sample(PROBLEMS[:1], 1, PARAMS)
    used = int(b2.completion_mask.sum())
    assert used <= 20 and b2.metrics["env/finish/length"] == 1.0
    assert all(cap is None or cap <= 20 for call in eng2.calls for _, _, cap in call)


def test_max_turns_ends_an_episode_the_env_does_not(make_sampler, tiny):
    _, tok = tiny
    b = make_sampler(ScriptedEngine(_answer(tok)), lambda: CountingEnv(99), max_turns=2).sample(PROBLEMS, 2, PARAMS)
    m = b.metrics
    assert m["env/turns_mean"] == 2 and m["env/finish/max_turns"] == 1.0 and b.rewards.tolist() == [0.5] * 4


def test_async_environment_methods_are_awaited(make_sampler, tiny):
    _, tok = tiny

    class AsyncEnv(CountingEnv):
        async def reset(self, problem):
            return super().reset(problem)

        async def step(self, action):
            return super().step(action)

    b = make_sampler(ScriptedEngine(_answer(tok)), lambda: AsyncEnv(2)).sample(PROBLEMS[:1], 2, PARAMS)
    assert b.rewards.tolist() == [0.5, 0.5] and b.metrics["env/errors"] == 0


def test_the_batch_trains(make_sampler, tiny):
    """A sampled multi-turn batch goes through the update: the loss counts model tokens only."""
    from rlvr.core.objective import LossSettings
    from rlvr.trainer.update import policy_update

    make, tok = tiny
    model = make(1)
    b = make_sampler(ScriptedEngine(_answer(tok)), lambda: CountingEnv(2)).sample(PROBLEMS, 2, PARAMS)
    b.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    res = policy_update(model, torch.optim.SGD(model.parameters(), lr=0.0), b, LossSettings(), pad_token_id=EOS,
                        rows_per_micro=2, step_optimizer=False)
    assert res.metrics["actor/num_loss_tokens"] == float(b.loss_mask.sum()) < float(b.completion_mask.sum())
    assert res.metrics["actor/grad_norm"] > 0


def test_a_template_that_is_not_append_only_is_refused(make_sampler, tiny):
    """Qwen3-style: earlier assistant turns lose their <think> block when the conversation grows."""
    import copy

    from rlvr.errors import ConfigError

    _, tok = tiny
    bad = copy.deepcopy(tok)
    bad.name_or_path = "think-stripper"
    bad.chat_template = (
        "{% for m in messages %}{% set c = m['content'] %}"
        "{% if m['role'] == 'assistant' and not loop.last %}{% set c = c.split('</think>')[-1].lstrip() %}{% endif %}"
        "{{ '<|im_start|>' + m['role'] + '\n' + c + '<|im_end|>' + '\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    from rlvr.envs.template import check_append_only

    check_append_only(tok, EOS, ("user", "tool"))  # the tiny ChatML template is append-only
    with pytest.raises(ConfigError, match=r"think-stripper.*not append-only.*'user'.*first differ at token \d+"):
        check_append_only(bad, EOS, ("user",))

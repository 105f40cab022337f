"""The ``rewards:`` list: weighted sums, normalisations, per-source components, the correct flag, the
checks that run before any model loads, metrics, and the running statistics through a checkpoint."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlvr.config.rewards import RewardConfig
from rlvr.errors import ConfigError
from rlvr.rewards.combine import CombinedScorer, build_scorer, check_rewards, component_names
from rlvr.rewards.normalize import RunningMoments, group_zscore
from rlvr.rewards.scorer import Scorer
from rlvr.tasks.base import Problem
from rlvr.tasks.mixture import SOURCE_KEY
from rlvr.testing import ToyTask, small_config
from rlvr.types import RolloutBatch


class Fixed:
    """A learned component stub: the score of a completion is ``values[text]``."""

    def __init__(self, values: dict[str, float], name: str = "fixed") -> None:
        self.values, self.name, self.seen = values, name, []

    def score(self, problems, texts):
        self.seen.append(list(texts))
        return torch.tensor([self.values[t] for t in texts])

    def pop_metrics(self):
        return {f"{self.name}/calls": float(sum(map(len, self.seen)))}

    def close(self):
        pass


@pytest.fixture(scope="module")
def tok():
    from rlvr.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


def make_batch(tok, texts, groups, problems=None, prompt_index=None) -> RolloutBatch:
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    n, w = len(ids), max(map(len, ids))
    ci, cm = torch.full((n, w), tok.pad_token_id), torch.zeros(n, w)
    for i, x in enumerate(ids):
        ci[i, :len(x)], cm[i, :len(x)] = torch.tensor(x), 1
    problems = problems or [Problem(f"p{g}", f"{g} + 1 =", str(g + 1)) for g in sorted(set(groups))]
    return RolloutBatch(
        context_ids=[[1]] * n, completion_ids=ci, completion_mask=cm, group_id=torch.tensor(groups),
        prompt_index=torch.tensor(prompt_index if prompt_index is not None else groups),
        is_truncated=torch.zeros(n, dtype=torch.bool), sampling_temperature=torch.ones(n),
        logprob_temperature=torch.ones(n), policy_version=torch.zeros(n, dtype=torch.long), problems=problems)


def entry(**kw) -> RewardConfig:
    kw.setdefault("type", "judge")
    if kw["type"] == "judge":
        kw.setdefault("client", "hf")
        if kw["client"] == "hf":
            kw.setdefault("name_or_path", "tiny")
    elif kw["type"] == "reward_model":
        kw.setdefault("name_or_path", "tiny")
    return RewardConfig(**kw)


def combined(tok, entries, learned, task=None):
    task = task or ToyTask()
    return CombinedScorer(Scorer(task, tok), entries, learned, component_names(entries, task.name))


TEXTS = ["12", "123", "1234", "1"]  # ToyTask: even length passes → verifier [1, 0, 1, 0]


def test_the_total_is_the_weighted_sum_of_raw_components(tok):
    a = Fixed(dict(zip(TEXTS, [2.0, 4.0, 6.0, 8.0])), "a")
    b = Fixed(dict(zip(TEXTS, [1.0, 1.0, 0.0, 0.0])), "b")
    entries = [entry(type="verifier"), entry(name="a", type="reward_model", weight=0.5),
               entry(name="b", weight=-1.0)]
    sc = combined(tok, entries, {1: a, 2: b})
    batch = make_batch(tok, TEXTS, [0, 0, 1, 1])
    stats = sc.score(batch)
    # 1·v + 0.5·a − 1·b = [1+1−1, 0+2−1, 1+3−0, 0+4−0]
    assert batch.rewards.tolist() == pytest.approx([1.0, 1.0, 4.0, 4.0])
    assert batch.rewards.dtype == torch.float32
    assert batch.reward_components["toy"].tolist() == [1.0, 0.0, 1.0, 0.0]  # raw, under the task's name
    assert batch.reward_components["a"].tolist() == [2.0, 4.0, 6.0, 8.0]
    assert batch.correct.tolist() == [True, False, True, False]  # the verifier's where it scores
    assert batch.feedback == [None, "odd length", None, "odd length"]
    assert batch.texts == TEXTS and stats.calls == 4 and sc.calls_total == 4
    m = sc.round_metrics()
    assert m["a/calls"] == 4 and "timing/rewards/a_s" in m and "timing/rewards/b_s" in m


def test_group_normalisation_is_a_per_group_z_score_with_bessels_std(tok):
    a = Fixed({"12": 1.0, "123": 2.0, "1234": 6.0, "1": 5.0}, "a")
    sc = combined(tok, [entry(type="reward_model", name="a", normalize="group")], {0: a})
    batch = make_batch(tok, TEXTS, [0, 0, 0, 1])
    sc.score(batch)
    # group 0: [1, 2, 6], mean 3, var (4 + 1 + 9) / 2 = 7; group 1 has one row → 0
    s7 = math.sqrt(7)
    assert batch.rewards.tolist() == pytest.approx([-2 / s7, -1 / s7, 3 / s7, 0.0], abs=1e-5)
    assert batch.reward_components["a"].tolist() == [1.0, 2.0, 6.0, 5.0]  # the metric stays raw
    assert group_zscore(torch.tensor([3.0, 3.0]), torch.tensor([0, 0])).tolist() == [0.0, 0.0]  # no spread


def test_running_normalisation_uses_every_score_so_far_and_survives_a_state_round_trip(tok):
    vals = {"12": 1.0, "123": 3.0, "1234": 5.0, "1": 0.0}
    entries = [entry(type="reward_model", name="a", normalize="running")]
    sc = combined(tok, entries, {0: Fixed(vals, "a")})
    b1 = make_batch(tok, ["12", "123"], [0, 0])
    sc.score(b1)
    assert b1.rewards.tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)], abs=1e-5)  # mean 2, std √2
    state = json.loads(json.dumps(sc.state_dict()))
    b2 = make_batch(tok, ["1234"], [0])
    sc.score(b2)
    assert b2.rewards.tolist() == pytest.approx([1.0], abs=1e-5)  # [1, 3, 5]: mean 3, std 2
    m = sc.round_metrics()
    assert m["rewards/a/running_mean"] == pytest.approx(3.0) and m["rewards/a/running_std"] == pytest.approx(2.0)
    again = combined(tok, entries, {0: Fixed(vals, "a")})
    again.load_state_dict(state)
    b3 = make_batch(tok, ["1234"], [0])
    again.score(b3)
    assert b3.rewards.tolist() == b2.rewards.tolist()
    fresh = combined(tok, entries, {0: Fixed(vals, "a")})
    with pytest.warns(UserWarning, match="starts afresh"):
        fresh.load_state_dict({"running": {}})


def test_running_moments_match_the_whole_sample_in_any_split():
    x = torch.tensor([0.5, -1.0, 3.0, 2.0, 7.5, 0.0])
    rm = RunningMoments()
    for part in (x[:1], x[1:4], x[4:]):
        rm.update(part)
    assert rm.count == 6 and rm.mean == pytest.approx(float(x.mean())) and rm.std == pytest.approx(float(x.std()))


def test_sources_limit_a_component_to_its_rows_and_skip_the_verifier_elsewhere(tok):
    """Rows of the judged source are never verified (the toy verifier would raise on them), get the
    judge's score only, and are correct by its threshold; rows of the verified source get no judge call."""
    ps = [Problem("math/p0", "1 + 1 =", "2", {SOURCE_KEY: "math"}),
          Problem("open/p1", "Write a haiku", None, {SOURCE_KEY: "open"})]
    task = ToyTask(fail_on={"open/p1"})
    judge = Fixed({"1234": 0.75, "1": 0.25}, "judge")
    entries = [entry(type="verifier", sources=["math"], weight=2.0), entry(sources=["open"], weight=1.0)]
    sc = combined(tok, entries, {1: judge}, task)
    batch = make_batch(tok, TEXTS, [0, 0, 1, 1], problems=ps)
    stats = sc.score(batch)
    assert stats.errors == 0 and stats.calls == 2  # only the math rows were verified
    assert judge.seen == [["1234", "1"]]  # only the open rows were judged
    assert batch.rewards.tolist() == pytest.approx([2.0, 0.0, 0.75, 0.25])
    comp = batch.reward_components
    assert comp["toy"][:2].tolist() == [1.0, 0.0] and torch.isnan(comp["toy"][2:]).all()
    assert torch.isnan(comp["judge"][:2]).all() and comp["judge"][2:].tolist() == [0.75, 0.25]
    assert batch.correct.tolist() == [True, False, True, False]  # judge rows: 0.75 ≥ 0.5, 0.25 < 0.5
    assert batch.feedback == [None, "odd length", None, None]


def test_without_rewards_the_scorer_is_the_plain_verifier(tok, tmp_path):
    cfg = small_config(tmp_path, "reward_timeout_s=0")
    assert type(build_scorer(cfg, ToyTask(), tok)) is Scorer


def test_build_scorer_loads_the_tiny_reward_model(tok, tmp_path):
    cfg = small_config(tmp_path, "reward_timeout_s=0",
                       "rewards=[{type: verifier, weight: 1}, {type: reward_model, name_or_path: tiny, weight: 0.5}]")
    sc = build_scorer(cfg, ToyTask(), tok)
    batch = make_batch(tok, TEXTS, [0, 0, 1, 1])
    sc.score(batch)
    rm = batch.reward_components["reward_model"]
    assert rm.shape == (4,) and torch.isfinite(rm).all() and len(set(rm.tolist())) > 1
    want = batch.reward_components["toy"] + 0.5 * rm
    assert batch.rewards.tolist() == pytest.approx(want.tolist(), abs=1e-6)


class MixtureLike:
    name = "mix"
    labels = ["math", "open"]


@pytest.mark.parametrize("rewards, message", [
    ([entry(type="verifier"), entry(name="mix")], "both named 'mix'"),
    ([entry(type="verifier", sources=["math"]), entry(sources=["opn"])], "rewards[1].sources: ['opn'] are not"),
    ([entry(type="verifier", sources=["math"])], "scores task.mixture source 'open'"),
    ([entry(type="verifier"), entry(sources=["open"], weight=0.0)], None),
    ([entry(type="verifier"), entry(client="openai", base_url="http://127.0.0.1:9/v1",
                                    model="m", api_key_env="RLVR_TEST_UNSET_KEY")],
     "rewards[1]: api_key_env='RLVR_TEST_UNSET_KEY'"),
])
def test_check_rewards_names_the_entry_before_any_model_loads(tok, tmp_path, monkeypatch, rewards, message):
    from rlvr.rewards import combine

    monkeypatch.delenv("RLVR_TEST_UNSET_KEY", raising=False)

    def no_load(*a, **k):
        raise AssertionError("a model was loaded before the check")

    monkeypatch.setattr(combine.RewardModelReward, "from_config", no_load)
    monkeypatch.setattr(combine.JudgeReward, "from_config", no_load)
    cfg = small_config(tmp_path)
    object.__setattr__(cfg, "rewards", rewards)  # entries built directly: the list checks are tested below
    if message is None:
        check_rewards(cfg, MixtureLike())
        return
    with pytest.raises(ConfigError) as e:
        build_scorer(cfg, MixtureLike(), tok)
    assert message in str(e.value)


@pytest.mark.parametrize("value, message", [
    ("[{type: verifier}, {type: verifier}]", "rewards[1]: a second verifier entry"),
    ("[{type: reward_model, name_or_path: tiny}, {type: reward_model, name_or_path: tiny}]",
     "rewards[1] and rewards[0] are both named 'reward_model'"),
    ("[{type: verifier, weight: 0}]", "every weight is 0"),
    ("[{type: verifier, sources: [a]}]", "rewards[0].sources names task-mixture sources, but task.mixture"),
    ("[{type: verifier, sources: []}]", "sources: [] scores nothing"),
    ("[{type: verifier, batch_size: 2}]", "key batch_size is not read by type: verifier"),
    ("[{type: critic}]", "rewards[0].type: Input should be 'verifier', 'reward_model' or 'judge'"),
    ("{type: verifier}", "rewards: Input should be a valid list"),
])
def test_bad_rewards_lists_are_config_errors(tmp_path, value, message):
    with pytest.raises(ConfigError) as e:
        small_config(tmp_path, f"rewards={value}")
    assert message in str(e.value)


def test_dynamic_sampling_may_filter_on_a_learned_component(tmp_path):
    from rlvr.trainer.rollout import check_filter_metric

    cfg = small_config(tmp_path, "dynamic_sampling.enable=true", "dynamic_sampling.metric=judge",
                       "rewards=[{type: verifier}, {type: judge, client: hf, name_or_path: tiny}]")
    check_filter_metric(cfg, ToyTask())
    cfg = small_config(tmp_path, "dynamic_sampling.enable=true", "dynamic_sampling.metric=judge")
    with pytest.raises(ConfigError, match="have: toy"):
        check_filter_metric(cfg, ToyTask())


def test_a_run_logs_each_component_and_checkpoints_the_running_statistics(tiny, tmp_path):
    from rlvr.trainer.checkpoint import load_checkpoint
    from rlvr.trainer.trainer import Trainer

    factory, tok = tiny
    rewards = ("rewards=[{type: verifier}, {type: reward_model, name_or_path: tiny, weight: 0.5, "
               "normalize: running}]")
    cfg = small_config(tmp_path / "run", "reward_timeout_s=0", "save_steps=1", rewards)
    tr = Trainer(cfg, factory(0), tok, ToyTask())
    tr.train()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert len(steps) == 2
    for r in steps:
        assert {"rewards/toy/mean", "rewards/reward_model/mean", "reward_model/calls",
                "rewards/reward_model/running_mean", "timing/rewards/reward_model_s"} <= set(r)
        assert r["reward_model/calls"] == 8
    state = json.loads((tmp_path / "run" / "checkpoint-1" / "trainer_state.json").read_text())
    assert state["rewards"]["running"]["reward_model"]["count"] == 8  # one round of 8 completions
    again = Trainer(cfg, factory(0), tok, ToyTask())
    load_checkpoint(again, tmp_path / "run" / "checkpoint-2")
    assert again.scorer.running["reward_model"].count == 16
    assert again.scorer.running["reward_model"].mean == pytest.approx(tr.scorer.running["reward_model"].mean)
    tr.scorer.close()
    again.scorer.close()

"""``rlvr eval`` runs environment episodes as training does (issue 26 item 8): pass@k reads the
episode's verdict, the eval JSON carries the ``env/*`` metrics."""

from __future__ import annotations

import json

import pytest
from conftest import EOS, ScriptedEngine

from rlvr import cli
from rlvr.envs.builtin import FeedbackEnv
from rlvr.eval.evaluate import evaluate
from rlvr.samplers.group import PromptEncoder
from rlvr.samplers.multiturn import EpisodeLimits, MultiTurnSampler
from rlvr.testing import ToyTask

from cli_fixtures import TINY


def _eval_feedback_episodes(tiny, second_turn: str) -> dict:
    """Every episode answers "odd" (odd length: wrong for ToyTask) on turn 1 and ``second_turn`` on turn 2,
    on the feedback environment with one retry; 2 problems × 2 samples."""
    make, tok = tiny
    task = ToyTask(n=2)
    ids = {t: tok(t, add_special_tokens=False)["input_ids"] + [EOS] for t in ("odd", second_turn)}
    engine = ScriptedEngine(lambda ctx: ids["odd"] if len(engine.calls) == 1 else ids[second_turn])

    def sampler(eng, encoder, scorer):
        env = lambda: FeedbackEnv(task, max_retries=1)  # noqa: E731
        return MultiTurnSampler(eng, tok, env, EpisodeLimits(2, 64, 0.0), encoder, EOS)

    out = evaluate(make(0), tok, task, num_samples=2, ks=[1, 2], max_new_tokens=8, engine=engine,
                   make_sampler=sampler, seed=3)
    assert len(engine.calls) == 2  # two turns, each one batched engine call
    return out


def test_an_episode_that_succeeds_on_turn_two_counts_as_correct(tiny):
    out = _eval_feedback_episodes(tiny, "ok")  # "ok": even length, correct for ToyTask
    assert out["pass@1"] == 1.0 and out["pass@2"] == 1.0 and out["reward/mean"] == 1.0
    assert out["env/turns_mean"] == 2.0 and out["env/finish/env_done"] == 1.0
    assert out["env/turn_reward/1"] == 0.0 and out["env/turn_reward/2"] == 1.0
    assert out["env/errors"] == 0.0 and out["env/timeouts"] == 0.0
    assert "odd" in out["per_problem"][0]["sample"] and "ok" in out["per_problem"][0]["sample"]  # the whole episode
    rec = _eval_feedback_episodes(tiny, "bad")  # wrong on both turns: not correct
    assert rec["pass@1"] == 0.0 and rec["pass@2"] == 0.0 and rec["env/turns_mean"] == 2.0


def test_rlvr_eval_runs_episodes_with_env_type(tmp_path):
    out = tmp_path / "eval.json"
    code = cli.main(["eval", *TINY, "env.type=feedback", "env.max_retries=1", "env.max_turns=2",
                     "max_prompt_length=256", f"logging.output_dir={tmp_path}", "--out", str(out)])
    assert code == 0
    res = json.loads(out.read_text())
    assert {"pass@1", "pass@2", "ci95/pass@1", "env/turns_mean", "env/finish/env_done", "env/tool_calls",
            "env/errors"} <= set(res)
    assert 1.0 <= res["env/turns_mean"] <= 2.0
    assert sum(res[f"env/finish/{r}"] for r in ("env_done", "max_turns", "length", "error", "timeout")) == pytest.approx(1.0)
    recs = [json.loads(line) for line in (tmp_path / "eval.samples.jsonl").read_text().splitlines()]
    ep = recs[0]["samples"][0]["episode"]
    assert ep["turns"] in (1, 2) and ep["finish"] in ("env_done", "length") and "action" not in ep
    # a shard's samples merge back with the same env metrics (one code path: summarize_records)
    merged = tmp_path / "merged.json"
    assert cli.main(["eval-merge", str(tmp_path / "eval.samples.jsonl"), "--out", str(merged)]) == 0
    assert json.loads(merged.read_text())["env/turns_mean"] == res["env/turns_mean"]

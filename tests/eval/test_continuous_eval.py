"""``continuous_batching`` reaches the engines: ``rlvr eval``'s default engine (queueing CONTINUOUS_QUEUE times the
slots per call) and the trainer's. Greedy evaluation gives the chunked loop's results on the tiny model (fp32)."""

from __future__ import annotations

import pytest

from rlvr.engines.hf import HFEngine
from rlvr.eval import evaluate as ev_mod
from rlvr.testing import small_config
from rlvr.trainer.trainer import Trainer


def test_greedy_continuous_eval_equals_the_chunked_one_and_queues_more_than_the_slots(tiny, toy_task, monkeypatch):
    factory, tok = tiny
    model = factory(0)
    calls: list[tuple[int, int, bool]] = []  # (requests in the call, engine slots, continuous)
    orig = HFEngine.generate

    def spy(self, requests, *a, **k):
        calls.append((len(requests), self.max_batch_size, self.continuous))
        return orig(self, requests, *a, **k)

    monkeypatch.setattr(HFEngine, "generate", spy)
    kw = dict(num_samples=1, ks=[1], temperature=0.0, max_new_tokens=8, prompts_per_batch=2, limit=12)
    chunked = ev_mod.evaluate(model, tok, toy_task, **kw)
    n_chunked = len(calls)
    cont = ev_mod.evaluate(model, tok, toy_task, continuous=True, **kw)
    assert [c[2] for c in calls] == [False] * n_chunked + [True] * (len(calls) - n_chunked)
    assert calls[n_chunked][1] == 2 and calls[n_chunked][0] == 2 * ev_mod.CONTINUOUS_QUEUE  # 8 queued, 2 slots
    assert len(calls) - n_chunked == 12 // (2 * ev_mod.CONTINUOUS_QUEUE) + 1  # 8 + 4 problems
    assert [p["correct"] for p in cont["per_problem"]] == [p["correct"] for p in chunked["per_problem"]]
    assert cont["pass@1"] == pytest.approx(chunked["pass@1"])
    assert (cont["continuous_batching"], chunked["continuous_batching"]) == (True, False)  # eval-merge checks it


def test_trainer_engine_follows_the_config_key(tmp_path, tiny, toy_task):
    factory, tok = tiny
    on = Trainer(small_config(tmp_path / "on", "continuous_batching=true"), factory(0), tok, toy_task)
    off = Trainer(small_config(tmp_path / "off"), factory(0), tok, toy_task)
    assert on.engine.continuous is True and off.engine.continuous is False

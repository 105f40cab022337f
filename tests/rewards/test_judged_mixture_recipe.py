"""The ``judged_mixture`` recipe trains on the tiny model against a fake judge server: math and code rows
are verified, judged rows go to the judge (and only they), and every source and component has its
metrics."""

from __future__ import annotations

import json

import yaml

from rlvr.config import RECIPES_DIR, build_config
from rlvr.tasks import build_task
from rlvr.trainer.trainer import Trainer

from fake_judge_server import FakeJudge

SMALL = ["model.name_or_path=tiny", "num_generations=4", "generation_batch_size=8", "per_device_train_batch_size=4",
         "max_completion_length=8", "max_prompt_length=512", "max_steps=2", "learning_rate=1e-3",
         "logging.progress=false", "reward_num_workers=1", "reward_timeout_s=0"]
SOURCES = ("chain_sum", "code_builtin", "judged")


def _recipe(judged_weight: float = 0.6) -> dict:
    data = yaml.safe_load((RECIPES_DIR / "judged_mixture.yaml").read_text())
    data["task"]["mixture"][1]["config"].update(backend="local", allow_local_hidden_tests=True)  # local runs anywhere
    for entry in data["task"]["mixture"]:
        entry["train_size"] = 16
    data["task"]["mixture"][2]["weight"] = judged_weight  # judged rows in both rounds, whatever the draw
    return data


def test_a_judge_that_never_answers_costs_a_step_batch_timeout_s_not_a_hang(tmp_path, tiny, capsys):
    """Every judge call would take 20 s (and be retried); the step's judging is cut at batch_timeout_s,
    the judged rows score failure_score, are counted, and training goes on."""
    import time

    data = _recipe(judged_weight=10.0)  # (nearly) every prompt is judged
    with FakeJudge(delay_s=20.0) as fake:
        data["rewards"][1].update(base_url=fake.url, timeout_s=30, max_retries=2, batch_timeout_s=1.0)
        (tmp_path / "judged.yaml").write_text(yaml.safe_dump(data))
        cfg = build_config([tmp_path / "judged.yaml"], SMALL + ["max_steps=1", f"logging.output_dir={tmp_path / 'run'}"])
        factory, tok = tiny
        tr = Trainer(cfg, factory(0), tok, build_task(cfg.task))
        t0 = time.perf_counter()
        tr.train()
        took = time.perf_counter() - t0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in rows if "reward/mean" in r][0]
    assert took < 15.0  # one call alone would have held the step for 20 s
    assert step["judge/calls"] > 0 and step["judge/timeouts"] == step["judge/calls"] == step["judge/failures"]
    assert step["rewards/judge/mean"] == 0.0 and step["timing/rewards/judge_s"] < 3.0
    n = int(step["judge/calls"])  # the end-of-run summary shows them beside the verifier's counts
    assert (f"judge: {n} call{'s' * (n != 1)}, {n} failure{'s' * (n != 1)} ({n} timeout{'s' * (n != 1)}; "
            "100% scored failure_score)") in capsys.readouterr().err


def test_the_judged_mixture_recipe_trains_with_per_source_and_judge_metrics(tmp_path, tiny):
    data = _recipe()
    with FakeJudge() as fake:
        data["rewards"][1].update(base_url=fake.url, timeout_s=5)
        (tmp_path / "judged.yaml").write_text(yaml.safe_dump(data))
        cfg = build_config([tmp_path / "judged.yaml"], SMALL + [f"logging.output_dir={tmp_path / 'run'}"])
        factory, tok = tiny
        tr = Trainer(cfg, factory(0), tok, build_task(cfg.task))
        drawn: list[str] = []
        inner = tr.loader.next

        def record(k):
            got = inner(k)
            drawn.extend(p.metadata["source"] for p in got)
            return got

        tr.loader.next = record
        tr.train()
        prompts = [b["messages"][0]["content"] for _, b in fake.requests]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert len(steps) == 2 and len(drawn) == 4
    judged_rows = 4 * drawn.count("judged")
    assert judged_rows > 0
    calls = sum(r["judge/calls"] for r in steps)
    hits = sum(r["judge/cache_hits"] for r in steps)
    assert calls + hits == judged_rows and calls == len(prompts)  # one call per distinct judged completion
    assert all("<reference>" in p and "Rubric:" in p for p in prompts)  # the judged source's reference answer
    for r in steps:
        assert r["judge/failures"] == 0 and r["judge/parse_failures"] == 0 and r["judge/timeouts"] == 0
        seen = [s for s in SOURCES if f"reward/{s}/mean" in r]
        assert sum(r[f"mixture/{s}/rows"] for s in seen) == 8
        for s in SOURCES:
            assert f"mixture/{s}/weight" in r
        if "reward/judged/mean" in r:
            assert 0.0 <= r["rewards/judge/mean"] <= 1.0
            assert abs(r["rewards/judge/mean"] - r["reward/judged/mean"]) < 1e-6  # weight 1: the judged rows' reward
        if set(seen) & {"chain_sum", "code_builtin"}:
            assert "rewards/verifier/mean" in r and "rewards/mixture/mean" not in r  # the entry's name

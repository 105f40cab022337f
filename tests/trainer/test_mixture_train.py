"""A task mixture in the trainer: the ``mixture`` recipe trains on the tiny model with per-source metrics,
and a run resumed from a mid-run checkpoint draws the same prompts (and keeps the same curriculum) as
the uninterrupted run."""

from __future__ import annotations

import json

import yaml

from rlvr.config import RECIPES_DIR, build_config
from rlvr.tasks import build_task
from rlvr.testing import small_config
from rlvr.trainer.checkpoint import load_checkpoint
from rlvr.trainer.trainer import Trainer

SMALL = ["model.name_or_path=tiny", "num_generations=4", "generation_batch_size=8", "per_device_train_batch_size=4",
         "max_completion_length=8", "max_prompt_length=512", "max_steps=3", "learning_rate=1e-3",
         "logging.progress=false", "reward_num_workers=1", "reward_timeout_s=0", "task.curriculum.solved=null"]


def test_the_mixture_recipe_trains_with_per_source_metrics(tmp_path, tiny):
    data = yaml.safe_load((RECIPES_DIR / "mixture.yaml").read_text())
    data["task"]["mixture"][1]["config"].update(backend="local", allow_local_hidden_tests=True)  # local runs anywhere
    data["task"]["mixture"][0]["train_size"] = 16
    (tmp_path / "mix.yaml").write_text(yaml.safe_dump(data))
    cfg = build_config([tmp_path / "mix.yaml"], SMALL + [f"logging.output_dir={tmp_path / 'run'}"])
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
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert len({r["step"] for r in steps}) == 3
    for r in steps:
        for src in ("chain_sum", "code_builtin"):
            assert f"mixture/{src}/weight" in r
        # weights_by_step (0.8/0.2 at step 0 → 0.5/0.5 at step 10): 0.8 - 0.03 × step for chain_sum
        assert abs(r["mixture/chain_sum/weight"] - (0.8 - 0.03 * (r["step"] - 1))) < 1e-9
        seen = [s for s in ("chain_sum", "code_builtin") if f"reward/{s}/mean" in r]
        assert seen, r
        n = sum(r[f"mixture/{s}/rows"] for s in seen)
        assert n == 8  # 2 prompts × 4 completions, split among the sources drawn
        mean = sum(r[f"reward/{s}/mean"] * r[f"mixture/{s}/rows"] for s in seen) / n
        assert abs(mean - r["reward/mean"]) < 1e-6
        assert all(0.0 <= r[f"reward/{s}/pass_rate"] <= 1.0 for s in seen)
    assert set(drawn) <= {"chain_sum", "code_builtin"} and len(drawn) == 6


MIX = ("task.mixture=[{type: reasoning_gym, name: chain_sum, train_size: 6, reward_fn: 'rlvr.testing:even_length_reward'}, "
       "{type: reasoning_gym, name: basic_arithmetic, label: arith, train_size: 5, "
       "reward_fn: 'rlvr.testing:even_length_reward', weight: 2}]")
CURRICULUM = "task.curriculum={solved: {window: 1, threshold: 0.5, factor: 0.5}}"


def _run(out, tiny, *overrides, resume_from=None):
    factory, tok = tiny
    cfg = small_config(out, "reward_timeout_s=0", "max_prompt_length=256", MIX, CURRICULUM, *overrides)
    tr = Trainer(cfg, factory(0), tok, build_task(cfg.task))
    if resume_from is not None:
        load_checkpoint(tr, resume_from)
    rounds: list[list[str]] = []
    inner = tr.loader.next

    def record(k):
        got = inner(k)
        rounds.append([p.uid for p in got])
        return got

    tr.loader.next = record
    tr.train()
    return tr, rounds


def test_a_checkpoint_written_mid_run_resumes_the_same_prompt_sequence(tmp_path, tiny):
    ref, ref_rounds = _run(tmp_path / "ref", tiny, "max_steps=6")
    _, first = _run(tmp_path / "run", tiny, "max_steps=3", "save_steps=3")
    resumed, rest = _run(tmp_path / "run", tiny, "max_steps=6", resume_from=tmp_path / "run" / "checkpoint-3")
    assert first + rest == ref_rounds and len(ref_rounds) == 6
    assert {u.split("/")[0] for r in ref_rounds for u in r} == {"chain_sum", "arith"}
    assert resumed.loader.state_dict() == ref.loader.state_dict()
    assert ref.loader.multipliers != [1.0, 1.0]  # the solved rule fired, and its state was resumed too


def test_evaluating_a_mixture_reports_each_source_from_its_own_problems(tiny):
    from rlvr.eval.evaluate import evaluate
    from rlvr.tasks.mixture import MixtureSource, MixtureTask
    from rlvr.testing import ToyTask

    factory, tok = tiny
    task = MixtureTask([MixtureSource("a", 1, ToyTask(n=3)), MixtureSource("b", 1, ToyTask(n=2))])
    res = evaluate(factory(0), tok, task, num_samples=2, ks=[1], max_new_tokens=4, seed=0)
    assert res["source/a/num_problems"] == 3 and res["source/b/num_problems"] == 2
    by = {"a": [], "b": []}
    for p in res["per_problem"]:
        by[p["uid"].split("/")[0]].append(p["correct"] / p["n"])
    for s in by:
        assert abs(res[f"source/{s}/pass@1"] - sum(by[s]) / len(by[s])) < 1e-9
    assert abs(res["pass@1"] - sum(by["a"] + by["b"]) / 5) < 1e-9

"""The tools testbed (issue 26 item 7): its tool, vocabulary and template, its pre-training mixture,
and the ``testbed_tools`` recipe training two steps (on the test-size ``microtools`` policy)."""

from __future__ import annotations

import json
import random

import pytest

from rlvr import cli
from rlvr.config import build_config
from rlvr.envs.template import check_append_only
from rlvr.envs.tools import parse_hermes
from rlvr.testbed import tools as tt
from rlvr.testbed.model import PRESETS, _tool_row, build_tokenizer


def test_transform_tool_answers_and_refuses_bad_queries():
    assert tt.transform("R:abcde") == "edcba" and tt.transform("C:aj") == "ba"
    for bad in ("abc", "X:abc", "R:", "R:abz"):
        with pytest.raises(ValueError, match="query must look like"):
            tt.transform(bad)


def test_call_tokens_decode_to_a_hermes_call_and_the_template_is_append_only():
    tok = build_tokenizer(tools=True)
    ids = tok(f"{tt.CALL_OPEN}R:abc{tt.CALL_CLOSE}", add_special_tokens=False)["input_ids"]
    assert len(ids) == 2 + 5  # the call's two tokens + one per character
    (call,) = parse_hermes(tok.decode(ids, skip_special_tokens=True))
    assert (call.name, call.arguments, call.error) == ("transform", {"query": "R:abc"}, None)
    check_append_only(tok, tok.eos_token_id, roles=("tool",))
    assert tok.apply_chat_template([{"role": "user", "content": "R:abc"}], tokenize=False,
                                   add_generation_prompt=True) == "<|im_start|>R:abc="
    assert tok.unk_token_id not in tok(">abc=", add_special_tokens=False)["input_ids"]


def test_mixture_calls_the_tool_on_about_tool_frac_of_hard_levels_and_labels_only_model_tokens():
    spec, tok = PRESETS["tools"], build_tokenizer(tools=True)
    rng = random.Random(0)
    calls = hard = 0
    for _ in range(2000):
        segs = tt.tool_example(rng, spec)
        level = len(segs[0][0]) - 3  # "R:" + letters + "="
        if level > spec.max_level:
            hard += 1
            calls += any(tt.CALL_OPEN in text for text, _ in segs)
        else:
            assert len(segs) == 2  # easy levels: always a direct answer
    assert abs(calls / hard - spec.tool_frac) < 0.05
    ids, lab = _tool_row(random.Random(3), spec, tok)
    assert len(ids) == len(lab) and lab[0] == -100 and tok.eos_token_id in lab


def test_testbed_tools_recipe_trains_two_steps(tmp_path, monkeypatch, capsys):
    cfg = build_config(["testbed_tools"])
    assert cfg.model.name_or_path == "testbed:tools" and cfg.env.type == "tools"
    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", "--config", "testbed_tools", "max_steps=2", "model.name_or_path=testbed:microtools",
                     f"model.cache_dir={tmp_path / 'cache'}", "task.config.min_level=5", "task.config.max_level=6",
                     "generation_batch_size=8", "per_device_train_batch_size=8", "num_generations=4",
                     "task.train_size=16", "task.eval_size=4", "logging.progress=false", "reward_timeout_s=0"])
    assert code == 0, capsys.readouterr().err[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "runs/testbed_tools/metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "env/turns_mean" in r]
    assert len(train) == 2 and all(r["env/errors"] == 0 for r in train)


def test_compare_evaluates_episodes_and_the_table_reports_tool_rate_before_and_after(tmp_path, monkeypatch):
    """rlvr compare on an environment recipe: the held-out evaluation runs episodes (a tool episode can be
    correct), records the tool-call rate with its interval, and benchmarks/testbed_tools_table.py reads it."""
    import importlib.util
    from pathlib import Path

    from rlvr.compare.harness import Arm, Budget, CompareSpec, run_compare

    monkeypatch.chdir(tmp_path)
    common = ["model.name_or_path=testbed:microtools", f"model.cache_dir={tmp_path / 'cache'}",
              "task.config.min_level=5", "task.config.max_level=6", "generation_batch_size=8",
              "per_device_train_batch_size=8", "num_generations=4", "task.train_size=16", "task.eval_size=4",
              "logging.progress=false", "reward_timeout_s=0"]
    spec = CompareSpec(arms=[Arm.parse("grpo=testbed_tools")], seeds=[0, 1], budget=Budget.parse("rollouts=16"),
                       output_dir=str(tmp_path / "cmp"), common=common, eval_num_samples=4, eval_ks=[1, 4],
                       eval_limit=4, eval_baseline=True)
    run_compare(spec, log=lambda m: None)
    for arm in ("initial", "grpo"):
        r = json.loads((tmp_path / f"cmp/{arm}/seed0/result.json").read_text())
        lo, hi = r["eval/ci95/env/tool_rate"]
        assert 0 <= lo <= r["eval/env/tool_rate"] <= hi <= 1 and r["eval/env/turns_mean"] >= 1
        assert r["eval/env/tool_errors"] >= 0 and r["eval/ci95/pass@1"][0] <= r["eval/pass@1"]
    spec_t = importlib.util.spec_from_file_location(
        "testbed_tools_table", Path(__file__).resolve().parents[2] / "benchmarks" / "testbed_tools_table.py")
    table = importlib.util.module_from_spec(spec_t)
    spec_t.loader.exec_module(table)
    summary = table.summarize(*table.load(tmp_path / "cmp", "grpo"))
    s = summary["eval/env/tool_rate"]
    assert s["n"] == 2 and sorted(s["after"]) == [0, 1] and s["diff_n"] == 2
    init0 = json.loads((tmp_path / "cmp/initial/seed0/result.json").read_text())["eval/env/tool_rate"]
    assert s["initial"] == init0
    assert abs(s["diff_mean"] - (s["after_mean"] - init0)) < 1e-12  # the same policy before every seed
    flat = tmp_path / "flat"  # the docs keep flat copies <arm>.seed<k>.result.json: the same table from them
    flat.mkdir()
    for f in (tmp_path / "cmp").glob("*/seed*/result.json"):
        (flat / f"{f.parent.parent.name}.{f.parent.name}.result.json").write_text(f.read_text())
    assert table.summarize(*table.load(flat, "grpo")) == summary
    md = table.table(summary)
    assert "episodes with a tool call" in md and "held-out pass@1" in md and " of 2 |" in md

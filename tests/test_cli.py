"""CLI: configuration errors exit 2 with a message naming the key, before any model loads."""

from __future__ import annotations

import json

import pytest

from rlvr import cli


def _fail_load(*a, **k):  # the model must never be loaded when the config is bad
    raise AssertionError("model loaded before validation")


@pytest.fixture(autouse=True)
def no_model(monkeypatch):
    import rlvr.models

    monkeypatch.setattr(rlvr.models, "load_policy", _fail_load)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["train", "learning_rat=1e-5"], "did you mean 'learning_rate'"),
        (["train", "num_generations=abc"], "num_generations"),
        (["train", "epsilon=3"], "epsilon"),
        (["train", "generation_batch_size=30"], "whole number of groups"),
        (["train", "--config", "missing_recipe"], "not found"),
        (["train", "task.name=chain_summ"], "chain_sum"),
        (["train", "sampler=groupp"], "did you mean 'group'"),
        (["train", "loss_masks=[veto_nope]"], "loss_masks"),
        (["eval", "task.reward_fn=nosuchmodule_xyz:fn"], "nosuchmodule_xyz"),
        (["train", "task.type=jsonl", "task.path=/nonexistent/data.jsonl"], "/nonexistent/data.jsonl"),
    ],
)
def test_bad_config_exits_2_naming_the_key(argv, needle, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err


def test_bad_jsonl_row_exits_2_naming_file_and_line(tmp_path, capsys):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n" + json.dumps({"question": "x"}) + "\n")
    assert cli.main(["train", "task.type=jsonl", f"task.path={f}", "task.eval_size=1"]) == 2
    err = capsys.readouterr().err
    assert "d.jsonl" in err and "2" in err and "answer" in err


def test_plot_missing_run_dir(tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path / "nope")]) != 0
    assert "metrics.jsonl" in capsys.readouterr().err

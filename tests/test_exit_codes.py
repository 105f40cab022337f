"""Bad input on every subcommand exits 2 with one message naming the key, file or row, before any model
loads: model paths (``model.name_or_path``, ``--checkpoint``, ``rlvr export``'s folder), data files, recipes,
a run dir to plot. A model that is there but fails to load stays exit 1."""

from __future__ import annotations

import pytest

from rlvr import cli

from cli_fixtures import TINY, no_model_loads  # noqa: F401 (a fixture)

NO_TINY = [a for a in TINY if not a.startswith("model.name_or_path=")]


def _cases(d):
    (d / "empty").mkdir()
    (d / "bad.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n{oops\n')
    out = f"logging.output_dir={d / 'out'}"
    return {
        "train: missing model": (["train", *NO_TINY, "model.name_or_path=/no/such/dir", out],
                                 ["model.name_or_path", "/no/such/dir", "does not exist"]),
        "train: folder that is no model": (["train", *NO_TINY, f"model.name_or_path={d / 'empty'}", out],
                                           ["model.name_or_path", str(d / "empty"), "config.json"]),
        "eval: missing model": (["eval", *NO_TINY, "model.name_or_path=/no/such/dir", out],
                                ["model.name_or_path", "/no/such/dir"]),
        "eval: missing --checkpoint": (["eval", *TINY, "--checkpoint", "/no/such/ck", out], ["--checkpoint /no/such/ck"]),
        "compare: an arm's missing model": (["compare", "--arm", "a=grpo model.name_or_path=/no/such/dir", "--seeds", "0",
                                             "--budget", "steps=1", "--out", str(d / "cmp"), *NO_TINY],
                                            ["arm 'a'", "model.name_or_path", "/no/such/dir"]),
        "export: missing folder": (["export", "/no/such/folder", "--merge", "--out", str(d / "x")],
                                   ["/no/such/folder", "no such folder"]),
        "export: not an adapter": (["export", str(d / "empty"), "--merge", "--out", str(d / "x")],
                                   [str(d / "empty"), "adapter_config.json"]),
        "train: missing data file": (["train", *TINY, "task.type=jsonl", "task.path=/no/such.jsonl", out],
                                     ["task.path", "/no/such.jsonl"]),
        "train: malformed JSONL row": (["train", *TINY, "task.type=jsonl", f"task.path={d / 'bad.jsonl'}",
                                        "task.eval_size=1", out], ["bad.jsonl:2", "not valid JSON"]),
        "train: unknown recipe": (["train", "--config", "nosuchrecipe", *TINY, out], ["nosuchrecipe", "grpo"]),
        "eval: unknown recipe": (["eval", "--config", "nosuchrecipe", *TINY, out], ["nosuchrecipe"]),
        "plot: no run there": (["plot", str(d / "empty")], [str(d / "empty"), "metrics.jsonl"]),
    }


IDS = ["train: missing model", "train: folder that is no model", "eval: missing model", "eval: missing --checkpoint",
       "compare: an arm's missing model", "export: missing folder", "export: not an adapter",
       "train: missing data file", "train: malformed JSONL row", "train: unknown recipe", "eval: unknown recipe",
       "plot: no run there"]


@pytest.mark.parametrize("case", IDS)
def test_bad_input_exits_2_naming_it_before_any_model_loads(case, tmp_path, capsys, no_model_loads):
    argv, needles = _cases(tmp_path)[case]
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("rlvr:")]
    assert len(lines) == 1, err  # one message, no traceback
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert not (tmp_path / "cmp").exists() or not list((tmp_path / "cmp").rglob("error.txt"))


def test_a_model_folder_that_fails_to_load_is_still_exit_1(tmp_path, capsys):
    bad = tmp_path / "m"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "no_such_architecture"}')
    code = cli.main(["train", *NO_TINY, f"model.name_or_path={bad}", f"logging.output_dir={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert str(bad) in err

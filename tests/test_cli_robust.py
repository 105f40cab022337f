"""CLI robustness (issue 12, items 5-8, 10, 11): reused output dirs, messages instead of tracebacks,
exit codes, overrides anywhere, ``--version``. Runs use ``model.name_or_path=tiny`` (in-process)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from rlvr import cli

from cli_fixtures import TINY
from cli_fixtures import train_tiny as _train



def test_reused_output_dir_is_refused_naming_it_and_both_ways_out(tmp_path, capsys):
    assert _train(tmp_path) == 0
    rows = (tmp_path / "run" / "metrics.jsonl").read_text()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert _train(tmp_path) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "run") in err and "--resume" in err and "--overwrite" in err
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == rows  # nothing appended
    assert _train(tmp_path, "--overwrite") == 0
    assert [json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"  # --overwrite deletes only the run's files
    assert _train(tmp_path, "--overwrite", "--resume") == 2


def test_sigterm_exits_143_with_a_checkpoint_and_the_resume_command(tmp_path, capsys, monkeypatch):
    from rlvr.trainer.trainer import Trainer

    orig = Trainer._after_step

    def after_step(self, m):
        orig(self, m)
        if self.global_step == 1:
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(Trainer, "_after_step", after_step)
    assert _train(tmp_path, "max_steps=3") == 143
    err = capsys.readouterr().err
    assert "SIGTERM at step 1" in err and str(tmp_path / "run" / "checkpoint-1") in err
    assert "to continue: rlvr train" in err and err.rstrip().endswith("--resume")
    assert "rlvr: run interrupted: 1 step (1 -> 1)" in err  # the summary is printed too (it said "1 steps")
    monkeypatch.setattr(Trainer, "_after_step", orig)
    assert _train(tmp_path, "max_steps=3", "--resume") == 0
    assert "resumed from" in capsys.readouterr().err


def test_resume_reports_a_corrupt_latest_checkpoint_and_uses_the_previous(tmp_path, capsys):
    assert _train(tmp_path, "save_steps=1") == 0
    (tmp_path / "run" / "checkpoint-2" / "optimizer.pt").unlink()
    capsys.readouterr()
    assert _train(tmp_path, "save_steps=1", "max_steps=3", "--resume") == 0
    err = capsys.readouterr().err
    assert "checkpoint-2: incomplete or corrupt (optimizer.pt: missing)" in err
    assert "resumed from" in err and "checkpoint-1 at step 1" in err


def test_more_than_half_of_reward_calls_failing_exits_1(tmp_path, capsys):
    code = _train(tmp_path, "task.reward_fn=rlvr.testing:nonexistent_name_xyz")
    assert code == 2  # a reward_fn that cannot be imported is a config error, before the model loads
    (tmp_path / "bad_reward.py").write_text("def fn(completion, problem):\n    raise ValueError('nope')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        capsys.readouterr()
        assert _train(tmp_path, "task.reward_fn=bad_reward:fn") == 1
    finally:
        sys.path.remove(str(tmp_path))
    err = capsys.readouterr().err
    # issue 25 item 4.8: stopped after the first rounds in which every call failed, with a checkpoint
    assert "every reward call failed in 2 generation rounds in a row" in err and "verifier: 8 calls, 8 errors" in err
    assert "last: ValueError: nope" in err and "Wrote a checkpoint to" in err


@pytest.mark.parametrize("argv, needle", [
    (["compare", "--budget", "steps=1"], "no arm to run"),
    (["compare", "--arm", "grpo", "--budget", "steps=1", "--jobs", "0"], None),
    (["eval", "--tag", "a/b"], "may not hold a path separator"),
    (["train", "num_train_epochs=3"], "max_steps"),
    (["eval", "eval.ks=[1,32]", "eval.num_samples=16"], "eval.ks"),
    (["eval", "eval.ks=[0]"], "eval.ks"),
])
def test_refused_before_anything_runs(argv, needle, capsys, monkeypatch):
    import rlvr.models

    monkeypatch.setattr(rlvr.models, "load_policy", lambda *a, **k: pytest.fail("model loaded"))
    if needle is None:
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
        return
    assert cli.main(argv) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("spec, needle", [
    ("arms: [grpo]\nbudget: steps=1\neval: {num_samples: lots}\n", "malformed"),
    ("arms: [grpo]\nbudget: steps=1\nseeds: [0]\nseeds: [1]\n", "duplicate key 'seeds': first on line 3, again on line 4"),
    ("arms: [grpo]\nbudget: {steps: [1]}\n", "budget"),
])
def test_malformed_compare_spec_exits_2(tmp_path, capsys, spec, needle):
    f = tmp_path / "cmp.yaml"
    f.write_text(spec)
    assert cli.main(["compare", "--spec", str(f), "--out", str(tmp_path / "c")]) == 2
    assert needle in capsys.readouterr().err


def test_output_dir_that_is_a_file_or_unwritable(tmp_path, capsys, monkeypatch):
    import errno
    from pathlib import Path

    f = tmp_path / "afile"
    f.write_text("x")
    assert cli.main(["train", *TINY, f"logging.output_dir={f}"]) == 2
    assert "is a file" in capsys.readouterr().err

    def read_only(self, data):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "write_bytes", read_only)  # the probe write of a read-only mount
    assert cli.main(["train", *TINY, f"logging.output_dir={tmp_path / 'ro'}"]) == 2
    assert f"logging.output_dir='{tmp_path / 'ro'}' is not writable: Read-only file system" in capsys.readouterr().err


def test_a_folder_as_task_path_exits_2(tmp_path, capsys):
    assert cli.main(["train", *TINY, "task.type=jsonl", f"task.path={tmp_path}"]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_unwritable_eval_out_is_refused_before_generating(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    assert cli.main(["eval", *TINY, "--out", str(f / "res.json")]) == 2
    assert "is a file" in capsys.readouterr().err


def test_eval_results_go_to_stdout_when_the_file_cannot_be_written(tmp_path, capsys, monkeypatch):
    import rlvr.eval.report

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rlvr.eval.report, "write_report", fail)
    assert cli.main(["eval", *TINY, "--out", str(tmp_path / "e.json"), "--limit", "2"]) == 1
    out, err = capsys.readouterr()
    assert "No space left on device" in err and "printed above" in err
    assert "per_problem" in json.loads(out)


def test_overrides_anywhere_between_config_flags_later_wins():
    args = cli.parse_args(["train", "--config", "grpo", "learning_rate=1e-5", "--config", "dapo", "max_steps=3",
                           "learning_rate=2e-5", "--resume"])
    assert args.config == ["grpo", "dapo"] and args.resume == "auto"
    assert args.overrides == ["learning_rate=1e-5", "max_steps=3", "learning_rate=2e-5"]
    cfg = cli._load_config(args)
    assert cfg.learning_rate == 2e-5 and cfg.max_steps == 3 and cfg.dynamic_sampling.enable  # dapo applied


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    from rlvr import __version__

    assert capsys.readouterr().out.strip() == f"rlvr {__version__}"


def test_python_dash_m_rlvr_runs_the_cli():
    r = subprocess.run([sys.executable, "-m", "rlvr", "--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("rlvr ")


def test_overwrite_keeps_the_old_run_when_the_new_data_is_bad(tmp_path, capsys):
    """The data check (exit 2) runs before ``--overwrite`` deletes anything: a typo in the new run's
    data must not cost the old run."""
    assert _train(tmp_path) == 0
    rows = (tmp_path / "run" / "metrics.jsonl").read_text()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n{not json\n")
    capsys.readouterr()
    assert _train(tmp_path, "--overwrite", "task.type=jsonl", f"task.path={bad}", "task.eval_size=1") == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:2" in err, err
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == rows  # the old run is untouched
    assert (tmp_path / "run" / "final").is_dir()


def test_eval_refuses_to_replace_an_earlier_evaluation_without_overwrite(tmp_path, capsys):
    out = tmp_path / "e.json"
    assert cli.main(["eval", *TINY, "--out", str(out), "--limit", "2"]) == 0
    first = out.read_text()
    (tmp_path / "e.md").write_text("kept")  # a hand edit of the table must survive a refused second call
    capsys.readouterr()
    assert cli.main(["eval", *TINY, "--out", str(out), "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert "holds an earlier evaluation" in err and "--overwrite" in err and str(out) in err
    assert out.read_text() == first and (tmp_path / "e.md").read_text() == "kept"
    assert cli.main(["eval", *TINY, "--out", str(out), "--limit", "1", "--overwrite"]) == 0
    assert json.loads(out.read_text()) != json.loads(first)  # one problem now, two before


def test_eval_tag_names_the_earlier_file_it_would_replace(tmp_path, capsys):
    (tmp_path / "eval_base.samples.jsonl").write_text("{}\n")
    assert cli.main(["eval", *TINY, f"logging.output_dir={tmp_path}", "--tag", "base", "--limit", "1"]) == 2
    assert "eval_base.samples.jsonl holds an earlier evaluation" in capsys.readouterr().err

"""One run, one precision (issue 30): a run records the precision it resolved; ``--resume`` and ``rlvr eval
--checkpoint`` follow the recording on a machine whose ``auto`` now picks another (``RLVR_CPU_BF16`` flips it);
eval results state their precision; ``eval-merge`` refuses mixed shards; ``compare``'s report flags them."""

from __future__ import annotations

import json

import pytest

from cli_fixtures import TINY, train_tiny

from rlvr import cli
from rlvr.compare.report import write_report


def _mode(folder) -> str:
    return json.loads((folder / "precision.json").read_text())["mode"]


def _eval(run, out, *extra) -> int:
    return cli.main(["eval", *TINY, f"logging.output_dir={run}", *extra, "--out", str(out)])


def test_resume_and_eval_follow_the_runs_recorded_precision(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    monkeypatch.setenv("RLVR_CPU_BF16", "1")  # a machine whose auto picks bf16-master
    assert train_tiny(tmp_path, "max_steps=1", "save_steps=1") == 0, capsys.readouterr().err
    assert _mode(run / "checkpoint-1") == "bf16-master" and _mode(run / "final") == "bf16-master"
    capsys.readouterr()

    monkeypatch.setenv("RLVR_CPU_BF16", "0")  # the same run on a machine whose auto picks fp32
    assert train_tiny(tmp_path, "max_steps=2", "save_steps=1", "--resume") == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "at precision bf16-master, the run's recorded one" in err and "would pick fp32 on this machine now" in err
    assert _mode(run / "checkpoint-2") == "bf16-master" and _mode(run / "final") == "bf16-master"  # it continued in bf16-master
    assert "dtype: auto" in (run / "config.yaml").read_text()  # the run's config still says auto
    state = json.loads((run / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["config"]["model"]["dtype"] == "auto"  # so a later --resume compares equal

    assert _eval(run, tmp_path / "after.json", "--checkpoint", str(run / "final")) == 0
    err = capsys.readouterr().err
    after = json.loads((tmp_path / "after.json").read_text())
    assert after["precision"] == "bf16-master" and "precision bf16-master." in (tmp_path / "after.md").read_text()
    assert f"eval {run / 'final'}: at precision bf16-master" in err
    samples = [json.loads(x) for x in (tmp_path / "after.samples.jsonl").read_text().splitlines()]
    assert {s["precision"] for s in samples} == {"bf16-master"}

    # model.dtype given explicitly wins over the recording, and says so
    assert _eval(run, tmp_path / "fp32.json", "--checkpoint", str(run / "final"), "model.dtype=fp32") == 0
    assert "model.dtype=fp32 given, so not at the run's recorded precision bf16" in capsys.readouterr().err
    assert json.loads((tmp_path / "fp32.json").read_text())["precision"] == "fp32"


def test_eval_merge_refuses_shards_of_mixed_precision(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    monkeypatch.setenv("RLVR_CPU_BF16", "0")
    assert _eval(run, tmp_path / "a.json", "--limit", "2") == 0
    assert _eval(run, tmp_path / "b.json", "--offset", "2", "model.dtype=bf16") == 0
    # the config's own model (no run behind it): at what auto picks here, or as given; each result says it
    assert [json.loads((tmp_path / f"{x}.json").read_text())["precision"] for x in "ab"] == ["fp32", "bf16"]
    shards = [str(tmp_path / "a.samples.jsonl"), str(tmp_path / "b.samples.jsonl")]
    capsys.readouterr()
    assert cli.main(["eval-merge", *shards, "--out", str(tmp_path / "m.json")]) == 2
    err = capsys.readouterr().err
    assert "different precisions" in err and "a.samples.jsonl: fp32" in err and "--allow-mixed-precision" in err
    assert not (tmp_path / "m.json").exists()
    assert cli.main(["eval-merge", *shards, "--out", str(tmp_path / "m.json"), "--allow-mixed-precision"]) == 0
    merged = json.loads((tmp_path / "m.json").read_text())
    assert merged["precision"] == "mixed (bf16, fp32)"
    assert [s["precision"] for s in merged["shards"]] == ["fp32", "bf16"]
    assert "precision mixed (bf16, fp32)." in (tmp_path / "m.md").read_text()


def _result(out, arm, seed, precision):
    d = out / arm / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps({"arm": arm, "seed": seed, "steps": 2, "reward/final": 0.5,
                                               "precision": precision}))


def test_compare_report_flags_mixed_precision(tmp_path):
    out = tmp_path / "cmp"
    _result(out, "a", 0, "fp32"), _result(out, "a", 1, "fp32")
    _result(out, "b", 0, "bf16"), _result(out, "b", 1, "fp32")  # auto resolved differently per seed
    _result(out, "c", 0, "bf16"), _result(out, "c", 1, "bf16")
    report = write_report(out, arms=["a", "b", "c"], seeds=[0, 1]).read_text()
    assert "| a | 2 | fp32 |" in report and "| b | 2 | bf16 + fp32 |" in report and "| c | 2 | bf16 |" in report
    assert "**Mixed precision within arm b**: its seeds ran at bf16, fp32" in report
    assert "**Arms of different precisions**: bf16: c; fp32: a." in report
    summary = json.loads((out / "summary.json").read_text())
    assert summary["arms"]["b"]["precision"] == ["bf16", "fp32"]
    _ = [p.unlink() for p in (out / "b").glob("seed*/result.json")]
    _ = [p.unlink() for p in (out / "c").glob("seed*/result.json")]
    report = write_report(out, arms=["a"], seeds=[0, 1]).read_text()
    assert "Mixed precision" not in report and "different precisions" not in report  # one precision: no flag


def test_config_at_recorded_precision_and_damaged_records(tmp_path, monkeypatch, capsys):
    """What ``--resume`` and a ``rlvr compare`` piece are built with: the recording under auto, the config's own
    value otherwise; the run's config object is left as it was. A damaged record is a data error (exit 2)."""
    from rlvr.config import build_config
    from rlvr.errors import DataError
    from rlvr.precision import resolve_precision
    from rlvr.precision.record import config_at_recorded_precision, write_precision_record

    monkeypatch.setenv("RLVR_CPU_BF16", "0")
    write_precision_record(tmp_path, resolve_precision("bf16-pure", log=False))
    cfg = build_config()
    pinned = config_at_recorded_precision(cfg, tmp_path, context="test")
    assert (pinned.model.dtype, cfg.model.dtype) == ("bf16-pure", "auto")
    assert "would pick fp32 on this machine now" in capsys.readouterr().err
    explicit = build_config(overrides=["model.dtype=fp32"])
    assert config_at_recorded_precision(explicit, tmp_path, context="test") is explicit
    assert config_at_recorded_precision(cfg, tmp_path / "no-record", context="test") is cfg  # an older checkpoint
    (tmp_path / "precision.json").write_text('{"mode": "auto"}')
    with pytest.raises(DataError, match="precision.json: expected a JSON object whose 'mode' is one of fp32"):
        config_at_recorded_precision(cfg, tmp_path, context="test")

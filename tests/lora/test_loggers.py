"""logging.report_to: W&B (offline) and MLflow (file store) get the JSONL's scalars under the same names,
the config once, and a resumed run continues the same tracker run; a missing package is a clear
configuration error before any model loads."""

from __future__ import annotations

import json
import sys

import pytest

from rlvr.loggers import RUN_IDS_FILE, check_report_to
from rlvr.testing import ToyTask, small_config
from rlvr.trainer.checkpoint import load_checkpoint
from rlvr.trainer.trainer import Trainer

BASE = ["reward_timeout_s=0", "max_steps=3", "save_steps=2"]


def _jsonl_names(out):
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    names = set()
    for r in rows:
        names |= {k for k, v in r.items() if isinstance(v, (int, float)) and k not in ("step", "time")}
    return rows, names


def _run_and_resume(tmp_path, tiny, report_to):
    """3 steps (checkpoint at 2), then a fresh trainer resumed from checkpoint-2 in the same folder."""
    make, tok = tiny
    out = tmp_path / "run"
    cfg = small_config(out, *BASE, f"logging.report_to=[{report_to}]")
    Trainer(cfg, make(0), tok, ToyTask()).train()
    first = json.loads((out / RUN_IDS_FILE).read_text())
    tr = Trainer(cfg.model_copy(update={"max_steps": 4}), make(0), tok, ToyTask())
    load_checkpoint(tr, out / "checkpoint-2")
    tr.train()
    return out, first, json.loads((out / RUN_IDS_FILE).read_text())


def test_wandb_offline_same_names_config_once_and_resume_keeps_the_run_id(tmp_path, tiny, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    inits, logged = [], []
    real_init = wandb.init

    def spy_init(*a, **kw):
        inits.append(kw)
        run = real_init(*a, **kw)
        real_log = run.log
        run.log = lambda data, step=None, **k: (logged.append((step, dict(data))), real_log(data, step=step, **k))[1]
        return run

    monkeypatch.setattr(wandb, "init", spy_init)
    out, first, second = _run_and_resume(tmp_path, tiny, "wandb")
    assert first["wandb"] == second["wandb"]  # the resumed rlvr run continued the same W&B run
    assert len(inits) == 2 and inits[1]["id"] == first["wandb"] and inits[1]["resume"] == "allow"
    assert "config" in inits[0] and inits[0]["config"]["model"]["lora"]["r"] == 0  # the config, once
    assert "config" not in inits[1]
    rows, names = _jsonl_names(out)
    assert {k for _, d in logged for k in d} == names
    assert [s for s, _ in logged] == [1, 2, 3, 3, 4]  # step 3 re-done after the checkpoint at 2 (same values)
    assert list((out / "wandb").glob("offline-run-*"))


def test_mlflow_file_store_same_names_params_once_and_resume_keeps_the_run(tmp_path, tiny):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    out, first, second = _run_and_resume(tmp_path, tiny, "mlflow")
    assert first["mlflow"] == second["mlflow"]
    client = MlflowClient(tracking_uri=f"file:{(out / 'mlruns').resolve()}")
    run = client.get_run(first["mlflow"])
    rows, names = _jsonl_names(out)
    # the file store keeps metrics as files in folders: a name that is also a folder gets "/value"
    folders = {n for n in names if any(m.startswith(n + "/") for m in names)}
    assert "actor/ratio" in folders
    assert set(run.data.metrics) == (names - folders) | {f"{n}/value" for n in folders}
    hist = client.get_metric_history(first["mlflow"], "reward/mean")
    assert sorted({m.step for m in hist}) == [1, 2, 3, 4]
    want = {r["step"]: r["reward/mean"] for r in rows}
    assert all(m.value == pytest.approx(want[m.step]) for m in hist)
    assert run.data.params["model.lora.r"] == "0" and run.data.params["learning_rate"] == "0.001"
    assert run.info.status == "FINISHED"
    exps = client.search_experiments()
    assert sum(len(client.search_runs([e.experiment_id])) for e in exps) == 1  # no second run on resume


@pytest.mark.parametrize("tracker, extra", [("wandb", "rlvr[wandb]"), ("mlflow", "rlvr[mlflow]")])
def test_missing_tracker_package_is_a_config_error_before_the_model_loads(tracker, extra, monkeypatch, capsys):
    from rlvr import cli
    import rlvr.models

    monkeypatch.setitem(sys.modules, tracker, None)  # as if not installed
    with pytest.raises(Exception, match=extra.replace("[", r"\[").replace("]", r"\]")):
        check_report_to([tracker])
    monkeypatch.setattr(rlvr.models, "load_policy", lambda *a, **k: pytest.fail("model loaded"))
    assert cli.main(["train", f"logging.report_to=[tensorboard,{tracker}]", "logging.output_dir=/nonexistent/x"]) == 2
    err = capsys.readouterr().err
    assert extra in err and "logging.report_to" in err


def test_tensorboard_switch_and_default():
    cfg = small_config("x")
    assert cfg.logging.report_to == ["tensorboard"] and cfg.logging.sinks == ["tensorboard"]
    assert small_config("x", "logging.tensorboard=false").logging.sinks == []
    assert small_config("x", "logging.report_to=[]").logging.sinks == []


def test_mlflow_file_store_names_that_clash_with_folders(tmp_path):
    pytest.importorskip("mlflow")
    from rlvr.config import build_config
    from rlvr.loggers import MlflowTracker

    cfg = build_config(overrides=[f"logging.mlflow_tracking_uri=file:{tmp_path / 'ml'}"])
    t = MlflowTracker(tmp_path, {"a": 1}, cfg.logging, resume=False)
    t.log(1, {"actor/ratio": 1.0, "actor/ratio/min": 0.5, "reward/mean": 0.25})
    t.log(2, {"reward/mean/x": 2.0, "actor/ratio": 1.5})  # a child under an existing file; a known folder
    t.close()
    got = set(t.client.get_run(t.run_id).data.metrics)
    assert got == {"actor/ratio/value", "actor/ratio/min", "reward/mean", "reward/mean_x"}

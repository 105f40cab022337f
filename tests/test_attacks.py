"""Bad input found by a newcomer's attack pass (session 5, helper ``newbie``): each test failed before
its fix. Runs use ``model.name_or_path=tiny`` (in-process, offline) through :func:`rlvr.cli.main`."""

from __future__ import annotations

import json

import pytest

from rlvr import cli
from rlvr.config import build_config
from rlvr.errors import ConfigError

from cli_fixtures import TINY
from cli_fixtures import train_tiny as _train


def _no_model(monkeypatch):
    import rlvr.models

    monkeypatch.setattr(rlvr.models, "load_policy", lambda *a, **k: pytest.fail("model loaded before the check"))


@pytest.mark.parametrize("kv, key", [
    ("entropy_coef=nan", "entropy_coef"),      # passed validation, then a ValueError traceback in the loss
    ("learning_rate=inf", "learning_rate"),    # trained 5 non-finite updates, then exit 1
    ("max_grad_norm=inf", "max_grad_norm"),
    ("beta=-inf", "beta"),
])
def test_nan_or_inf_knob_is_a_config_error_before_the_model_loads(tmp_path, capsys, monkeypatch, kv, key):
    with pytest.raises(ConfigError, match=rf"{key}: Input should be a finite number"):
        build_config(overrides=[kv])
    _no_model(monkeypatch)
    assert _train(tmp_path, kv) == 2
    assert f"{key}: Input should be a finite number" in capsys.readouterr().err


def test_nan_in_a_yaml_config_file_is_refused(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("entropy_coef: .nan\n")
    with pytest.raises(ConfigError, match="entropy_coef: Input should be a finite number"):
        build_config([f])


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    """A module ``attack_rewards`` on ``sys.path`` holding the given reward functions' sources."""

    def make(src: str) -> str:
        (tmp_path / "attack_rewards.py").write_text(src)
        monkeypatch.syspath_prepend(str(tmp_path))
        import importlib
        import sys

        sys.modules.pop("attack_rewards", None)
        importlib.invalidate_caches()
        return "attack_rewards"

    return make


@pytest.mark.parametrize("timeout", ["0", "20"])  # in-process and in the worker pool
def test_reward_beyond_float32_is_a_counted_error_not_a_traceback(tmp_path, capsys, reward_module, timeout):
    # 1e300 is a finite Python float, so it passed the check, became inf in the float32 rewards tensor
    # and the run died in zero_std_group_fraction with "rewards must be finite"
    mod = reward_module("def huge(completion, problem, **kw):\n    return 1e300\n")
    with pytest.warns(UserWarning, match="1e[+]300, outside the float32 range"):
        code = _train(tmp_path, f"task.reward_fn={mod}:huge", f"reward_timeout_s={timeout}", "max_steps=1")
    err = capsys.readouterr().err
    assert code == 1, err  # more than half of the reward calls failed: the run ends with its summary
    assert "4 of 4 reward calls failed" in err and "verifier: 4 calls, 4 errors" in err


def test_disk_full_on_metrics_names_the_file_and_keeps_the_summary(tmp_path, capsys, monkeypatch):
    # a real full disk fails the flush in RunLogger.log (named) and then the flush in close() (unnamed):
    # the second error replaced the first, so the CLI printed only "rlvr: No space left on device", and
    # the run summary (printed after close) was lost
    import builtins
    import errno

    import rlvr.trainer.logger as logger_mod

    class FullDisk:
        def __init__(self, f):
            self.f = f

        def write(self, text):
            return len(text)

        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            self.f.close()
            raise OSError(errno.ENOSPC, "No space left on device")

    def fake_open(file, mode="r", *a, **k):
        f = builtins.open(file, mode, *a, **k)
        return FullDisk(f) if str(file).endswith("metrics.jsonl") and "a" in mode else f

    monkeypatch.setattr(logger_mod, "open", fake_open, raising=False)
    assert _train(tmp_path) == 1
    err = capsys.readouterr().err
    assert f"rlvr: No space left on device: {tmp_path / 'run' / 'metrics.jsonl'}" in err, err
    assert "rlvr: run failed:" in err and "verifier: 4 calls, 0 errors" in err


def test_resume_of_a_finished_run_without_checkpoints_is_refused_and_loses_nothing(tmp_path, capsys, monkeypatch):
    # save_steps=0 (the default) leaves final/ and no checkpoint-N; --resume then "started from scratch",
    # dropped every metrics.jsonl row and overwrote final/ with a model trained from step 1
    assert _train(tmp_path) == 0
    run = tmp_path / "run"
    before = {p: p.read_bytes() for p in [run / "metrics.jsonl", *sorted((run / "final").iterdir())]}
    capsys.readouterr()
    _no_model(monkeypatch)
    assert _train(tmp_path, "max_steps=4", "--resume") == 2
    err = capsys.readouterr().err
    assert f"--resume: {run} holds a finished run (final/) but no checkpoint-N" in err
    assert "--overwrite" in err and f"model.name_or_path={run / 'final'}" in err
    assert {p: p.read_bytes() for p in before} == before


def test_resume_before_the_first_checkpoint_still_starts_from_scratch(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")  # killed at step 1
    assert _train(tmp_path, "--resume") == 0
    assert "no checkpoint in" in capsys.readouterr().err
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_unknown_dynamic_sampling_metric_exits_2_before_the_model_loads(tmp_path, capsys, monkeypatch):
    # used to pass validation and die in the first generation round with a KeyError traceback
    _no_model(monkeypatch)
    assert _train(tmp_path, "dynamic_sampling.enable=true", "dynamic_sampling.metric=acuracy") == 2
    err = capsys.readouterr().err
    assert "dynamic_sampling.metric='acuracy' is neither one of acc, score, reward nor a reward component" in err
    assert not (tmp_path / "run").exists()  # refused before the output dir is touched


def test_dynamic_sampling_metric_accepts_the_runs_reward_components():
    from types import SimpleNamespace

    from rlvr.trainer.rollout import check_filter_metric

    task = SimpleNamespace(name="testbed")
    on = ["dynamic_sampling.enable=true"]
    for metric, extra in [("acc", []), ("reward", []), ("testbed", []), ("overlong", ["overlong_buffer_len=2"])]:
        check_filter_metric(build_config(overrides=[*on, f"dynamic_sampling.metric={metric}", *extra]), task)
    with pytest.raises(ConfigError, match="have: testbed\\)"):  # no overlong component without the buffer
        check_filter_metric(build_config(overrides=[*on, "dynamic_sampling.metric=overlong"]), task)
    check_filter_metric(build_config(overrides=["dynamic_sampling.metric=anything"]), task)  # off: never read


def test_bare_source_name_without_its_package_says_how_to_register_it(monkeypatch):
    # README's Python example with model.name_or_path=testbed failed with only "cannot load 'testbed'
    # as a Hugging Face hub id": the CLI imports rlvr.testbed, a script must do it itself
    import rlvr.models
    import rlvr.models.loading
    from rlvr.errors import ModelLoadError
    from rlvr.registry import Registry

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(rlvr.models.loading, "MODEL_SOURCES", Registry("model.name_or_path", "x"))
    with pytest.raises(ModelLoadError, match="nor is 'testbed' a registered model source .*import rlvr.testbed"):
        rlvr.models.load_policy(build_config(overrides=["model.name_or_path=testbed"]).model)


def test_train_help_lists_every_built_in_recipe(capsys):
    from rlvr.config import RECIPES_DIR

    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    recipes = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
    assert {"grpo", "testbed_v2", "uec_rl_release"} <= set(recipes)  # the folder really was found
    for recipe in recipes:
        assert recipe + "," in out or recipe + ")" in out, recipe


def test_overwrite_keeps_the_old_run_when_the_model_path_is_mistyped(tmp_path, capsys):
    # --overwrite deleted the earlier run's files, then the model load failed on the typo
    assert _train(tmp_path) == 0
    run = tmp_path / "run"
    before = sorted(p.name for p in run.iterdir())
    capsys.readouterr()
    missing = tmp_path / "no_such_model"
    assert _train(tmp_path, "--overwrite", f"model.name_or_path={missing}") == 2
    err = capsys.readouterr().err
    assert f"path '{missing}' does not exist" in err and "deleted" not in err
    assert sorted(p.name for p in run.iterdir()) == before


def test_overwrite_with_resume_is_refused_first(tmp_path, capsys, monkeypatch):
    # printed "no checkpoint in ...; starting from scratch" (or the finished-run refusal) before the conflict
    assert _train(tmp_path) == 0
    capsys.readouterr()
    _no_model(monkeypatch)
    assert _train(tmp_path, "--overwrite", "--resume") == 2
    err = capsys.readouterr().err
    assert err.startswith("rlvr: configuration error: --overwrite and --resume contradict each other"), err
    assert (tmp_path / "run" / "final").is_dir()

"""What a new user broke (issue 25, item 4): a run dir in use by another trainer, a failed start that
blocked the next one, configs and data that are no regular files, held-out duplicates, a compare
budget below one round, an empty metrics file to plot, an unwritable export target, the testbed source
in ``rlvr export``, values YAML coerces into the wrong type, model names no hub can hold, and text the
testbed tokenizer cannot encode. Almost all of it is refused before any model loads."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import rlvr
from rlvr import cli

from cli_fixtures import TINY, no_model_loads, train_tiny  # noqa: F401 (no_model_loads: a fixture)

SRC = str(Path(rlvr.__file__).resolve().parents[1])


def _rlvr_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("rlvr:")]


def _python(code: str, *args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


_HOLD = ("import sys, time\nfrom rlvr.trainer.run_lock import RunDirLock\n"
         "lock = RunDirLock(sys.argv[1]).acquire()\nprint('ready', flush=True)\ntime.sleep(120)\n")


@pytest.fixture
def holder(tmp_path):
    """A second process holding ``tmp_path/run``'s lock, as a running ``rlvr train`` does."""
    run = tmp_path / "run"
    run.mkdir()
    p = _python(_HOLD, str(run))
    assert p.stdout.readline().strip() == "ready", p.stderr.read()
    yield p
    p.kill()
    p.wait()


# ---------------------------------------------------------------- 4.1: one trainer per run dir
@pytest.mark.parametrize("flag", [None, "--overwrite", "--resume"])
def test_a_second_trainer_into_a_running_run_dir_exits_2_naming_the_holder(tmp_path, capsys, holder, no_model_loads, flag):
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n')  # the running trainer's first step
    code = train_tiny(tmp_path, *([flag] if flag else []))
    err = capsys.readouterr().err
    assert code == 2, err
    line = _rlvr_lines(err)[-1]
    assert f"pid {holder.pid} on host {socket.gethostname()}" in line and "in use" in line, err
    assert metrics.read_text() == '{"step": 1}\n'  # --overwrite deleted nothing, --resume mixed nothing


def test_a_lock_left_by_a_killed_trainer_does_not_block_the_next(tmp_path):
    from rlvr.trainer.run_lock import LOCK_FILE, RunDirLock

    p = _python(_HOLD, str(tmp_path))
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == p.pid  # the dead holder's file is still there
    with RunDirLock(tmp_path) as lock:  # flock died with its holder: the stale file does not block
        assert lock.held and json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
        with pytest.raises(rlvr.errors.OutputDirError, match=f"pid {os.getpid()}"):
            RunDirLock(tmp_path).acquire()  # a second locker (another open file) is refused
    assert not (tmp_path / LOCK_FILE).exists()  # released: nothing left in the run dir


# ---------------------------------------------------------------- 4.2: export of a testbed LoRA
def test_export_merges_a_lora_trained_on_the_testbed_policy_offline(tmp_path, monkeypatch, capsys):
    import dataclasses

    import rlvr.testbed.model as tm
    from rlvr.config import ModelConfig
    from rlvr.lora import apply_lora, write_base_model_spec
    from rlvr.models import MODEL_SOURCES, load_policy
    from rlvr.tasks import TASK_TYPES

    monkeypatch.setitem(tm.PRESETS, "micro", dataclasses.replace(tm.PRESETS["micro"], steps=4, batch_size=8))
    cfg = ModelConfig(name_or_path="testbed:micro", cache_dir=str(tmp_path / "cache"), lora={"r": 2})
    model, tok = load_policy(cfg)  # pre-trains the (shortened) micro testbed into the cache
    model = apply_lora(model, cfg.lora, base_model_spec=cfg.model_dump(mode="json", exclude={"lora"}))  # as the trainer does
    adapter = tmp_path / "final"
    model.save_pretrained(adapter, safe_serialization=True)
    tok.save_pretrained(adapter)
    write_base_model_spec(model, adapter)
    # as in a fresh `rlvr export` process: nothing registers the testbed until the command imports it
    saved = [(reg, reg.pop("testbed")) for reg in (MODEL_SOURCES, TASK_TYPES)]
    monkeypatch.delitem(sys.modules, "rlvr.testbed")
    try:
        code = cli.main(["export", str(adapter), "--merge", "--out", str(tmp_path / "merged")])
    finally:
        for reg, fn in saved:
            reg.pop("testbed", None)
            reg.register("testbed")(fn)
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "merged" / "model.safetensors").is_file() and (tmp_path / "merged" / "config.json").is_file()


# ---------------------------------------------------------------- 4.4 and 4.15: compare budgets
def test_a_rollout_budget_below_one_round_exits_2_naming_the_minimum(tmp_path, capsys, no_model_loads):
    code = cli.main(["compare", "--arm", "a=grpo", "--seeds", "0", "--budget", "rollouts=3",
                     "--out", str(tmp_path / "cmp"), *TINY])  # TINY: generation_batch_size=4
    err = capsys.readouterr().err
    assert code == 2, err
    assert "rollouts=3" in err and "the minimum is rollouts=4" in err, err
    assert not (tmp_path / "cmp").exists() or not list((tmp_path / "cmp").rglob("result.json"))


def test_compare_step_bar_counts_to_the_budget_not_the_step_cap(tmp_path, monkeypatch):
    import rlvr.trainer.trainer as trainer_mod

    totals = []
    real = trainer_mod.RunLogger

    def spy(out, total_steps, **kw):
        totals.append(total_steps)
        return real(out, total_steps, **kw)

    monkeypatch.setattr(trainer_mod, "RunLogger", spy)
    code = cli.main(["compare", "--arm", "a=grpo", "--seeds", "0", "--budget", "rollouts=8",
                     "--out", str(tmp_path / "cmp"), *TINY])
    assert code == 0
    assert totals == [2]  # 8 rollouts = 2 rounds of 4, one update each (not max_steps_cap=100000)


# ---------------------------------------------------------------- 4.5: rows that all repeat held-out ones
def test_a_jsonl_whose_rows_all_repeat_the_held_out_ones_is_refused_before_loading(tmp_path, capsys, no_model_loads):
    data = tmp_path / "dup.jsonl"
    data.write_text('{"question": "1+1?", "answer": "#### 2"}\n' * 6)
    code = train_tiny(tmp_path, "task.type=jsonl", f"task.path={data}", "task.eval_size=2")
    err = capsys.readouterr().err
    assert code == 2, err
    (line,) = _rlvr_lines(err)
    assert str(data) in line and "repeat a held-out question" in line and "task.eval_path" in line


# ---------------------------------------------------------------- 4.7: trackers, and a failed start
def test_wandb_without_a_key_is_refused_before_loading_and_leaves_no_config(tmp_path, capsys, monkeypatch, no_model_loads):
    pytest.importorskip("wandb")
    for k in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DISABLED", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(k, raising=False)
    (tmp_path / "netrc").write_text("")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))  # no settings file with a key
    code = train_tiny(tmp_path, "logging.report_to=[wandb]")
    err = capsys.readouterr().err
    assert code == 2, err
    assert "no W&B API key" in err and "WANDB_MODE=offline" in err
    assert not (tmp_path / "run" / "config.yaml").exists()
    from rlvr.loggers import check_report_to

    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password 0123456789abcdef\n")  # `wandb login`
    check_report_to(["wandb"])  # a key found: accepted


def test_a_start_that_fails_after_loading_does_not_block_the_next_start(tmp_path, capsys, monkeypatch):
    import rlvr.trainer.trainer as trainer_mod
    from rlvr.errors import RlvrError

    def no_template(*a, **k):
        raise RlvrError("the tokenizer has no chat template")

    monkeypatch.setattr(trainer_mod, "Trainer", no_template)
    assert train_tiny(tmp_path) == 1
    assert "no chat template" in capsys.readouterr().err
    monkeypatch.undo()
    assert train_tiny(tmp_path) == 0, capsys.readouterr().err  # not "already holds a run (config.yaml)"
    assert (tmp_path / "run" / "config.yaml").is_file()


# ---------------------------------------------------------------- 4.10: inputs that are no regular files
def test_a_fifo_as_config_exits_2_at_once(tmp_path, capsys):
    import threading

    fifo = tmp_path / "cfg.yaml"
    os.mkfifo(fifo)
    result = []
    t = threading.Thread(target=lambda: result.append(cli.main(["train", "--config", str(fifo)])), daemon=True)
    t.start()
    t.join(timeout=30)
    if t.is_alive():  # blocked in open(): unblock it (a writer that closes at once) before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(timeout=10)
        pytest.fail("rlvr train --config FIFO blocked in open()")
    assert result == [2]
    err = capsys.readouterr().err
    assert "named pipe (FIFO)" in err and str(fifo) in err


@pytest.mark.parametrize("kind", ["device", "fifo_data", "fifo_reward", "oversized"])
def test_configs_data_and_reward_files_must_be_regular_files(tmp_path, capsys, no_model_loads, kind):
    if kind == "device":
        argv, needle = ["--config", "/dev/null"], "'/dev/null' is a character device"  # /dev/zero would never end
    elif kind == "oversized":
        big = tmp_path / "big.yaml"
        big.write_text("# " + "x" * (1 << 20) + "\nmax_steps: 1\n")  # valid YAML, but no config is a MiB
        argv, needle = ["--config", str(big)], "larger than 1024 KiB"
    else:
        fifo = tmp_path / "pipe"
        os.mkfifo(fifo)
        argv = ["task.type=jsonl", f"task.path={fifo}"] if kind == "fifo_data" else [f"task.reward_fn={fifo}.py:f"]
        if kind == "fifo_reward":
            os.rename(fifo, f"{fifo}.py")
        needle = "named pipe (FIFO)"
    code = cli.main(["train", *TINY, f"logging.output_dir={tmp_path / 'run'}", *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err, err


# ---------------------------------------------------------------- 4.14: plot and export targets
@pytest.mark.parametrize("rows", ["", "garbage\n", '{"step": 1}\n'])
def test_plot_of_a_run_without_plottable_rows_exits_2_in_one_line(tmp_path, capsys, rows):
    (tmp_path / "metrics.jsonl").write_text(rows)
    code = cli.main(["plot", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(_rlvr_lines(err)) == 1 and "Traceback" not in err and "metrics.jsonl" in err


@pytest.mark.parametrize("target", ["under_a_file", "a_link", "a_file"])
def test_export_out_that_cannot_be_written_is_refused_before_merging(tmp_path, capsys, no_model_loads, target):
    adapter = tmp_path / "final"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    out = {"under_a_file": tmp_path / "f" / "merged", "a_file": tmp_path / "f", "a_link": tmp_path / "link"}[target]
    if target == "a_link":
        out.symlink_to(tmp_path / "d")
    code = cli.main(["export", str(adapter), "--merge", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--out" in err and str(out) in err, err


# ---------------------------------------------------------------- families: YAML coercion, model names
@pytest.mark.parametrize("override, needle", [
    ("max_steps=true", "max_steps: expected a number, got the boolean true"),
    ("learning_rate=yes", "learning_rate: expected a number, got the boolean true"),
    ("task.name=no", "put the value in quotes"),
    ("model.revision=1.10", "put the value in quotes"),
])
def test_values_yaml_coerces_into_the_wrong_type_are_refused(tmp_path, capsys, no_model_loads, override, needle):
    assert train_tiny(tmp_path, override) == 2
    assert needle in capsys.readouterr().err


def test_a_yaml_1_1_exponent_without_a_dot_is_still_a_number(tmp_path):
    from rlvr.config import build_config

    f = tmp_path / "c.yaml"
    f.write_text("learning_rate: 1e-5\nlogging:\n  progress: no\n")  # PyYAML reads 1e-5 as a string
    cfg = build_config([f])
    assert cfg.learning_rate == 1e-5 and cfg.logging.progress is False


@pytest.mark.parametrize("name", ["foo bar", "-x", "x" * 97])
def test_a_model_name_no_hub_repo_can_have_exits_2_before_loading(tmp_path, capsys, no_model_loads, name):
    code = cli.main(["train", *[a for a in TINY if not a.startswith("model.name_or_path=")],
                     f"model.name_or_path={name}", f"logging.output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"model.name_or_path {name!r}" in err


# ---------------------------------------------------------------- 4.15: friction
def test_text_the_testbed_tokenizer_cannot_encode_is_warned_about_with_a_count():
    from rlvr.samplers.group import PromptEncoder
    from rlvr.tasks.base import Problem
    from rlvr.testbed.model import build_tokenizer

    enc = PromptEncoder(build_tokenizer(), "", 64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        enc(Problem(uid="p1", question="R:abcé9=", answer="cba"))
        enc(Problem(uid="p2", question="R:abc=", answer="cba"))
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == 1 and "'p1' has 2 character(s) the tokenizer cannot encode ('9', 'é')" in msgs[0]
    assert enc.unencodable == 2


def test_readme_describes_the_reward_functions_problem_argument_and_the_file_form():
    # the README's reward-function paragraph moved to docs/configuration.md (issue 40 item 4)
    readme = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert "path/to/file.py:function" in readme
    section = readme[readme.index("`problem` is an"):][:800]
    assert "rlvr.tasks.Problem" in section and "not a dict" in section and "after the last `####`" in section

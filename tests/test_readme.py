"""Every command of README.md and of the guide pages it moved into (docs/usage.md, docs/configuration.md)
runs as written, with the tiny model substituted (issue 12, item 11; issue 40 item 4 split the README).

Each ``rlvr ...`` line of a page's bash blocks runs in-process (in a scratch working folder of its own per
page, so each page stands alone as a reader follows it) with extra ``key=value`` overrides appended that swap
in ``model.name_or_path=tiny``, a reward function giving in-group variance, one or two steps and short
completions; everything else (recipes, flags, output dirs, the order of the commands) is the page's own.
A ``py`` or ``yaml`` block whose first line is ``# name.ext`` is written to that file first. The README's
Python block runs with the same overrides added to its ``build_config`` call. Commands that are not rlvr's
are listed in NOT_RLVR below (a new one fails the test, so it gets a decision).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from rlvr import cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "docs" / "usage.md", ROOT / "docs" / "configuration.md"]
"""The README and the guide pages whose commands are run here."""
MODEL = ["model.name_or_path=tiny", "task.reward_fn=rlvr.testing:even_length_reward", "task.train_size=8",
         "task.eval_size=4", "reward_timeout_s=0", "logging.progress=false", "logging.tensorboard=false"]
"""What every command gets: the tiny model, a reward with in-group variance, small splits, no bars."""
SMALL = [*MODEL, "num_generations=2", "generation_batch_size=4", "per_device_train_batch_size=4",
         "max_completion_length=64", "max_prompt_length=64", "eval.num_samples=2", "eval.ks=[1,2]"]
BY_COMMAND = {
    "train": [*SMALL, "max_steps=1", "save_steps=1"],
    "eval": [*SMALL, "--limit", "2"],
    # the arms keep their own geometry (an arm that does not fit the common config must fail here too);
    # one process: no spawn start-up per worker
    "compare": [*MODEL, "--budget", "steps=1", "--jobs", "1"],
    "plot": [],
    "eval-merge": [],
}
SHARD_OFFSET = "2"
"""``--offset`` of a README shard command here: the tiny split has 3 rows, so the README's offset (into
GSM8K's 1,319) becomes the last row; the command keeps its shape (and eval-merge its two shards)."""
NOT_RLVR = {"make test", "make demo", "make vllm-env", "tensorboard --logdir runs/x/tb"}
NEEDS_VLLM = "engine=vllm"
"""Commands that need the separate vLLM environment: run by ``make test-vllm`` (tests/vllm), not here."""


def _blocks(lang: str, page: Path = README) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)


def _commands(page: Path = README) -> list[str]:
    out = []
    for block in _blocks("bash", page):
        for cmd in block.replace("\\\n", " ").splitlines():
            cmd = " ".join(shlex.split(cmd, comments=True))
            if cmd:
                out.append(cmd)
    return out


def test_the_readme_has_commands():
    cmds = _commands()
    assert sum(c.startswith("rlvr ") for c in cmds) >= 7, cmds  # a screen of use stays in the README
    for page in PAGES:
        cmds = _commands(page)
        assert any(c.startswith("rlvr ") for c in cmds), f"{page.name} has no rlvr command"
        unknown = [c for c in cmds if not c.startswith(("rlvr ", "torchrun ")) and c not in NOT_RLVR]
        assert not unknown, f"{page.name} command(s) neither run here nor listed in NOT_RLVR: {unknown}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_readme_command_runs_on_the_tiny_model(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("my_overrides.yaml").write_text("learning_rate: 2.0e-5\n")  # the guide's "your own overrides" file
    Path("gsm8k_test.jsonl").write_text("".join(  # the guide's "your copy of the GSM8K test split"
        f'{{"question": "What is {i} + {i}?", "answer": "#### {2 * i}"}}\n' for i in range(3)))
    for block in _blocks("py", page) + _blocks("yaml", page):  # files the commands use (`# my_env.py` first)
        name = block.splitlines()[0].lstrip("# ").strip()
        if re.fullmatch(r"[\w.-]+\.(py|yaml)", name):
            Path(name).write_text(block)
    for cmd in _commands(page):
        if not cmd.startswith("rlvr ") or NEEDS_VLLM in cmd:
            continue
        argv = shlex.split(cmd)[1:]
        if "--offset" in argv:
            argv[argv.index("--offset") + 1] = SHARD_OFFSET
        try:
            code = cli.main(argv + BY_COMMAND.get(argv[0], []))
        except SystemExit as exc:  # --version, --help
            code = exc.code
        out = capsys.readouterr()
        assert code == 0, f"{page.name} command failed ({code}): {cmd}\n{out.err[-3000:]}"


def test_the_readme_python_example_runs(tmp_path, monkeypatch):
    import rlvr.config

    monkeypatch.chdir(tmp_path)
    real = rlvr.config.build_config

    def small(files=None, overrides=None, base=None):
        return real(files, [*(overrides or []), *SMALL, "max_steps=1"], base)

    monkeypatch.setattr(rlvr.config, "build_config", small)
    (block,) = _blocks("python")
    exec(compile(block, str(README), "exec"), {})
    assert (tmp_path / "runs" / "rlvr" / "metrics.jsonl").exists()


def test_the_readme_torchrun_commands_parse():
    """``torchrun ... -m rlvr train ...`` lines: torchrun's own flags are torchrun's (launches are run by
    tests/distributed, slow); the rlvr part must parse and build a valid config as written."""
    from rlvr.config import build_config

    runs = [c for page in PAGES for c in _commands(page) if c.startswith("torchrun ")]
    assert len(runs) >= 2
    for cmd in runs:
        argv = shlex.split(cmd)
        assert "-m" in argv and argv[argv.index("-m") + 1] == "rlvr", cmd
        args = cli.build_parser().parse_args(argv[argv.index("-m") + 2:])
        assert args.command == "train"
        build_config(args.config, args.overrides)

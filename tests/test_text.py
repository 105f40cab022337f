"""Counts in messages are pluralised correctly (a run summary said "1 steps")."""

from __future__ import annotations

import time
from pathlib import Path

from rlvr.util.text import plural
from rlvr.trainer.lifecycle import RunSummary


def test_plural_by_count():
    assert plural(1, "step") == "1 step" and plural(1.0, "step") == "1 step"
    assert plural(0, "error") == "0 errors" and plural(2, "step") == "2 steps"
    assert plural(3, "process", "processes") == "3 processes" and plural(1, "process", "processes") == "1 process"
    assert plural(0.5, "second") == "0.5 seconds"
    assert plural("2 of 4", "problem") == "2 of 4 problems"  # eval's count of a shard


def test_run_summary_of_one_step_one_call_one_error_one_timeout():
    s = RunSummary()
    s.t0, s.start_step, s.calls, s.errors, s.timeouts = time.perf_counter(), 0, 1, 1, 1
    text = s.text(1, Path("runs/x/checkpoint-1"), "finished")
    assert "run finished: 1 step (1 -> 1) in" in text
    assert "verifier: 1 call, 1 error, 1 timeout" in text
    assert "steps" not in text and "calls" not in text and "errors" not in text

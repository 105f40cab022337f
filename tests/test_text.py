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


def test_run_summary_counts_the_learned_reward_components_failures():
    from types import SimpleNamespace

    scorer = SimpleNamespace(calls_total=0, errors_total=0, timeouts_total=0, names=["verifier", "judge", "rm"],
                             learned={1: object(), 2: object()})
    s = RunSummary()
    s.start(SimpleNamespace(global_step=0, scorer=scorer))
    s.observe({"reward/mean": 0.1, "judge/calls": 8.0, "judge/failures": 3.0, "judge/timeouts": 2.0,
               "judge/parse_failures": 1.0, "rm/calls": 0.0})
    s.observe({"reward/mean": 0.2, "judge/calls": 4.0, "judge/failures": 0.0, "judge/timeouts": 0.0})
    s.observe({"verifier/calls": 99.0})  # a step without the judge's rows adds nothing to it
    assert s.learned["judge"] == {"calls": 12, "failures": 3, "timeouts": 2, "parse_failures": 1}
    text = s.text(2, None, "finished")
    assert "  judge: 12 calls, 3 failures (2 timeouts, 1 parse failure; 25% scored failure_score)" in text
    assert "rm:" not in text  # never called: no line


def test_run_summary_has_no_learned_lines_for_a_verifier_only_scorer():
    from types import SimpleNamespace

    s = RunSummary()
    s.start(SimpleNamespace(global_step=0, scorer=SimpleNamespace(calls_total=0, errors_total=0, timeouts_total=0)))
    s.observe({"reward/mean": 0.5, "judge/calls": 3.0})
    assert s.learned == {} and "judge" not in s.text(1, None, "finished")

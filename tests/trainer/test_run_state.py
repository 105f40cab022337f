"""RunState: the loop state a checkpoint serialises (src/rlvr/trainer/run_state.py)."""

import json

import pytest

from rlvr.trainer.run_state import COUNTERS, RunState, run_state_field


def test_counters_round_trip_through_json():
    st = RunState(global_step=7, generation_round=4, rollout_round=6, weight_version=7, num_tokens=1234,
                  consecutive_nonfinite=2, carry=["rows"], pending_round={"next_index": 1})
    saved = json.loads(json.dumps(st.counters()))  # what trainer_state.json holds
    assert saved == {"global_step": 7, "generation_round": 4, "rollout_round": 6, "weight_version": 7,
                     "num_tokens": 1234, "consecutive_nonfinite": 2}
    back = RunState.from_counters(saved)
    assert back.counters() == st.counters()
    assert back.carry == [] and back.pending_round is None and back.resume_round is None  # not counters


def test_old_files_default_the_newer_counters():
    back = RunState.from_counters({"global_step": 3, "generation_round": 2, "num_tokens": 9})
    assert (back.rollout_round, back.weight_version, back.consecutive_nonfinite) == (2, 3, 0)
    with pytest.raises(KeyError):
        RunState.from_counters({"global_step": 3})


def test_trainer_views_forward_to_the_state():
    class Holder:
        global_step = run_state_field("global_step")
        _carry = run_state_field("carry")

        def __init__(self):
            self.run_state = RunState()

    h = Holder()
    h.global_step += 2
    h._carry = ["b"]
    assert h.run_state.global_step == 2 and h.run_state.carry == ["b"]
    assert set(COUNTERS) <= set(RunState.__dataclass_fields__)
    with pytest.raises(ValueError, match="not a RunState field"):
        run_state_field("_carry")

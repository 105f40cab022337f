"""Bad input at run time: broken data rows, missing model paths, non-finite losses (issue 3)."""

from __future__ import annotations

import json
import math
import time


import pytest
import torch

from rlvr import cli


from rlvr.testing import ToyTask, small_config  # noqa: E402





def _jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    "bad_row, needles",
    [
        ({"answer": "#### 3"}, ["train_rows.jsonl:3", "question"]),
        ("{not json", ["train_rows.jsonl:3"]),
    ],
)
def test_data_row_missing_a_field_exits_2_naming_file_and_row(tmp_path, capsys, monkeypatch, bad_row, needles):
    import rlvr.models

    monkeypatch.setattr(rlvr.models, "load_policy", lambda *a, **k: pytest.fail("model loaded before the data check"))
    f = _jsonl(tmp_path / "train_rows.jsonl", [{"question": "1+1?", "answer": "#### 2"}] * 2 + [bad_row])
    code = cli.main(["train", "task.type=jsonl", f"task.path={f}", "task.eval_size=1", f"logging.output_dir={tmp_path / 'o'}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "train_rows.jsonl" in err
    for n in needles:
        assert n in err, (n, err)


def test_missing_model_path_is_a_clear_fast_error(tmp_path, capsys):
    f = _jsonl(tmp_path / "d.jsonl", [{"question": f"{i}+1?", "answer": f"#### {i + 1}"} for i in range(4)])
    missing = tmp_path / "no_such_model_dir"
    t = time.perf_counter()
    code = cli.main(["train", "task.type=jsonl", f"task.path={f}", "task.eval_size=1",
                     f"model.name_or_path={missing}", f"logging.output_dir={tmp_path / 'o'}"])
    err = capsys.readouterr().err
    assert code == 2, err  # bad input, found before any model loads: a configuration error
    assert str(missing) in err and "does not exist" in err and "model.name_or_path" in err
    assert time.perf_counter() - t < 20  # no hub retries with back-off


def _nan_after(n_good: int):
    """A mask hook making the loss NaN on every call after the first ``n_good`` (counted per micro-batch call)."""
    calls = {"n": 0}

    def hook(micro, logp, old_logp):
        calls["n"] += 1
        m = torch.ones_like(logp)
        return m * math.nan if calls["n"] > n_good else m

    return hook


def test_nonfinite_loss_skips_updates_then_stops_with_checkpoint_and_message(tmp_path, tiny):
    from rlvr.trainer.checkpoint import latest_checkpoint
    from rlvr.trainer.trainer import Trainer
    from rlvr.errors import TrainingError

    factory, tok = tiny
    cfg = small_config(tmp_path, "max_steps=10", "max_consecutive_nonfinite=3", "reward_timeout_s=0",
                       "per_device_train_batch_size=8")
    tr = Trainer(cfg, factory(0), tok, ToyTask(), extra_mask_fns=[_nan_after(1)])  # update 1 is fine
    seen = []
    tr.callbacks.append(lambda t, m: seen.append((dict(m), {k: v.clone() for k, v in t.model.state_dict().items()})))
    with pytest.raises(TrainingError, match=r"3 consecutive updates had a non-finite loss.*step 4.*checkpoint"):
        tr.train()
    assert [m["actor/skipped_nonfinite"] for m, _ in seen] == [0.0, 1.0, 1.0, 1.0]
    after_first = seen[0][1]
    for _, weights in seen[1:]:  # skipped updates leave the weights exactly as they were
        assert all(torch.equal(weights[k], after_first[k]) for k in weights)
    assert math.isnan(seen[1][0]["actor/grad_norm"])
    ck = latest_checkpoint(tmp_path)
    assert ck is not None and ck.name == "checkpoint-4"
    state = json.loads((ck / "trainer_state.json").read_text())
    assert state["consecutive_nonfinite"] == 3
    lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["actor/skipped_nonfinite"] for r in lines] == [0.0, 1.0, 1.0, 1.0]


def test_isolated_nonfinite_updates_do_not_stop_the_run(tmp_path, tiny):
    from rlvr.trainer.trainer import Trainer

    calls = {"n": 0}

    def every_other(micro, logp, old_logp):
        calls["n"] += 1
        return torch.ones_like(logp) * (math.inf if calls["n"] % 2 == 0 else 1.0)

    factory, tok = tiny
    cfg = small_config(tmp_path, "max_steps=4", "max_consecutive_nonfinite=2", "reward_timeout_s=0",
                       "per_device_train_batch_size=8")
    tr = Trainer(cfg, factory(0), tok, ToyTask(), extra_mask_fns=[every_other])
    seen = []
    tr.callbacks.append(lambda t, m: seen.append(m["actor/skipped_nonfinite"]))
    tr.train()
    assert seen == [0.0, 1.0, 0.0, 1.0] and tr.global_step == 4

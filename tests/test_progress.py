"""Progress on terminals and in log files (issue 12, item 10)."""

from __future__ import annotations

import io

from rlvr.util.progress import progress_bar


def test_a_log_file_gets_whole_periodic_lines_not_one_status_per_update():
    out = io.StringIO()
    bar = progress_bar(total=500, desc="train", unit="step", stream=out, interval=3600)
    for _ in range(500):
        bar.update(1)
    bar.close()
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert 1 <= len(lines) <= 3, lines  # the first refresh and the final state, not 500 statuses
    assert "500/500" in lines[-1] and lines[-1].startswith("train")


def test_the_rollouts_of_a_generation_round_are_counted(tmp_path, tiny, monkeypatch):
    import rlvr.util.progress
    from rlvr.testing import ToyTask, small_config
    from rlvr.trainer.trainer import Trainer

    counts = []
    real = rlvr.util.progress.progress_bar

    def spy(*a, **k):
        bar = real(*a, **{**k, "stream": io.StringIO()})
        if k.get("unit") == "rollout":
            counts.append(bar)
        return bar

    monkeypatch.setattr(rlvr.util.progress, "progress_bar", spy)
    factory, tok = tiny
    cfg = small_config(tmp_path, "reward_timeout_s=0", "logging.tensorboard=false", "logging.progress=true")
    tr = Trainer(cfg, factory(0), tok, ToyTask())
    tr.train()
    assert [b.n for b in counts] == [8, 8] and [b.total for b in counts] == [8, 8]
    assert tr.engine.on_generated is None


def test_testbed_pretraining_shows_progress(monkeypatch):
    import rlvr.util.progress
    from rlvr.testbed.model import parse_spec, pretrain

    bars = []
    real = rlvr.util.progress.progress_bar

    def spy(*a, **k):
        bars.append(real(*a, **{**k, "stream": io.StringIO()}))
        return bars[-1]

    monkeypatch.setattr(rlvr.util.progress, "progress_bar", spy)
    _, spec = parse_spec("testbed")
    import dataclasses

    pretrain(dataclasses.replace(spec, steps=3, batch_size=2))
    assert bars and bars[0].n == 3 and bars[0].total == 3 and "testbed" in bars[0].desc

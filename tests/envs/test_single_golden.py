"""The ``single`` environment is every existing task as a one-turn episode: golden recipes
(``tests/golden``) give bit-identical metrics through it, so the multi-turn sampler, the loss mask and
the episode bookkeeping change nothing for a one-turn run."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "golden"))
from golden_cases import FIXTURE, run_config  # noqa: E402

GOLDEN = json.loads(FIXTURE.read_text())


def _with_env(config: dict) -> dict:
    config = json.loads(json.dumps(config))
    config["env"] = {"type": "single"}
    return config


def _differences(got: list[dict], want: list[dict]) -> list[str]:
    assert len(got) == len(want)
    bad = []
    for step, (g, w) in enumerate(zip(got, want), start=1):
        assert g["env/turns_mean"] == 1.0  # it really ran episodes
        bad += [f"step {step} {k}: got {g.get(k)!r}, want {w[k]!r}" for k in sorted(w)
                if not (math.isnan(w[k]) and math.isnan(g[k])) and g.get(k) != w[k]]
    return bad


def test_grpo_recipe_through_the_single_env_gives_the_recorded_metrics(tmp_path):
    want = GOLDEN["grpo"]
    got = run_config(_with_env(want["config"]), want["task"], tmp_path)
    assert not _differences(got, want["steps"])


def test_dapo_recipe_through_the_single_env_is_bit_identical(tmp_path):
    """DAPO: dynamic sampling (batches merged), overlong shaping and filtering read the model lengths."""
    want = GOLDEN["dapo"]
    plain = run_config(json.loads(json.dumps(want["config"])), want["task"], tmp_path / "plain")
    got = run_config(_with_env(want["config"]), want["task"], tmp_path / "env")
    assert "dynamic_sampling/num_gen_batches" in got[0] and "rewards/overlong/mean" in got[0]
    assert not _differences(got, plain)

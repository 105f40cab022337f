"""The ``env:`` section: refused before any model loads (exit 2) when it cannot work; the GRPO family
runs on environments (issue 26 items 1 and 8)."""

from __future__ import annotations

import math

import pytest

from rlvr import cli
from rlvr.config import build_config
from rlvr.errors import ConfigError
from rlvr.trainer.components import validate_components

from cli_fixtures import TINY


@pytest.fixture
def no_model_loads(monkeypatch):
    import rlvr.models

    monkeypatch.setattr(rlvr.models, "load_policy", lambda *a, **k: pytest.fail("a model was loaded"))


def _check(*overrides: str, recipe: str | None = None) -> None:
    validate_components(build_config([recipe] if recipe else None, list(overrides)))


@pytest.mark.parametrize("overrides, needles", [
    (["env.type=no_such_module_xyz:MyEnv"], ["env.type", "no_such_module_xyz", "No module named"]),
    (["env.type=rlvr.envs:NoSuchEnv"], ["env.type", "has no attribute 'NoSuchEnv'"]),
    (["env.type=singel"], ["env.type: unknown name 'singel'", "did you mean 'single'"]),
    (["env.type=feedback", "env.max_retrys=2"], ["env.max_retrys", "takes no argument", "max_retries"]),
    (["env.type=tools", "env.max_tool_call=3"], ["env.max_tool_call", "takes no argument", "max_tool_calls"]),
    (["sampler=multiturn"], ["sampler: multiturn needs an environment"]),
    (["env.type=single", "sampler=tree"], ["sampler: tree", "IB-TPO", "no tree to fork"]),
    (["env.type=single", "sampler=feedback"], ["sampler: feedback", "env.type=feedback"]),
])
def test_bad_env_configs_are_refused(overrides, needles):
    with pytest.raises(ConfigError) as e:
        _check(*overrides)
    for n in needles:
        assert n in str(e.value), (n, str(e.value))


def test_an_env_module_that_fails_on_import_exits_2_before_the_model_loads(tmp_path, monkeypatch, capsys, no_model_loads):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken_env_mod.py").write_text("import no_such_dependency_abc\n")
    code = cli.main(["train", *TINY, "env.type=broken_env_mod:Env", f"logging.output_dir={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "env.type='broken_env_mod:Env'" in err and "no_such_dependency_abc" in err
    assert not (tmp_path / "out").exists()



@pytest.mark.parametrize("sampler, needle", [("tree", "no tree to fork"), ("feedback", "env.type=feedback")])
def test_tree_and_feedback_samplers_on_an_env_exit_2_before_the_model_loads(sampler, needle, tmp_path, capsys,
                                                                             no_model_loads):
    """Issue 26 item 8: refused through the CLI (exit 2, saying why), nothing loaded or written."""
    code = cli.main(["train", *TINY, "env.type=feedback", f"sampler={sampler}", f"logging.output_dir={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"sampler: {sampler}" in err and needle in err, err
    assert not (tmp_path / "out").exists()

FAMILY = {
    "grpo": [],
    "dr_grpo": [],
    "dapo": ["dynamic_sampling.max_num_gen_batches=8", "overlong_buffer_len=2"],
    "gspo": ["steps_per_generation=1"],
    "mu_grpo_small": ["steps_per_generation=2", "generation_batch_size=16", "max_steps=2"],
}


@pytest.mark.parametrize("recipe", sorted(FAMILY))
def test_the_family_trains_on_an_environment(recipe, tmp_path, tiny):
    """One step (μ-GRPO: its staged schedule's two) of each recipe on the feedback environment."""
    from rlvr.testing import ToyTask
    from rlvr.trainer.trainer import Trainer

    make, tok = tiny
    cfg = build_config([recipe], [
        "num_generations=4", "generation_batch_size=8", "per_device_train_batch_size=4", "max_completion_length=6",
        "max_prompt_length=64", "max_steps=1", "learning_rate=1e-3", "logging.progress=false",
        "logging.tensorboard=false", "logging.log_completions_steps=0", "reward_timeout_s=0", "beta=0.01",
        f"logging.output_dir={tmp_path}", "env.type=feedback", "env.max_retries=1", "env.max_turns=2",
        "env.max_tokens=64", *FAMILY[recipe]])
    rows = []
    tr = Trainer(cfg, make(0), tok, ToyTask())
    tr.callbacks.append(lambda t, m: rows.append(dict(m)))
    tr.train()
    assert rows and rows[0]["env/turns_mean"] >= 1 and "env/finish/env_done" in rows[0]
    trained = [r for r in rows if r.get("actor/num_loss_tokens", 0) > 0]
    assert trained and all(math.isfinite(r["actor/grad_norm"]) for r in trained)

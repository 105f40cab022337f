"""Config: YAML + overrides, aliases, validation messages that name the key."""

import pytest

from rlvr.config import RECIPES_DIR, build_config, parse_override
from rlvr.errors import ConfigError


def test_defaults_are_trl_names():
    cfg = build_config()
    assert cfg.num_generations == 8 and cfg.epsilon == 0.2 and cfg.beta == 0.0
    assert cfg.loss_agg_mode == "token-mean" and cfg.kl_estimator == "k3"
    assert cfg.prompts_per_generation == 8


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
def test_every_recipe_validates(recipe):
    build_config([recipe])


def test_recipe_values():
    dapo = build_config(["dapo"])
    assert dapo.epsilon_high == 0.28 and dapo.dynamic_sampling.enable
    dr = build_config(["dr_grpo"])
    assert dr.scale_rewards == "none" and dr.loss_agg_mode == "seq-mean-token-sum-norm"


def test_overrides_parse_types_and_later_wins(tmp_path):
    f = tmp_path / "a.yaml"
    f.write_text("learning_rate: 1.0e-6\ntask:\n  config: {min_terms: 2, max_terms: 3}\n")
    cfg = build_config([f], ["learning_rate=3e-5", "task.config.max_terms=4", "logging.tensorboard=false"])
    assert cfg.learning_rate == pytest.approx(3e-5)
    assert cfg.task.config == {"min_terms": 2, "max_terms": 4}
    assert cfg.logging.tensorboard is False


def test_aliases_translate_with_warning():
    with pytest.warns(UserWarning, match="alias"):
        cfg = build_config(overrides=["clip_ratio_high=0.28", "norm_adv_by_std_in_grpo=false", "kl_coef=0.1",
                                      "loss_reduction=seq_mean_token_mean"])
    assert cfg.epsilon_high == 0.28 and cfg.scale_rewards == "none" and cfg.beta == 0.1
    assert cfg.loss_agg_mode == "seq-mean-token-mean"


def test_scale_rewards_bool_spelling():
    assert build_config(overrides=["scale_rewards=true"]).scale_rewards == "group"
    assert build_config(overrides=["scale_rewards=false"]).scale_rewards == "none"


def test_unknown_key_suggests_nearest():
    with pytest.raises(ConfigError, match=r"learning_rat: unknown key; did you mean 'learning_rate'"):
        build_config(overrides=["learning_rat=1e-5"])
    with pytest.raises(ConfigError, match=r"task.nmae: unknown key; did you mean 'task.name'"):
        build_config(overrides=["task.nmae=chain_sum"])


def test_wrong_type_names_key_and_value():
    with pytest.raises(ConfigError, match=r"num_generations: .*integer.*'eight'"):
        build_config(overrides=["num_generations=eight"])


def test_out_of_range_names_key():
    with pytest.raises(ConfigError, match=r"epsilon: .*less than or equal to 1"):
        build_config(overrides=["epsilon=1.5"])
    with pytest.raises(ConfigError, match=r"clip_ratio_c: .*greater than 1"):
        build_config(overrides=["clip_ratio_c=0.5"])
    with pytest.raises(ConfigError, match=r"num_generations: .*greater than or equal to 2"):
        build_config(overrides=["num_generations=1"])


def test_batch_not_whole_groups():
    with pytest.raises(ConfigError, match=r"generation_batch_size=60 completions is not a whole number of groups"):
        build_config(overrides=["generation_batch_size=60"])
    with pytest.raises(ConfigError, match=r"8 prompts × 8 completions cannot be split into steps_per_generation=3"):
        build_config(overrides=["steps_per_generation=3"])


def test_train_eval_seeds_must_differ():
    with pytest.raises(ConfigError, match="task.seed and task.eval_seed"):
        build_config(overrides=["task.seed=5", "task.eval_seed=5"])


def test_missing_file_lists_recipes():
    with pytest.raises(ConfigError, match="not found.*grpo"):
        build_config(["no_such_recipe"])


def test_yaml_not_mapping(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        build_config([f])


def test_parse_override_errors():
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("learning_rate")
    assert parse_override("a.b=[1, 2]") == ("a.b", [1, 2])
    assert parse_override("x=1e-5") == ("x", 1e-5)


def test_overlong_buffer_longer_than_completion_cap_is_rejected():
    with pytest.raises(ConfigError, match=r"overlong_buffer_len=64 must be ≤ max_completion_length=32"):
        build_config(["dapo"], ["max_completion_length=32"])

"""Config files: duplicate keys refused; TRL's names accepted where the meaning is the same (issue 12,
items 8 and 11)."""

from __future__ import annotations

import pytest

from rlvr.config import build_config
from rlvr.errors import ConfigError


def test_duplicate_yaml_key_is_refused_naming_both_lines(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("learning_rate: 1e-5\nmax_steps: 3\nlogging:\n  output_dir: a\n  output_dir: b\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: duplicate key 'output_dir': first on line 4, again on line 5"):
        build_config([f])
    f.write_text("max_steps: 3\nlearning_rate: 1e-5\nmax_steps: 4\n")
    with pytest.raises(ConfigError, match="duplicate key 'max_steps': first on line 1, again on line 3"):
        build_config([f])


def test_config_file_that_is_a_folder_or_not_utf8(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        build_config([tmp_path])
    f = tmp_path / "c.yaml"
    f.write_bytes(b"max_steps: 3\nname: caf\xe9\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        build_config([f])


def test_trl_output_dir_and_logging_steps():
    with pytest.warns(UserWarning, match="alias"):
        cfg = build_config(overrides=["output_dir=runs/trl", "logging_steps=5"])
    assert cfg.logging.output_dir == "runs/trl" and cfg.logging.logging_steps == 5


def test_gradient_accumulation_steps_sets_the_micro_batch():
    cfg = build_config(overrides=["generation_batch_size=64", "steps_per_generation=2", "gradient_accumulation_steps=4"])
    assert cfg.per_device_train_batch_size == 8  # 64 / 2 completions per update, in 4 micro-batches
    same = build_config(overrides=["gradient_accumulation_steps=8", "per_device_train_batch_size=8"])
    assert same.per_device_train_batch_size == 8
    with pytest.raises(ConfigError, match=r"gradient_accumulation_steps=4 × per_device_train_batch_size=4 = 16"):
        build_config(overrides=["gradient_accumulation_steps=4", "per_device_train_batch_size=4"])
    with pytest.raises(ConfigError, match="does not divide the 64 completions"):
        build_config(overrides=["gradient_accumulation_steps=3"])


def test_num_train_epochs_is_refused_with_the_max_steps_it_would_mean():
    with pytest.raises(ConfigError, match=r"not num_iterations|num_iterations .* means something else") as e:
        build_config(overrides=["num_train_epochs=2", "task.train_size=64"])
    assert "max_steps=16" in str(e.value)  # 2 × 64 prompts / 8 per round × 1 update per round

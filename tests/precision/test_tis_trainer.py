"""The TIS knobs (TRL's names) reach the update: a mismatch ratio of 4 capped at C = 2 doubles the gradient."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.config import build_config
from rlvr.errors import ConfigError
from rlvr.testing import small_config
from rlvr.trainer.forward import batch_logprobs
from rlvr.trainer.trainer import Trainer
from rlvr.trainer.setup import loss_settings
from rlvr.trainer.update import policy_update


def test_config_names_and_defaults():
    cfg = build_config()
    assert cfg.vllm_importance_sampling_correction is False  # off: nothing to correct when both sides are fp32
    assert loss_settings(cfg).rollout_is_mode is None
    cfg = build_config(overrides=["vllm_importance_sampling_correction=true", "tis_imp_ratio_cap=2"])
    s = loss_settings(cfg)
    assert (s.rollout_is_mode, s.rollout_is_clip_max) == ("token_truncate", 2.0)


def test_config_errors_name_the_keys():
    with pytest.raises(ConfigError, match="vllm_importance_sampling_clip_min=3.0 > vllm_importance_sampling_clip_max=2.0"):
        build_config(overrides=["vllm_importance_sampling_correction=true", "vllm_importance_sampling_clip_max=2",
                                "vllm_importance_sampling_clip_min=3"])
    with pytest.raises(ConfigError, match="old_logprob_source=sampler"):
        build_config(overrides=["vllm_importance_sampling_correction=true", "old_logprob_source=sampler",
                                "steps_per_generation=2", "generation_batch_size=16"])


def _grads(tr, batch, cfg_overrides, tmp_path):
    cfg = small_config(tmp_path, *cfg_overrides)
    tr.model.zero_grad(set_to_none=True)
    policy_update(tr.model, tr.optimizer, batch, loss_settings(cfg), pad_token_id=tr.pad_token_id,
                  rows_per_micro=4, step_optimizer=False, max_grad_norm=None)
    return torch.cat([p.grad.flatten() for p in tr.model.parameters() if p.grad is not None])


def test_update_multiplies_policy_gradient_by_truncated_ratio(tmp_path, tiny, toy_task):
    factory, tok = tiny
    tr = Trainer(small_config(tmp_path), factory(0), tok, toy_task)
    batch, _ = tr.generate_batch()
    train_logp, _ = batch_logprobs(tr.model, batch, pad_token_id=tr.pad_token_id)
    batch.sampler_logp = (train_logp - math.log(4.0)) * batch.completion_mask  # the engine "saw" ρ = 4
    g_off = _grads(tr, batch, [], tmp_path)
    g_on = _grads(tr, batch, ["vllm_importance_sampling_correction=true", "vllm_importance_sampling_clip_max=2"],
                  tmp_path)
    assert g_off.abs().max() > 0
    assert torch.allclose(g_on, 2.0 * g_off, rtol=1e-4, atol=1e-7)


def test_training_run_reports_mismatch_metrics(tmp_path, tiny, toy_task):
    factory, tok = tiny
    cfg = small_config(tmp_path, "vllm_importance_sampling_correction=true", "max_steps=1")
    last = Trainer(cfg, factory(0), tok, toy_task).train()
    for k in ("actor/rollout_is_ratio", "actor/rollout_is_ratio/min", "actor/rollout_is_ratio/max",
              "actor/rollout_logp_diff", "actor/rollout_logp_diff/max", "actor/rollout_is_changed"):
        assert k in last, k
    assert last["actor/rollout_is_ratio"] == pytest.approx(1.0, abs=1e-3)  # fp32 on both sides
    assert last["actor/rollout_is_changed"] == 0.0

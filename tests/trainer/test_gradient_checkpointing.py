"""Issue 12 item 4: gradient checkpointing with the default ``share_prompt_forward=true``.

Checkpointed layers keep no KV cache in a training forward, so the shared-prompt path cannot run
there; the update falls back to unshared rows for that call (with a warning) and must give exactly the
gradients of the plain unshared path without checkpointing.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.testing import small_config
from rlvr.models import enable_gradient_checkpointing
from rlvr.trainer.trainer import Trainer
from rlvr.trainer.update import policy_update


def _grads(model, trainer, batch, *, share_prompt):
    res = policy_update(model, trainer.optimizer, batch, trainer.settings, pad_token_id=trainer.pad_token_id,
                        rows_per_micro=4, step_optimizer=False, share_prompt=share_prompt)
    g = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return g, res.metrics["loss/total"]


def test_checkpointed_update_matches_the_unshared_path(tmp_path, tiny, toy_task):
    factory, tok = tiny
    plain = factory(0)
    tr = Trainer(small_config(tmp_path), plain, tok, toy_task)
    batch, _ = tr.generate_batch()
    batch.advantages = torch.linspace(-1, 1, len(batch))
    assert len(set(map(tuple, batch.context_ids))) < len(batch)  # groups share a prompt: sharing would apply
    want, loss_want = _grads(plain, tr, batch, share_prompt=False)

    ckpt = factory(0)
    ckpt.load_state_dict(plain.state_dict())
    enable_gradient_checkpointing(ckpt)
    ckpt.train()
    from rlvr.trainer.forward import shared_prompt_unavailable

    assert shared_prompt_unavailable(ckpt) is not None
    with torch.no_grad():
        assert shared_prompt_unavailable(ckpt) is None  # behaviour / reference log-probs still share
    with pytest.warns(UserWarning, match="gradient_checkpointing"):
        got, loss_got = _grads(ckpt, tr, batch, share_prompt=True)
    assert loss_got == pytest.approx(loss_want, abs=1e-6)
    assert want.abs().sum() > 0
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-5), float((got - want).abs().max())


def test_training_runs_with_gradient_checkpointing_enabled(tmp_path, tiny, toy_task):
    factory, tok = tiny
    model = factory(0)
    cfg = small_config(tmp_path, "model.gradient_checkpointing=true", "max_steps=2", "beta=0.1",
                       "steps_per_generation=2")  # old_logp and ref_logp forwards too
    assert cfg.share_prompt_forward  # the default
    enable_gradient_checkpointing(model)  # what load_policy does for model.gradient_checkpointing=true
    tr = Trainer(cfg, model, tok, toy_task)
    with pytest.warns(UserWarning, match="share_prompt_forward falls back"):
        last = tr.train()
    assert tr.global_step == 2
    assert math.isfinite(last["actor/grad_norm"]) and last["actor/grad_norm"] > 0

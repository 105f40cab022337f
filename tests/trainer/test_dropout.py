"""Dropout is off in the loss forward by default (issue 25 item 2, TRL's ``disable_dropout``): the first
update's ratio on the weights ``old_logp`` came from is exactly 1, with LoRA dropout and with a model
whose attention dropout is a config number."""

from __future__ import annotations

import pytest
import torch

from rlvr.testing import ToyTask, small_config
from rlvr.trainer.forward import completion_logprobs
from rlvr.trainer.setup import disable_dropout


def _loss_forward_gap(tmp_path, tiny, *overrides: str) -> float:
    """max |logp(loss forward, train mode) − old_logp| on the first generation batch."""
    from rlvr.trainer.trainer import Trainer

    factory, tok = tiny
    model = factory(0)
    for m in model.modules():  # as a config with attention_dropout: 0.3 would set it
        if hasattr(m, "attention_dropout"):
            m.attention_dropout = 0.3
    cfg = small_config(tmp_path, "num_iterations=2", "model.lora.r=4", "model.lora.dropout=0.3",
                       "model.lora.init_lora_weights=false", "reward_timeout_s=0", *overrides)
    tr = Trainer(cfg, model, tok, ToyTask())
    batch, _ = tr.generate_batch()
    assert batch.old_logp is not None  # num_iterations=2: old_logp from the trainer, in eval mode
    tr.model.train()  # as OptimizerSteps._update does
    torch.manual_seed(0)
    logp, _ = completion_logprobs(tr.model, batch, pad_token_id=tr.pad_token_id, with_entropy=False)
    mask = batch.completion_mask.bool()
    return float((logp.detach() - batch.old_logp)[mask].abs().max())


def test_first_update_ratio_is_exactly_one_with_dropout_disabled_by_default(tmp_path, tiny):
    assert small_config(tmp_path).disable_dropout is True
    assert _loss_forward_gap(tmp_path / "on", tiny) < 1e-5  # ratio = exp(gap) = 1 up to float32 rounding


def test_disable_dropout_false_keeps_dropout(tmp_path, tiny):
    assert _loss_forward_gap(tmp_path / "off", tiny, "disable_dropout=false") > 1e-2


def test_disable_dropout_covers_modules_and_attention_floats():
    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_dropout, self.resid_pdrop, self.dropout_layers = 0.1, 0.2, 3
            self.drop = torch.nn.Dropout(0.5)
            self.drop2d = torch.nn.Dropout2d(0.0)

    net = torch.nn.Sequential(Attn(), torch.nn.AlphaDropout(0.3))
    assert disable_dropout(net) == 4  # Dropout(0.5), AlphaDropout(0.3), attention_dropout, resid_pdrop
    a = net[0]
    assert (a.attention_dropout, a.resid_pdrop, a.drop.p, net[1].p) == (0.0, 0.0, 0.0, 0.0)
    assert a.dropout_layers == 3  # an int named *dropout* is not a probability
    assert disable_dropout(net) == 0


@pytest.mark.parametrize("value", ["true", "false"])
def test_disable_dropout_is_a_config_key(tmp_path, value):
    assert small_config(tmp_path, f"disable_dropout={value}").disable_dropout is (value == "true")

"""``model.dtype=bf16-master``: bf16 weights, fp32 masters, fp32 gradient accumulation, masters in checkpoints.

Hand-computed values: AdamW's first steps on a constant gradient move a weight by ``lr`` each (m̂ / √v̂ = 1), so
ten steps of ``lr = 1e-3`` from 1.0 land on 0.99 in fp32, which bf16 rounds to 253 · 2⁻⁸ = 0.98828125; each step
alone is below half a bf16 quantum there (2⁻⁹ ≈ 0.00195), so ``bf16-pure`` does not move at all.
"""

from __future__ import annotations

import io

import pytest
import torch

from rlvr.config import build_config
from rlvr.precision.dtype_account import DtypeAccount, account_updates
from rlvr.errors import ConfigError
from rlvr.precision import resolve_precision
from rlvr.testing import small_config
from rlvr.trainer.checkpoint import load_checkpoint, save_checkpoint
from rlvr.trainer.components import validate_components
from rlvr.trainer.master_weights import MasterWeightAdamW
from rlvr.trainer.optim import build_optimizer, gradient_params
from rlvr.trainer.trainer import Trainer


def test_gradients_of_micro_batches_are_summed_in_fp32():
    w = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    opt = MasterWeightAdamW([w], lr=1e-3)
    c1 = torch.tensor([1.0, 256.0, 3.0], dtype=torch.bfloat16)
    c2 = torch.tensor([2.0**-8, 1.0, 2.0**-9], dtype=torch.bfloat16)
    for c in (c1, c2):
        (w * c).sum().backward()  # d/dw = c
        assert w.grad is None  # the hook moved it to the master
    want = c1.float() + c2.float()
    assert torch.equal(opt.master_params[0].grad, want)
    assert not torch.equal((c1 + c2).float(), want)  # a bf16 .grad would have rounded the sum (256 + 1 -> 256)
    assert gradient_params(torch.nn.Module(), opt) == opt.master_params


def test_step_is_fp32_adamw_on_the_masters_then_one_rounding_into_the_weights():
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(4, 5, generator=g).bfloat16()
    grad = torch.randn(4, 5, generator=g)
    w = torch.nn.Parameter(w0.clone())
    ref = torch.nn.Parameter(w0.float())  # plain fp32 AdamW from the same start
    opt = MasterWeightAdamW([w], lr=1e-2, weight_decay=0.1)
    ref_opt = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        (w * grad.bfloat16()).sum().backward()
        ref.grad = grad.bfloat16().float()
        opt.step()
        ref_opt.step()
        opt.zero_grad()
    assert torch.equal(opt.master_params[0], ref.detach())
    assert w.dtype == torch.bfloat16 and torch.equal(w.detach(), ref.detach().bfloat16())
    assert all(s["exp_avg"].dtype == torch.float32 for s in opt.state.values())


def test_updates_below_the_bf16_quantum_accumulate_in_the_master():
    w = torch.nn.Parameter(torch.ones(1, dtype=torch.bfloat16))
    pure = torch.nn.Parameter(torch.ones(1, dtype=torch.bfloat16))
    opt = MasterWeightAdamW([w], lr=1e-3, weight_decay=0.0, eps=1e-12)
    pure_opt = torch.optim.AdamW([pure], lr=1e-3, weight_decay=0.0, eps=1e-12)
    for _ in range(10):
        for p, o in ((w, opt), (pure, pure_opt)):
            o.zero_grad()
            p.sum().backward()  # gradient 1
            o.step()
    assert float(opt.master_params[0].detach()) == pytest.approx(0.99, abs=1e-6)
    assert float(w.detach()) == 0.98828125  # 0.99 rounded to bf16
    assert float(pure.detach()) == 1.0  # bf16-pure: every step of 1e-3 rounds away


def test_fp32_parameters_are_optimized_in_place_and_frozen_ones_ignored():
    a = torch.nn.Parameter(torch.zeros(2))  # e.g. a LoRA adapter peft keeps in fp32
    b = torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))
    frozen = torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16), requires_grad=False)
    opt = MasterWeightAdamW([a, b, frozen], lr=1.0)
    assert opt.master_params[0] is a and opt.master_params[1] is not b and len(opt.master_params) == 2
    with pytest.raises(ValueError, match="no trainable parameter"):
        MasterWeightAdamW([frozen], lr=1.0)
    grouped = MasterWeightAdamW([{"params": [a], "weight_decay": 0.0}, {"params": [b, frozen], "lr": 0.5}], lr=1.0)
    assert [g["lr"] for g in grouped.param_groups] == [1.0, 0.5] and grouped.param_groups[0]["weight_decay"] == 0.0
    assert grouped.param_groups[1]["params"][0] is grouped.master_params[1] and len(grouped.master_params) == 2


def test_state_dict_keeps_the_fp32_masters_and_loads_them_back():
    w = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    opt = MasterWeightAdamW([w], lr=1e-3)
    for _ in range(3):
        w.sum().backward()
        opt.step()
        opt.zero_grad()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    fresh = torch.nn.Parameter(w.detach().clone())  # what a resume loads from the bf16 safetensors
    opt2 = MasterWeightAdamW([fresh], lr=1e-3)
    assert not torch.equal(opt2.master_params[0], opt.master_params[0])  # the weights alone lost the fp32 bits
    opt2.load_state_dict(state)
    assert torch.equal(opt2.master_params[0], opt.master_params[0])
    assert torch.equal(fresh.detach(), w.detach())
    bad = dict(state, master_weights=[torch.zeros(4)])
    with pytest.raises(ValueError, match=r"master weight 0 has shape \(4,\)"):
        MasterWeightAdamW([torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))], lr=1e-3).load_state_dict(bad)


def test_policy_and_config_name_the_mode():
    pol = resolve_precision("bf16-master", log=False, native_bf16=True)
    assert pol.master_weights and not pol.autocast
    assert pol.param_dtype == pol.compute_dtype == pol.generation_dtype == torch.bfloat16
    assert pol.fsdp_mixed_precision_kwargs() == {}
    assert build_config(overrides=["model.dtype=bf16-master"]).model.dtype == "bf16-master"
    assert not resolve_precision("bf16-pure", log=False, native_bf16=True).master_weights


def test_bf16_master_refuses_torchrun_before_any_model_loads(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    validate_components(build_config(overrides=["model.dtype=bf16-master"]))  # no RANK: not launched, one process
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match=r"bf16-master.*WORLD_SIZE > 1.*model.dtype=bf16"):
        validate_components(build_config(overrides=["model.dtype=bf16-master"]))
    validate_components(build_config(overrides=["model.dtype=bf16"]))  # bf16 (FSDP2's masters) is fine
    monkeypatch.setenv("WORLD_SIZE", "abc")
    with pytest.raises(ConfigError, match=r"WORLD_SIZE='abc'.*integer"):
        validate_components(build_config(overrides=["model.dtype=bf16-master"]))


def _master_trainer(tmp_path, tiny, task, *overrides):
    factory, tok = tiny
    cfg = small_config(tmp_path, "model.dtype=bf16-master", *overrides)
    return Trainer(cfg, factory(0).to(torch.bfloat16), tok, task)


def test_trainer_trains_bf16_weights_from_fp32_masters_and_resumes_them(tmp_path, tiny, toy_task):
    tr = _master_trainer(tmp_path / "a", tiny, toy_task, "max_steps=2", "learning_rate=1e-4")
    assert isinstance(tr.optimizer, MasterWeightAdamW) and tr.optimizer.defaults.get("fused")
    assert tr.engine._decode_model is tr.model  # the engine decodes the bf16 weights themselves: no copy
    start = [p.detach().clone() for p in tr.model.parameters()]
    last = tr.train()
    assert last["actor/grad_norm"] > 0 and torch.isfinite(torch.tensor(last["loss/total"]))
    params = list(tr.model.parameters())
    assert all(p.dtype == torch.bfloat16 for p in params)
    for p, m in zip(params, tr.optimizer.master_params):
        assert m.dtype == torch.float32 and torch.equal(p.detach(), m.detach().bfloat16())
    assert any(not torch.equal(p, s) for p, s in zip(params, start))  # it trained
    assert any(not torch.equal(m.detach(), p.detach().float()) for p, m in zip(params, tr.optimizer.master_params))
    ckpt = save_checkpoint(tr, tmp_path / "ckpt")
    tr2 = _master_trainer(tmp_path / "b", tiny, toy_task, "max_steps=2", "learning_rate=1e-4")
    load_checkpoint(tr2, ckpt)
    for m2, m in zip(tr2.optimizer.master_params, tr.optimizer.master_params):
        assert torch.equal(m2, m)  # the fp32 values, not the bf16 weights' rounding
    for p2, p in zip(tr2.model.parameters(), params):
        assert torch.equal(p2, p)


def test_bf16_master_update_converts_no_weight_in_a_micro_batch_and_each_once_per_step(tmp_path, tiny, toy_task):
    """The dtype account of issue 28 on the trainer's real update path: bf16-pure's forward and backward (no
    weight cast while the micro-batches run), every matmul in bf16, and each master rounded into its
    weight once, by the optimizer step."""
    tr = _master_trainer(tmp_path, tiny, toy_task, "max_steps=1", "max_completion_length=6", "logprob_chunk_size=5")
    V = tr.model.get_output_embeddings().weight.shape[0]
    named = dict(tr.model.named_parameters())
    masters = {f"master:{n}": m for n, m in zip(named, tr.optimizer.master_params)}
    acc = DtypeAccount(params={**named, **masters}, vocab_size=V)
    with account_updates(tr, acc):
        tr.train()
    s = acc.summary()
    assert s["micro_batches"] == 2
    assert s["matmul_bf16_fraction"] == 1.0, s["matmul_flops"]
    assert s["max_weight_casts_per_micro_batch"]["__max__"] == 0, s["max_weight_casts_per_micro_batch"]
    assert s["weight_casts_outside"] == {k: 1 for k in masters}, s["weight_casts_outside"]


def test_build_optimizer_switch(tiny):
    factory, _ = tiny
    cfg = build_config(overrides=["learning_rate=1e-3"])
    assert type(build_optimizer(factory(0).parameters(), cfg)) is torch.optim.AdamW
    opt = build_optimizer(factory(0).to(torch.bfloat16).parameters(), cfg, master_weights=True)
    assert isinstance(opt, MasterWeightAdamW) and opt.param_groups[0]["lr"] == 1e-3

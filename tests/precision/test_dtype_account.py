"""The dtype account (rlvr.precision.dtype_account): FLOPs from hand-computed shapes, casts of weights per micro-batch,
full-vocabulary passes, and the bf16 update it was built to check (issue 28)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlvr.precision.dtype_account import DtypeAccount, account_updates, format_account, matmul_flops
from rlvr.testing import small_config
from rlvr.trainer.trainer import Trainer


def test_matmul_flops_from_hand_computed_shapes():
    a, b = torch.empty(3, 5), torch.empty(5, 7)
    assert matmul_flops("aten.mm", (a, b)) == 2 * 3 * 5 * 7
    assert matmul_flops("aten.addmm", (torch.empty(7), a, b)) == 2 * 3 * 5 * 7
    x, y = torch.empty(4, 3, 5), torch.empty(4, 5, 6)
    assert matmul_flops("aten.bmm", (x, y)) == 2 * 4 * 3 * 5 * 6
    assert matmul_flops("aten.baddbmm", (torch.empty(4, 3, 6), x, y)) == 2 * 4 * 3 * 5 * 6
    assert matmul_flops("aten.linear", (torch.empty(2, 3, 5), torch.empty(7, 5)), torch.empty(2, 3, 7)) == 2 * 6 * 5 * 7
    q, k, v = torch.empty(2, 4, 6, 8), torch.empty(2, 4, 10, 8), torch.empty(2, 4, 10, 3)
    fwd = 2 * 2 * 4 * 6 * 10 * 8 + 2 * 2 * 4 * 6 * 10 * 3  # Q Kᵀ and P V
    assert matmul_flops("aten._scaled_dot_product_flash_attention_for_cpu", (q, k, v)) == fwd
    assert matmul_flops("aten._scaled_dot_product_flash_attention_for_cpu_backward",
                        (torch.empty(2, 4, 6, 3), q, k, v)) == 2 * fwd
    assert matmul_flops("aten.add", (a, a)) is None


def test_account_counts_matmuls_attention_and_their_backward_per_dtype():
    a = torch.randn(3, 5, requires_grad=True)
    w = torch.randn(7, 5, requires_grad=True)
    q = torch.randn(1, 2, 4, 8, requires_grad=True)
    with DtypeAccount() as acc:
        (a @ w.t()).sum().backward()  # forward mm, and two mm in backward (grad of a and of w)
        F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
        (a.bfloat16() @ w.bfloat16().t()).float().sum()
    s = acc.summary()
    mm = 3 * (2 * 3 * 5 * 7)
    attn = 2 * 1 * 2 * 4 * 4 * 8 * 2  # forward; the backward is twice that
    assert s["matmul_flops"] == {"float32": mm + 3 * attn, "bfloat16": 2 * 3 * 5 * 7}
    assert s["micro_batches"] == 2  # two forward + backward stretches; the last forward-only one is outside
    assert 0 < s["matmul_bf16_fraction"] < 0.5
    assert s["casts"]["float32->bfloat16"]["calls"] == 2 and s["casts"]["bfloat16->float32"]["calls"] == 1


def test_account_names_the_weight_each_cast_converts_per_micro_batch():
    lin = torch.nn.Linear(4, 6)
    x = torch.randn(2, 4)
    with DtypeAccount(params=dict(lin.named_parameters()), vocab_size=6) as acc:
        for _ in range(2):  # two micro-batches: the weight cast twice in the first, once in the second
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = F.linear(x, lin.weight.t().t())  # a view: not cached by autocast
                y = y + F.linear(x, lin.weight.t().t())
            y.float().sum().backward()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = lin(x)  # the parameter itself: autocast's cache converts it once
                y = y + lin(x)
            y.float().sum().backward()
    s = acc.summary()
    assert s["micro_batches"] == 4
    assert [d.get("weight", 0) for d in s["weight_casts_per_micro_batch"]] == [2, 1, 2, 1]
    assert s["max_weight_casts_per_micro_batch"]["weight"] == 2
    assert s["casts"]["float32->bfloat16"]["weight_bytes_read"] == 2 * (3 * 6 * 4 * 4 + 6 * 4)  # weight 3x, bias 1x
    # [2, 6] outputs have the vocabulary's size 6 in their last dim: the casts of them are vocabulary passes
    assert sum(s["vocab_passes_per_micro_batch"]) > 0
    assert "weight conversions per micro-batch: max 2" in format_account(s)


def _bf16_update_account(tmp_path, tiny, task, *overrides):
    factory, tok = tiny
    cfg = small_config(tmp_path, "model.dtype=bf16", "max_steps=1", "max_completion_length=6", *overrides)
    tr = Trainer(cfg, factory(0), tok, task)
    V = tr.model.get_output_embeddings().weight.shape[0]
    acc = DtypeAccount(params=dict(tr.model.named_parameters()), vocab_size=V)
    with account_updates(tr, acc):
        tr.train()
    return tr, acc.summary()


def test_bf16_update_runs_its_matmuls_in_bf16_and_converts_each_weight_once_per_micro_batch(tmp_path, tiny, toy_task):
    """Issue 28's check, on the trainer's real update path (policy_update through Trainer.train)."""
    tr, s = _bf16_update_account(tmp_path, tiny, toy_task, "logprob_chunk_size=5")
    assert tr.precision.mode == "bf16"
    assert s["micro_batches"] == 2  # 8 rows, 4 per micro-batch
    assert s["matmul_bf16_fraction"] >= 0.95, s["matmul_flops"]
    worst = s["max_weight_casts_per_micro_batch"]
    assert worst["__max__"] == 1, worst  # several LM-head chunks, forward and backward: still one conversion
    names = {n for n, _ in tr.model.named_parameters() if n.endswith("proj.weight")}
    assert names <= set(worst)  # every projection was converted (autocast really ran) ...
    assert s["weight_casts_outside"] == {}  # ... and the optimizer step converts none


def test_fp32_update_runs_no_bf16_and_converts_nothing(tmp_path, tiny, toy_task):
    _, s = _bf16_update_account(tmp_path, tiny, toy_task, "model.dtype=fp32")
    assert set(s["matmul_flops"]) == {"float32"} and s["matmul_bf16_fraction"] == 0
    assert s["max_weight_casts_per_micro_batch"]["__max__"] == 0
    assert "float32->bfloat16" not in s["casts"]


def test_bf16_pure_lm_head_runs_every_matmul_in_bf16():
    """bf16-pure (bf16 weights, no autocast): the head's weight-gradient product used to run in fp32 (an fp32
    gradient times upcast hidden states: a third of the head's FLOPs); now all three products are bf16."""
    from rlvr.core.logprobs import selective_log_softmax_and_entropy

    g = torch.Generator().manual_seed(0)
    h = torch.randn(12, 16, generator=g).bfloat16().requires_grad_()
    w = torch.randn(50, 16, generator=g).bfloat16().requires_grad_()
    t = torch.randint(0, 50, (12,), generator=g)
    with DtypeAccount() as acc:
        lp, _ = selective_log_softmax_and_entropy(h, w, None, t, chunk_size=5)
        lp.sum().backward()
    assert acc.summary()["matmul_flops"] == {"bfloat16": 3 * 2 * 12 * 16 * 50}
    assert lp.dtype == torch.float32 and w.grad.dtype == torch.bfloat16

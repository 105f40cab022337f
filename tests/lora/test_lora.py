"""LoRA through peft: config, adapter-only training, exact gradients on every forward path, the
reference policy with adapters disabled, generation with the current adapters, checkpoints, export."""

from __future__ import annotations

import json

import pytest
import torch

peft = pytest.importorskip("peft")

from rlvr.config import build_config  # noqa: E402
from rlvr.errors import ConfigError  # noqa: E402
from rlvr.lora import (  # noqa: E402
    apply_lora, base_causal_lm, generation_copy, is_adapter_folder, lora_engine, merged_state_dict,
    reference_policy, trainable_parameters,
)
from rlvr.testing import ToyTask, small_config  # noqa: E402
from rlvr.trainer.forward import batch_logprobs, completion_logprobs  # noqa: E402
from rlvr.trainer.trainer import Trainer  # noqa: E402
from rlvr.types import GenerationRequest, RolloutBatch, SamplingParams  # noqa: E402

LORA = ["model.lora.r=4", "model.lora.alpha=8", "reward_timeout_s=0"]


def _lora_cfg(**kw):
    over = [f"model.lora.{k}={v}" for k, v in {"r": 4, "alpha": 8, **kw}.items()]
    return build_config(overrides=over).model.lora


def _peft_tiny(seed=0, **kw):
    """A tiny llama with LoRA adapters whose B is random (init false): adapters change the output."""
    from rlvr.models.tiny import build_tiny_model

    m, tok = build_tiny_model(seed)
    torch.manual_seed(seed + 1)
    return apply_lora(m, _lora_cfg(init_lora_weights="false", **kw)), tok


def _group_batch(n=5, ctx_len=7, lengths=(6, 3, 1, 5, 2), seed=0):
    g = torch.Generator().manual_seed(seed)
    ctx = torch.randint(3, 500, (ctx_len,), generator=g).tolist()
    T = max(lengths)
    ids = torch.randint(3, 500, (n, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).float()
    return RolloutBatch(
        context_ids=[list(ctx) for _ in range(n)], completion_ids=ids * mask.long(), completion_mask=mask,
        group_id=torch.zeros(n, dtype=torch.long), prompt_index=torch.zeros(n, dtype=torch.long),
        is_truncated=torch.zeros(n, dtype=torch.bool), sampling_temperature=torch.ones(n),
        logprob_temperature=torch.linspace(0.8, 1.2, n), policy_version=torch.zeros(n, dtype=torch.long),
    )


# --------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("override, needle", [
    ("model.lora.r=-1", "model.lora.r"),
    ("model.lora.alpha=0", "model.lora.alpha"),
    ("model.lora.dropout=1.0", "model.lora.dropout"),
    ("model.lora.target_modules=[]", "empty list"),
    ("model.lora.target_modules=[q_proj,lm_head]", "lm_head"),
    ("model.lora.init_lora_weights=pissa", "pissa"),
    ("model.lora.alpah=8", "did you mean 'model.lora.alpha'"),
    ("logging.report_to=[neptune]", "logging.report_to"),
    ("logging.report_to=[wandb,wandb]", "more than once"),
])
def test_bad_lora_and_logging_keys_are_config_errors(override, needle):
    with pytest.raises(ConfigError, match=None) as e:
        build_config(overrides=[override])
    assert needle in str(e.value)


def test_lora_config_defaults_and_spellings():
    c = build_config().model.lora
    assert (c.r, c.target_modules, c.init_lora_weights) == (0, "all-linear", True)
    with pytest.warns(UserWarning, match="alias"):
        c = build_config(overrides=["model.lora_rank=8", "model.lora.lora_alpha=16",
                                    "model.lora.target_modules=q_proj,v_proj"]).model.lora
    assert (c.r, c.alpha, c.target_modules) == (8, 16.0, ["q_proj", "v_proj"])


def test_default_targets_every_decoder_linear_but_not_the_head(tiny):
    make, _ = tiny
    pm = apply_lora(make(0), _lora_cfg())
    adapted = {n for n, m in base_causal_lm(pm).named_modules() if hasattr(m, "lora_A")}
    linears = {n for n, m in make(0).named_modules() if isinstance(m, torch.nn.Linear)}
    assert adapted == linears - {"lm_head"} and len(adapted) == 14  # 7 projections x 2 layers


def test_unknown_target_module_names_the_modules_it_has(tiny):
    make, _ = tiny
    with pytest.raises(ConfigError, match="q_proj"):
        apply_lora(make(0), _lora_cfg(target_modules="[query]"))


# --------------------------------------------------------------------------------------------- training
def test_only_adapters_train_and_base_weights_stay_bit_identical(tmp_path, tiny):
    make, tok = tiny
    model = make(0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tr = Trainer(small_config(tmp_path, *LORA, "max_steps=3", "learning_rate=5e-2"), model, tok, ToyTask())
    in_opt = [p for g in tr.optimizer.param_groups for p in g["params"]]
    lora_params = [p for n, p in tr.model.named_parameters() if "lora_" in n]
    assert {id(p) for p in in_opt} == {id(p) for p in lora_params}
    assert all(p.requires_grad for p in lora_params)
    assert not any(p.requires_grad for n, p in tr.model.named_parameters() if "lora_" not in n)
    b0 = [p.detach().clone() for p in lora_params]
    tr.train()
    assert any(not torch.equal(a, p) for a, p in zip(b0, lora_params))  # the adapters did learn
    after = {k.replace("base_layer.", ""): v for k, v in base_causal_lm(tr.model).state_dict().items() if "lora_" not in k}
    assert after.keys() == before.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    t, total = trainable_parameters(tr.model)
    assert t == sum(p.numel() for p in lora_params) and total > t


def _grads(model, batch, **kw):
    model.zero_grad(set_to_none=True)
    model.train()
    logp, _ = completion_logprobs(model, batch, pad_token_id=2, with_entropy=False, **kw)
    w = torch.linspace(-1.0, 2.0, logp.numel()).reshape(logp.shape)
    (logp * w * batch.completion_mask).sum().backward()
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def _close(a, b, what):
    """Equal up to float32 summation order: every element within 1e-5 of the tensor's largest entry."""
    err = float((a - b).abs().max() / b.abs().max())
    assert err < 1e-5, f"{what}: relative error {err:.2e}"


def test_exact_gradients_shared_bucketed_chunked_and_checkpointed_vs_plain():
    """Prompt sharing (with length buckets), a small LM-head chunk and gradient checkpointing give
    the adapters the same gradients as the plain unshared forward."""
    pm, _ = _peft_tiny(0)
    batch = _group_batch()
    ref_lp, ref_g = _grads(pm, batch, share_prompt=False, chunk_size=4096)
    assert all(g.abs().sum() > 0 for g in ref_g.values())
    cases = {"shared": dict(share_prompt=True), "chunked": dict(share_prompt=False, chunk_size=3),
             "shared+chunked": dict(share_prompt=True, chunk_size=2)}
    for name, kw in cases.items():
        lp, g = _grads(pm, batch, **kw)
        torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-6, msg=name)
        for k in ref_g:
            _close(g[k], ref_g[k], f"{name}: {k}")
    # gradient checkpointing on the peft model (unshared path: the decoder runs without a KV cache)
    base_causal_lm(pm).gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    pm.enable_input_require_grads()
    lp, g = _grads(pm, batch, share_prompt=False)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-6)
    for k in ref_g:
        _close(g[k], ref_g[k], f"checkpointed: {k}")


def test_checkpointed_shared_prompt_gradients_are_exact():
    pm, _ = _peft_tiny(0)
    batch = _group_batch()
    ref_lp, ref_g = _grads(pm, batch, share_prompt=False)
    base_causal_lm(pm).gradient_checkpointing_enable()
    lp, g = _grads(pm, batch, share_prompt=True)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-6)
    for k in ref_g:
        _close(g[k], ref_g[k], f"checkpointed+shared: {k}")


def test_gradient_checkpointing_through_the_config_trains_the_adapters(tmp_path, tiny):
    make, tok = tiny
    model = make(0)
    model.gradient_checkpointing_enable()
    tr = Trainer(small_config(tmp_path, *LORA, "max_steps=1", "model.gradient_checkpointing=true"), model, tok,
                 ToyTask())
    last = tr.train()
    assert last["actor/grad_norm"] > 0


# --------------------------------------------------------------------------------------------- reference
def test_reference_logprobs_are_the_base_models_and_no_copy_is_made(tmp_path, tiny):
    make, tok = tiny
    tr = Trainer(small_config(tmp_path, *LORA, "beta=0.1", "model.lora.init_lora_weights=false"), make(0), tok,
                 ToyTask())
    assert tr.ref_model is None  # no second model
    batch = _group_batch()
    lp_base, _ = batch_logprobs(make(0), batch, pad_token_id=2)
    with reference_policy(tr.model) as ref:
        lp_ref, _ = batch_logprobs(ref, batch, pad_token_id=2)
    lp_adapted, _ = batch_logprobs(tr.model, batch, pad_token_id=2)
    torch.testing.assert_close(lp_ref, lp_base, rtol=0, atol=1e-6)
    assert (lp_adapted - lp_base).abs().max() > 1e-3  # the adapters are back on after the block
    # and the trainer's own reference pass uses it
    real = tr.generate_batch()[0]
    want, _ = batch_logprobs(make(0), real, pad_token_id=tr.pad_token_id)
    torch.testing.assert_close(real.ref_logp, want, rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------------------- generation
def test_merged_generation_copy_matches_the_peft_layers_and_follows_updates():
    pm, tok = _peft_tiny(0)
    live, none = lora_engine(pm, tok, merged=False)
    merged, sync = lora_engine(pm, tok, merged=True)
    assert none is None and sync is not None
    gen = merged.model
    # adapted weights are separate storage; everything else is shared with the policy
    base_sd = base_causal_lm(pm).state_dict()
    shared = [k for k, v in gen.state_dict().items() if k.replace(".weight", ".base_layer.weight") not in base_sd]
    assert shared and all(gen.state_dict()[k].data_ptr() == base_sd[k].data_ptr() for k in shared)
    reqs = [GenerationRequest(context_ids=[1, 5, 9, 33], n=3)]
    params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=3)

    def logps(engine):
        return torch.tensor([x for g in engine.generate(reqs, params)[0] for x in g.logprobs])

    torch.testing.assert_close(logps(merged), logps(live), rtol=1e-4, atol=1e-5)
    with torch.no_grad():  # an "update": the live engine sees it at once, the copy after a sync
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.mul_(3.0)
    assert sync(1) and not sync(1)  # a version is pushed once
    torch.testing.assert_close(logps(merged), logps(live), rtol=1e-4, atol=1e-5)
    for k, v in merged_state_dict(pm).items():
        assert torch.equal(gen.state_dict()[k], v)


def test_merged_weights_equal_peft_merge_and_unload():
    pm, _ = _peft_tiny(0)
    fused = merged_state_dict(pm)
    import copy

    want = copy.deepcopy(pm).merge_and_unload().state_dict()
    assert fused.keys() <= want.keys()
    for k, v in fused.items():
        torch.testing.assert_close(v, want[k], rtol=1e-6, atol=1e-7)


def test_generation_copy_is_plain_transformers():
    pm, _ = _peft_tiny(0)
    gen = generation_copy(pm)
    assert not any("lora" in n for n, _ in gen.named_modules())
    assert not any(p.requires_grad for p in gen.parameters())


# --------------------------------------------------------------------------------------------- checkpoints
def test_resume_from_a_lora_checkpoint_is_exact(tmp_path, tiny):
    make, tok = tiny
    # dropout kept on (disable_dropout=false): the resumed run must restore its RNG stream exactly
    over = [*LORA, "max_steps=4", "save_steps=2", "beta=0.05", "model.lora.dropout=0.1", "disable_dropout=false"]
    full = Trainer(small_config(tmp_path / "a", *over), make(0), tok, ToyTask())
    full.train()
    from rlvr.trainer.checkpoint import load_checkpoint

    part = Trainer(small_config(tmp_path / "b", *over), make(0), tok, ToyTask())
    load_checkpoint(part, tmp_path / "a" / "checkpoint-2")
    part.train()
    rows = lambda d: [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    skip = ("time", "timing/", "perf/")
    for a, b in zip(rows(tmp_path / "a")[2:], rows(tmp_path / "b")):
        assert a["step"] == b["step"]
        assert {k: v for k, v in a.items() if not k.startswith(skip)} == {k: v for k, v in b.items() if not k.startswith(skip)}
    sa, sb = peft.get_peft_model_state_dict(full.model), peft.get_peft_model_state_dict(part.model)
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    # the optimizer state came back too (Adam moments of every adapter tensor)
    assert len(part.optimizer.state) == len([p for p in part.model.parameters() if p.requires_grad])


def test_final_adapter_loads_with_peft_and_exports_merged(tmp_path, tiny):
    from transformers import AutoModelForCausalLM

    from rlvr import cli

    make, tok = tiny
    base_dir = tmp_path / "base"
    make(0).save_pretrained(base_dir)
    tok.save_pretrained(base_dir)
    out = tmp_path / "run"
    cfg = small_config(out, *LORA, "max_steps=2", "learning_rate=5e-2", f"model.name_or_path={base_dir}")
    tr = Trainer(cfg, make(0), tok, ToyTask())
    tr.train()
    final = out / "final"
    assert is_adapter_folder(final) and (final / "adapter_model.safetensors").is_file()
    assert not list(final.glob("model*.safetensors"))  # the adapter only, not the base
    batch = _group_batch()
    want, _ = batch_logprobs(tr.model, batch, pad_token_id=2)
    loaded = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), str(final))
    got, _ = batch_logprobs(loaded, batch, pad_token_id=2)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert cli.main(["export", str(final), "--merge", "--out", str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    got, _ = batch_logprobs(merged, batch, pad_token_id=2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert cli.main(["export", str(final), "--merge", "--out", str(tmp_path / "merged")]) == 2  # never overwrites (bad input: an OutputDirError)
    assert cli.main(["export", str(base_dir), "--merge", "--out", str(tmp_path / "m2")]) == 2  # not an adapter (bad input: a ModelPathError)


def test_eval_checkpoint_accepts_an_adapter_or_a_merged_folder(tmp_path, tiny, monkeypatch):
    from rlvr import cli
    from rlvr.lora import load_adapter_policy, load_checkpoint_policy
    from rlvr.models import load_policy

    make, tok = tiny
    base_dir = tmp_path / "base"
    make(0).save_pretrained(base_dir)
    tok.save_pretrained(base_dir)
    cfg = small_config(tmp_path / "run", *LORA, "max_steps=1", "learning_rate=5e-2", f"model.name_or_path={base_dir}")
    Trainer(cfg, make(0), tok, ToyTask()).train()
    final = tmp_path / "run" / "final"
    assert cli.main(["export", str(final), "--merge", "--out", str(tmp_path / "merged")]) == 0
    m1, _ = load_checkpoint_policy(cfg.model, str(final))
    m2, _ = load_checkpoint_policy(cfg.model, str(tmp_path / "merged"))
    batch = _group_batch()
    torch.testing.assert_close(batch_logprobs(m1, batch, pad_token_id=2)[0], batch_logprobs(m2, batch, pad_token_id=2)[0],
                               rtol=1e-5, atol=1e-5)
    assert load_adapter_policy(final, cfg.model, merge=False)[0].__class__.__name__.startswith("Peft")
    assert load_policy(cfg.model.model_copy(update={"name_or_path": str(tmp_path / "merged")}))
    # the command line, on both kinds of folder (the eval config's own model is not used)
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i} + 1 =", "answer": f"#### {i + 1}"}) + "\n" for i in range(4)))
    common = ["task.type=jsonl", f"task.path={data}", "task.eval_size=2", "eval.num_samples=2", "eval.ks=[1]",
              "max_completion_length=4", "model.name_or_path=/nonexistent/base"]
    for name, ckpt in (("adapter", final), ("merged", tmp_path / "merged")):
        res = tmp_path / f"eval_{name}.json"
        assert cli.main(["eval", *common, "--checkpoint", str(ckpt), "--out", str(res)]) == 0
        assert json.loads(res.read_text())["num_problems"] == 2


def test_lora_under_the_bf16_policy_decodes_the_merged_weights_in_bf16(tmp_path, tiny):
    make, tok = tiny
    tr = Trainer(small_config(tmp_path, *LORA, "max_steps=1", "learning_rate=5e-2", "model.dtype=bf16"), make(0), tok,
                 ToyTask())
    assert tr.engine.decode_dtype == torch.bfloat16
    tr.train()
    tr.weight_sync(tr.global_step)
    tr.engine.sync_weights()  # the bf16 cast copy follows the merged fp32 generation copy
    merged = merged_state_dict(tr.model)
    decode = dict(tr.engine._decode_model.named_parameters())
    for k, v in merged.items():
        torch.testing.assert_close(decode[k].float(), v, rtol=1e-2, atol=1e-2)
    assert any(not torch.equal(v, base_causal_lm(tr.model).get_parameter(k.replace(".weight", ".base_layer.weight")))
               for k, v in merged.items())

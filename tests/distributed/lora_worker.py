"""torchrun worker (2 ranks): LoRA (peft) under FSDP2 vs one process.

1. Gradient equality: one policy update on half the groups per rank (the peft model sharded with
   ``fully_shard``) gives the one-process adapter gradients of all rows, for every ``loss_agg_mode`` ×
   KL on/off × prompt sharing on/off (also replicated, and FSDP2 with activation checkpointing); the
   frozen base gets no gradient.
2. A 3-step LoRA run through the ``Trainer`` (beta > 0: reference = adapters disabled), checkpoint at
   step 2: base weights bit-identical to the loaded ones; the generation copy holds ``W + ΔW`` of the
   gathered adapters on every rank; reference log-probs equal the plain base model's; ``final/`` is a
   peft adapter folder that ``PeftModel.from_pretrained`` loads with the trained adapters; resuming
   from ``checkpoint-2`` reproduces step 3 and the final adapters; the adapters and AdamW state it resumes
   with are written whole to ``checkpoint-2.full.safetensors`` (the one-process load's reference).

Rank 0 prints ``RESULT {json}``.
"""

import itertools
import json
import sys
from pathlib import Path

import torch

from rlvr.config.sections import LoraConfig
from rlvr.core.aggregation import LOSS_AGG_MODES
from rlvr.core.objective import LossSettings
from rlvr.distributed import DataParallel, init_distributed
from rlvr.distributed.fsdp import shard_policy
from rlvr.lora import apply_lora, merged_state_dict, reference_policy
from rlvr.models import enable_gradient_checkpointing
from rlvr.models.tiny import build_tiny_model
from rlvr.trainer.update import policy_update

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grad_equality_worker import grads, make_batch, near_policy  # noqa: E402


def lora_model(checkpointing=False):
    """The tiny model with rank-4 adapters, B drawn non-zero (else A's gradient is 0), same on every rank."""
    model, tok = build_tiny_model(0)
    if checkpointing:
        enable_gradient_checkpointing(model)
    torch.manual_seed(0)
    pm = apply_lora(model, LoraConfig(r=4, alpha=8), base_model_spec={"name_or_path": "tiny"})
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return pm, tok


def base_name(n):
    """peft name of a base tensor -> the plain model's name."""
    return n.replace("base_model.model.", "", 1).replace(".base_layer", "").replace("_checkpoint_wrapped_module.", "")


def gradient_cases(env, batch, local):
    one, _ = lora_model()
    models = {"fsdp": lora_model()[0], "fsdp_ac": lora_model(checkpointing=True)[0], "replicated": lora_model()[0]}
    shard_policy(models["fsdp"], device=env.device)
    shard_policy(models["fsdp_ac"], device=env.device)
    dps = {"fsdp": DataParallel(env, fsdp=True, pad_token_id=0), "fsdp_ac": DataParallel(env, fsdp=True, pad_token_id=0),
           "replicated": DataParallel(env, fsdp=False, pad_token_id=0)}
    out = {}
    for mode, beta, share in itertools.product(LOSS_AGG_MODES, (0.0, 0.1), (True, False)):
        st = LossSettings(loss_agg_mode=mode, beta=beta, loss_scale_factor=8.0 if mode == "seq-mean-token-sum-norm" else None)
        kw = dict(pad_token_id=0, rows_per_micro=3, max_grad_norm=None, step_optimizer=False, share_prompt=share)
        want = None
        if env.rank == 0:
            opt = torch.optim.SGD([p for p in one.parameters() if p.requires_grad], lr=0.0)
            policy_update(one, opt, batch, st, **kw)
            want = grads(one)
            one.zero_grad(set_to_none=True)
        for label, model in models.items():
            if label != "fsdp" and (beta or not share or mode not in ("token-mean", "seq-mean-token-mean")):
                continue  # the other layouts: a few cases each, to keep the test short
            model.train()
            opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
            policy_update(model, opt, local, st, dp=dps[label], **kw)
            got = grads(model)
            model.zero_grad(set_to_none=True)
            if env.rank == 0:
                got = {n.replace("_checkpoint_wrapped_module.", ""): g for n, g in got.items()}
                assert set(got) == set(want), (label, sorted(set(got) ^ set(want))[:4])
                assert all(".lora_" in n for n in got), [n for n in got if ".lora_" not in n][:3]
                diff = max(float((got[n] - want[n]).abs().max()) for n in got)
                a_scale = max(float(w.abs().max()) for n, w in want.items() if "lora_A" in n)
                scale = max(float(w.abs().max()) for w in want.values())
                out[f"{label}|{mode}|beta={beta}|share={share}"] = [diff, scale, a_scale]
    return out


def full_state(model):
    from rlvr.distributed.weights import full_named_tensors

    return {n: t.clone() for n, t in full_named_tensors(model)}


def save_full_state(tr, path: Path):
    """Rank 0 writes the trainer's adapters and their AdamW state, gathered whole (``full_state_dict``), as
    ``model|<fqn>`` and ``optim|<fqn>|<exp_avg|exp_avg_sq|step>`` (the reference the one-process load of a
    2-rank checkpoint is checked against, ``test_lora_fsdp.py``)."""
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    msd, osd = get_state_dict(tr.model, tr.optimizer, options=opts)
    if tr.rank == 0:
        flat = {f"model|{k}": v for k, v in msd.items()}
        flat.update({f"optim|{fqn}|{k}": torch.as_tensor(v) for fqn, st in osd["state"].items() for k, v in st.items()})
        save_file({k: v.detach().clone().contiguous() for k, v in flat.items()}, str(path))
    tr.dp.barrier()


def trainer_run(env, out: Path, batch):
    from peft import PeftModel
    from safetensors.torch import load_file

    from rlvr.testing import ToyTask, small_config
    from rlvr.trainer.checkpoint import load_checkpoint
    from rlvr.trainer.forward import batch_logprobs
    from rlvr.trainer.trainer import Trainer

    def make(max_steps):
        cfg = small_config(out, "reward_timeout_s=0", "logging.tensorboard=false", "model.lora.r=4",
                           "model.lora.alpha=8", "beta=0.1", f"max_steps={max_steps}", "save_steps=2")
        model, tok = build_tiny_model(0)
        dp = DataParallel(env, fsdp=True, pad_token_id=tok.pad_token_id)
        tr = Trainer(cfg, model, tok, ToyTask(), dp=dp)
        rows = []
        tr.callbacks.append(lambda t, m: rows.append(dict(m)))
        return tr, rows

    res = {}
    loaded = {n: t.clone() for n, t in build_tiny_model(0)[0].state_dict().items()}
    tr, rows = make(3)
    res["trainable_in_optimizer"] = sum(p.numel() for g in tr.optimizer.param_groups for p in g["params"])
    res["lora_numel"] = sum(p.numel() for n, p in tr.model.named_parameters() if ".lora_" in n)
    before = full_state(tr.model)
    tr.train()
    after = full_state(tr.model)
    base_after = {base_name(n): t for n, t in after.items() if ".lora_" not in n}
    res["base_bit_identical"] = sorted(base_after) == sorted(k for k in loaded if k in base_after) and all(
        torch.equal(t, loaded[n]) for n, t in base_after.items())
    res["base_tensors_checked"] = len(base_after)
    res["adapters_changed"] = any(not torch.equal(before[n], after[n]) for n in after if ".lora_" in n)
    # generation copy after a sync: W + ΔW of the gathered adapters, on every rank alike
    tr.sync_weights()
    with tr.dp.inference(tr.model):
        merged = {n: t.clone() for n, t in merged_state_dict(tr.model).items()}
    gen = tr.generation_sync.target.state_dict()
    res["gen_equals_merged"] = all(torch.equal(gen[n], t) for n, t in merged.items()) and len(merged) > 0
    res["gen_not_base"] = any(not torch.equal(gen[n], loaded[n]) for n in merged)
    sums = tr.dp.gather([float(v.double().sum()) for v in gen.values()])
    res["gen_same_on_all_ranks"] = all(s == sums[0] for s in sums)
    res["version"] = [tr.weight_version, tr.generation_sync.version]
    res["engine_is_copy"] = tr.engine.model is tr.generation_sync.target
    # reference log-probs: adapters disabled under FSDP == the plain base model
    with reference_policy(tr.model):
        ref = batch_logprobs(tr.model, batch, pad_token_id=0, rows_per_micro=4)[0]
    plain = batch_logprobs(build_tiny_model(0)[0], batch, pad_token_id=0, rows_per_micro=4)[0]
    res["ref_vs_base_max_diff"] = float((ref - plain).abs().max())
    res["ref_logp_scale"] = float(plain.abs().max())
    # final/: peft's adapter format, loadable with PeftModel.from_pretrained
    final = out / "final"
    res["final_files"] = sorted(p.name for p in final.iterdir()) if env.rank == 0 else []
    if env.rank == 0:
        pm = PeftModel.from_pretrained(build_tiny_model(0)[0], str(final))
        sd = pm.state_dict()
        res["final_adapters_equal"] = all(torch.equal(sd[n], t) for n, t in after.items() if ".lora_" in n)
        res["final_adapter_tensors"] = len(load_file(str(final / "adapter_model.safetensors")))
    # exact resume from checkpoint-2 (DCP: adapters + optimizer; per-rank RNG and round state)
    tr.dp.barrier()
    tr2, rows2 = make(3)
    load_checkpoint(tr2, out / "checkpoint-2")
    save_full_state(tr2, out / "checkpoint-2.full.safetensors")  # what the job resumes with, for one process
    tr2.train()
    after2 = full_state(tr2.model)
    res["resume_steps"] = [r["step"] if "step" in r else None for r in rows2]
    keys = [k for k in rows[-1] if k.startswith(("loss/", "actor/", "reward/")) and not k.startswith("actor/grad")]
    res["resume_step3_max_metric_diff"] = max(abs(rows[-1][k] - rows2[-1][k]) for k in keys)
    res["resume_metrics_compared"] = len(keys)
    res["resume_adapters_max_diff"] = max(float((after[n] - after2[n]).abs().max()) for n in after if ".lora_" in n)
    res["resume_rows"] = len(rows2)
    tr.close()
    tr2.close()
    return res


def main():
    env = init_distributed("cpu")
    torch.manual_seed(0)
    batch = near_policy(make_batch(), build_tiny_model(0)[0])  # the adapters start near the base (B small)
    half = batch.group_id.unique().numel() // env.world_size
    local = batch.select([i for i, gid in enumerate(batch.group_id.tolist()) if gid // half == env.rank])
    results = {"grads": gradient_cases(env, batch, local), "train": trainer_run(env, Path(sys.argv[1]), batch)}
    if env.rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())

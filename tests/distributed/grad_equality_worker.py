"""torchrun worker (2 ranks): one policy update on half the groups per rank vs one process on all rows.

For every loss_agg_mode × KL on/off × prompt sharing on/off × {replicated, FSDP2}, plus a drop-mask
hook (the masked-normaliser rescale), rank 0 compares the gradient of the data-parallel update with
the single-process gradient of the same batch and prints one JSON line ``RESULT {case: max_abs_diff}``.
"""

import itertools
import json
import sys

import torch

from rlvr.core.aggregation import LOSS_AGG_MODES
from rlvr.core.objective import LossSettings
from rlvr.distributed import DataParallel, init_distributed
from rlvr.distributed.fsdp import shard_policy
from rlvr.models import enable_gradient_checkpointing
from rlvr.models.tiny import build_tiny_model
from rlvr.trainer.update import policy_update
from rlvr.types import RolloutBatch


def make_batch(num_groups=6, G=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = num_groups * G
    contexts, lengths = [], []
    for k in range(num_groups):
        ctx = torch.randint(3, 400, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
        contexts += [ctx] * G
        lengths += torch.randint(0, 9, (G,), generator=g).tolist()
    lengths[1] = 0  # an empty completion: counted differently by seq_denominator modes
    T = max(lengths)
    ids = torch.randint(3, 400, (rows, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).float()
    ids = torch.where(mask > 0, ids, torch.zeros_like(ids))
    b = RolloutBatch(
        context_ids=contexts, completion_ids=ids, completion_mask=mask,
        group_id=torch.arange(num_groups).repeat_interleave(G), prompt_index=torch.arange(num_groups).repeat_interleave(G),
        is_truncated=torch.zeros(rows, dtype=torch.bool), sampling_temperature=torch.ones(rows),
        logprob_temperature=torch.ones(rows), policy_version=torch.zeros(rows, dtype=torch.long),
    )
    b.advantages = torch.randn(rows, generator=g)
    b.old_logp = (-torch.rand(rows, T, generator=g) * 3) * mask
    b.ref_logp = (-torch.rand(rows, T, generator=g) * 3) * mask
    return b


def near_policy(batch, model, seed=0):
    """Set ``old_logp`` and ``ref_logp`` to ``model``'s log-probs plus noise (std 0.2, masked).

    Random log-probs far from the model's put every token at the KL estimator's clamp
    (``low_var_kl`` caps at 10: zero gradient) and most ratios outside the clip range, which would
    make the KL-on cases compare nothing but the KL-off gradient."""
    from rlvr.trainer.forward import batch_logprobs

    logp = batch_logprobs(model, batch, pad_token_id=0, rows_per_micro=4)[0]
    g = torch.Generator().manual_seed(seed)
    m = batch.completion_mask
    batch.old_logp = (logp + 0.2 * torch.randn(logp.shape, generator=g)) * m
    batch.ref_logp = (logp + 0.2 * torch.randn(logp.shape, generator=g)) * m
    return batch


def drop_mask(micro, logp, old_logp):
    """A deterministic 'drop' mask: every third completion token of each row leaves the loss."""
    m = torch.ones_like(micro.completion_mask)
    m[:, ::3] = 0
    return m


def grads(model):
    out = {}
    for n, p in model.named_parameters():
        g = p.grad
        if g is None:
            continue
        out[n] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
    return out


def main():
    env = init_distributed("cpu")
    torch.manual_seed(0)
    base, tok = build_tiny_model(0)
    batch = near_policy(make_batch(), base)
    half = batch.group_id.unique().numel() // env.world_size
    mine = [i for i, gid in enumerate(batch.group_id.tolist()) if gid // half == env.rank]
    local = batch.select(mine)
    replicated = build_tiny_model(0)[0]
    sharded = build_tiny_model(0)[0]
    shard_policy(sharded, device=env.device)
    checkpointed = build_tiny_model(0)[0]
    enable_gradient_checkpointing(checkpointed)  # activation checkpointing under FSDP2
    shard_policy(checkpointed, device=env.device)
    dp_rep = DataParallel(env, fsdp=False, pad_token_id=0)
    dp_fsdp = DataParallel(env, fsdp=True, pad_token_id=0)
    results = {}
    cases = list(itertools.product(LOSS_AGG_MODES, (0.0, 0.1), (True, False), ("none", "drop")))
    for mode, beta, share, hook in cases:
        st = LossSettings(loss_agg_mode=mode, beta=beta, loss_scale_factor=8.0 if mode == "seq-mean-token-sum-norm" else None)
        kw = dict(pad_token_id=0, rows_per_micro=3, max_grad_norm=None, step_optimizer=False,
                  share_prompt=share, extra_mask_fns=[drop_mask] if hook == "drop" else [])
        name = f"{mode}|beta={beta}|share={share}|mask={hook}"
        want = None
        if env.rank == 0:
            opt = torch.optim.SGD(base.parameters(), lr=0.0)
            policy_update(base, opt, batch, st, **kw)
            want = grads(base)
        runs = [("replicated", replicated, dp_rep), ("fsdp", sharded, dp_fsdp), ("fsdp_ac", checkpointed, dp_fsdp)]
        for label, model, dp in runs:
            if label == "fsdp" and hook == "drop" and share is False:
                continue  # covered by the replicated run; keeps the test short
            if label == "fsdp_ac" and (beta or hook == "drop" or mode not in ("token-mean", "seq-mean-token-mean")):
                continue
            model.train()
            opt = torch.optim.SGD(model.parameters(), lr=0.0)
            policy_update(model, opt, local, st, dp=dp, **kw)
            got = grads(model)
            model.zero_grad(set_to_none=True)
            if env.rank == 0:
                names = [n.replace("_checkpoint_wrapped_module.", "") for n in got]
                assert set(names) == set(want), (label, sorted(set(names) ^ set(want))[:4])
                diff = max(float((got[n] - want[n.replace("_checkpoint_wrapped_module.", "")]).abs().max()) for n in got)
                scale = max(float(w.abs().max()) for w in want.values())
                results[f"{label}|{name}"] = [diff, scale]
        base.zero_grad(set_to_none=True)
    results["weight_sync"] = check_weight_sync(env, sys.argv[1])
    if env.rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    torch.distributed.destroy_process_group()


def check_weight_sync(env, out):
    """Train 2 steps with FSDP2, then: every rank's generation copy equals the gathered trained weights,
    on every rank alike; the version counter counts the optimizer steps."""
    from rlvr.distributed.weights import full_named_tensors
    from rlvr.testing import ToyTask, small_config
    from rlvr.trainer.trainer import Trainer

    model, tok = build_tiny_model(0)
    cfg = small_config(out, "reward_timeout_s=0", "logging.tensorboard=false")
    dp = DataParallel(env, fsdp=True, pad_token_id=tok.pad_token_id)
    tr = Trainer(cfg, model, tok, ToyTask(), dp=dp)
    before = {k: v.clone() for k, v in tr.generation_sync.target.state_dict().items()}
    tr.train()
    tr.sync_weights()
    full = dict(full_named_tensors(tr.model))
    gen = tr.generation_sync.target.state_dict()
    equal = all(torch.equal(gen[k], full[k]) for k in full)
    changed = any(not torch.equal(before[k], gen[k]) for k in gen)
    sums = dp.gather([float(v.double().sum()) for v in gen.values()])
    return {"equal": equal, "changed": changed, "same_on_all_ranks": all(s == sums[0] for s in sums),
            "version": [tr.weight_version, tr.generation_sync.version], "engine_is_copy": tr.engine.model is not tr.model}


if __name__ == "__main__":
    sys.exit(main())

"""Exact global normalisers: 2 ranks × half the groups give the single-process gradient of all rows.

One ``torchrun --nproc_per_node 2`` launch (gloo, CPU, tiny model) runs every case of
``grad_equality_worker.py``: the five ``loss_agg_mode`` s × KL on/off × prompt sharing on/off × a
drop-mask hook on/off, for the replicated model (all-reduced gradients) and for FSDP2 shards (also
with activation checkpointing).
"""

from __future__ import annotations

import itertools

from rlvr.core.aggregation import LOSS_AGG_MODES

from .conftest import result_line, run_torchrun


def test_two_ranks_give_the_one_process_gradient_for_every_mode(tmp_path):
    proc = run_torchrun(["tests/distributed/grad_equality_worker.py", str(tmp_path)])
    res = result_line(proc)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # generation on full weights: after a sync every rank's engine copy equals the trained weights
    sync = res.pop("weight_sync")
    assert sync == {"equal": True, "changed": True, "same_on_all_ranks": True, "version": [2, 2],
                    "engine_is_copy": True}
    expected = {f"replicated|{m}|beta={b}|share={s}|mask={h}"
                for m, b, s, h in itertools.product(LOSS_AGG_MODES, (0.0, 0.1), (True, False), ("none", "drop"))}
    assert expected <= set(res)
    assert sum(k.startswith("fsdp|") for k in res) == 30
    assert sum(k.startswith("fsdp_ac|") for k in res) == 4  # activation checkpointing under FSDP2
    for case, (diff, scale) in res.items():
        assert scale > 0, f"{case}: zero gradient (the comparison would be vacuous)"
        assert diff <= 1e-5 * scale, f"{case}: max |Δgrad| {diff:.3g} vs max |grad| {scale:.3g}"
    for k in res:  # the KL term reaches the gradient (old/ref log-probs near the policy's, not clamped)
        if "beta=0.1" in k:
            assert res[k][1] != res[k.replace("beta=0.1", "beta=0.0")][1], k

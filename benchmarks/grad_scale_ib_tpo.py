"""IB-TPO vs GRPO gradient scale on the fast testbed, before clipping (issue 17 §1).

Question: do IB-TPO's per-token tree advantages (spec §2.6, ``adv_scale=leaf_std``) and ``1/sqrt(n)``
prefix weights (spec §2.7) give a policy gradient of sensible scale compared with GRPO's, at equal
tokens? Everything is measured on the *same* pre-trained testbed policy and, for the main comparison,
on the *same rows*: each IB-TPO tree's leaves (root-to-leaf paths) are scored once; then the gradient
of the trainer's own loss (:func:`rlvr.trainer.update.policy_update`, ``step_optimizer=False``, no
clipping) is taken with

* ``ib``: IB-TPO's step advantages and prefix weights (the recipe as run in the testbed comparison);
* ``ib_noweight``: the same advantages, prefix weights off (all 1);
* ``grpo_same_rows``: GRPO's sequence advantage ``(r − mean_tree) / std_tree`` on the same rows, no
  prefix weights (a tree treated as a GRPO group);
* ``grpo_fresh``: GRPO's own batch (``grpo`` + ``testbed`` recipes: 4 prompts × 8 independent samples),
  for the token counts and gradient norms a GRPO step actually sees; ``grpo_fresh_group``: one of its
  groups alone (the GRPO analogue of a one-tree step).

Zero-variance trees/groups give a zero gradient under every scheme; they are counted
(``zero_var_frac``) and left out of the per-tree/per-group norms.

Each is reported per optimizer step as the testbed comparison takes them: one tree per step for
IB-TPO (``steps_per_generation=4`` with 4 prompts per round), all 4 groups per step for GRPO. Also per
round (4 trees in one step, as ``steps_per_generation=1`` would take them).

The policy is never updated (every round samples from the pre-trained weights), so the numbers are
the gradient scale at the start of RL. Run (takes ~30–60 s of CPU; heavy lock)::

    flock /tmp/rlvr-heavy.lock env PYTHONPATH=src HF_HUB_OFFLINE=1 .venv/bin/python \\
        benchmarks/grad_scale_ib_tpo.py --rounds 8 --out benchmarks/results/grad_scale_ib_tpo.json

Writes a table to stdout and the JSON (per-step values and summaries).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

IB_FIXED = ["ib_tpo.step_split=fixed", "ib_tpo.fixed_step_tokens=2", "ib_tpo.step_min_tokens=1",
            "ib_tpo.min_remaining_tokens=2", "ib_tpo.head_tokens=2"]
"""The IB-TPO overrides of docs/results/testbed_compare.yaml (2-token steps inside 12-token answers)."""


def build(recipe: str, extra: list[str], out: str, seed: int, model=None, tokenizer=None):
    """A :class:`rlvr.trainer.trainer.Trainer` for ``recipe`` + ``testbed`` at lr 3e-4 (shares ``model``)."""
    import rlvr.testbed  # noqa: F401  (registers model source and task)
    from rlvr.config import build_config
    from rlvr.models import load_policy
    from rlvr.tasks import build_task
    from rlvr.trainer.components import validate_components
    from rlvr.trainer.trainer import Trainer

    cfg = build_config([recipe, "testbed"], ["learning_rate=3e-4", "logging.progress=false",
                                             f"logging.output_dir={out}", f"seed={seed}", *extra])
    validate_components(cfg)
    if model is None:
        model, tokenizer = load_policy(cfg.model)
    return Trainer(cfg, model, tokenizer, build_task(cfg.task)), model, tokenizer


def grad_norm(tr, batch, settings=None) -> float:
    """Pre-clip L2 norm of the gradient of ``tr``'s loss on ``batch`` (no optimizer step)."""
    from rlvr.trainer.update import policy_update

    cfg = tr.cfg
    tr.model.train()
    res = policy_update(
        tr.model, tr.optimizer, batch, settings or tr.settings, pad_token_id=tr.pad_token_id,
        rows_per_micro=cfg.per_device_train_batch_size, loss_norm_scope=cfg.loss_norm_scope,
        mask_truncated=cfg.mask_truncated_completions, max_grad_norm=None,
        chunk_size=cfg.logprob_chunk_size, step_optimizer=False, share_prompt=cfg.share_prompt_forward,
    )
    tr.optimizer.zero_grad(set_to_none=True)
    return float(res.metrics["actor/grad_norm"])


def grpo_adv(batch) -> torch.Tensor:
    """GRPO's sequence advantage per row, ``(r − mean_g) / (std_g + 1e-6)`` over ``batch.group_id``
    (unbiased std as in rlvr's ``scale_rewards=group``; 0 for a zero-variance group), broadcast to ``[N, T]``."""
    r = batch.rewards.double()
    a = torch.zeros_like(r)
    for g in batch.group_id.unique():
        m = batch.group_id == g
        x = r[m]
        a[m] = 0.0 if x.numel() < 2 or bool((x == x[0]).all()) else (x - x.mean()) / (x.std() + 1e-6)
    return a.float()[:, None] * batch.completion_mask.float()


def tok_stats(batch) -> dict[str, float]:
    """Loss tokens, Σ prefix weights and |A| over loss tokens (token-weighted mean and max)."""
    m = batch.completion_mask.bool()
    w = batch.token_weights if batch.token_weights is not None else torch.ones_like(batch.completion_mask, dtype=torch.float)
    adv = batch.advantages if batch.advantages.dim() == 2 else batch.advantages[:, None].expand_as(m)
    a = adv.abs()[m]
    return {"tokens": float(m.sum()), "sum_w": float(w[m].sum()), "abs_adv_mean": float(a.mean()) if a.numel() else 0.0,
            "abs_adv_max": float(a.max()) if a.numel() else 0.0}


def summarise(xs: list[float]) -> dict[str, float]:
    xs = [x for x in xs if x == x]
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "mean": statistics.fmean(xs), "median": statistics.median(xs),
            "min": min(xs), "max": max(xs), "frac_gt_1": sum(x > 1.0 for x in xs) / len(xs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=8, help="generation rounds per algorithm (4 prompts each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/grad_scale_ib_tpo.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="grad_scale_")
    ib, model, tok = build("ib_tpo", IB_FIXED, f"{tmp}/ib", args.seed)
    gr, _, _ = build("grpo", [], f"{tmp}/grpo", args.seed, model, tok)
    init = copy.deepcopy(model.state_dict())
    rows: dict[str, list[float]] = {k: [] for k in ("ib", "ib_noweight", "grpo_same_rows", "grpo_fresh",
                                                    "ib_round", "grpo_same_rows_round", "grpo_fresh_group")}
    toks: dict[str, list[dict]] = {"ib_tree": [], "grpo_group": []}
    zero_var = {"ib_tree": [], "grpo_group": []}
    for rnd in range(args.rounds):
        model.load_state_dict(init)
        b, _ = ib.generate_batch()
        trees = b.group_id.unique().tolist()
        same = copy.copy(b)
        same.advantages = grpo_adv(b)
        same.token_weights = None
        now = copy.copy(b)
        now.token_weights = None
        for g in trees:
            sel = [i for i, x in enumerate(b.group_id.tolist()) if x == g]
            sub = b.select(sel)
            r = sub.rewards
            zv = bool((r == r[0]).all())
            zero_var["ib_tree"].append(zv)
            toks["ib_tree"].append({**tok_stats(sub), "leaves": len(sel), "zero_var": zv})
            if zv:  # no signal: every scheme gives 0 (counted above, left out of the norms)
                continue
            rows["ib"].append(grad_norm(ib, sub))
            rows["ib_noweight"].append(grad_norm(ib, now.select(sel)))
            rows["grpo_same_rows"].append(grad_norm(gr, same.select(sel)))
        rows["ib_round"].append(grad_norm(ib, b))
        rows["grpo_same_rows_round"].append(grad_norm(gr, same))
        gb, _ = gr.generate_batch()
        for g in gb.group_id.unique().tolist():
            sel = [i for i, x in enumerate(gb.group_id.tolist()) if x == g]
            sub = gb.select(sel)
            zv = bool((sub.rewards == sub.rewards[0]).all())
            zero_var["grpo_group"].append(zv)
            toks["grpo_group"].append({**tok_stats(sub), "leaves": len(sel), "zero_var": zv})
            if not zv:
                rows["grpo_fresh_group"].append(grad_norm(gr, sub))
        rows["grpo_fresh"].append(grad_norm(gr, gb))
        print(f"round {rnd}: ib per-tree {[round(x, 2) for x in rows['ib'][-4:]]}  grpo step {rows['grpo_fresh'][-1]:.2f}",
              file=sys.stderr)
    summ = {k: summarise(v) for k, v in rows.items()}
    tsum = {k: {f: statistics.fmean([d[f] for d in v]) for f in ("tokens", "sum_w", "abs_adv_mean", "abs_adv_max", "leaves")}
            for k, v in toks.items()}
    for k in tsum:
        tsum[k]["zero_var_frac"] = sum(zero_var[k]) / len(zero_var[k])
    res = {"rounds": args.rounds, "seed": args.seed, "wall_s": time.time() - t0, "load_avg": os.getloadavg(),
           "grad_norm": summ, "per_unit": tsum, "raw": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print("| gradient (pre-clip L2) | what one optimizer step sees | n | mean | median | min | max | frac > 1 (clipped) |")
    print("|---|---|---|---|---|---|---|---|")
    what = {"ib": "IB-TPO, 1 tree (as run)", "ib_noweight": "IB-TPO adv., prefix weights off, 1 tree",
            "grpo_same_rows": "GRPO adv. on the same tree's leaves", "ib_round": "IB-TPO, 4 trees in one step",
            "grpo_same_rows_round": "GRPO adv., same 4 trees in one step", "grpo_fresh": "GRPO, own batch (4 groups × 8)",
            "grpo_fresh_group": "GRPO, own batch, 1 group"}
    for k, s in summ.items():
        if s.get("n"):
            print(f"| {k} | {what[k]} | {s['n']} | {s['mean']:.2f} | {s['median']:.2f} | {s['min']:.2f} | {s['max']:.2f} | {s['frac_gt_1']:.2f} |")
    for k, s in tsum.items():
        print(f"{k}: " + ", ".join(f"{f}={v:.3f}" for f, v in s.items()))
    print(f"wall {res['wall_s']:.1f} s, load average {res['load_avg']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Log-prob gap between generation precision and training precision (the rollout/training mismatch).

For one model and one batch of prompts, the engine samples ``--gens`` completions per prompt with its
weights in the generation dtype of each policy (fp32, bf16 copy), and the trainer's forward
(:func:`rlvr.trainer.forward.batch_logprobs`, the code path of the update) recomputes the log-probs of
the same tokens under each training policy (fp32, bf16 autocast). For each pair it reports, over all
completion tokens, ``Δ = log π_train − log π_rollout``: mean and max ``|Δ|``, its 99th percentile, the
token ratio ``exp Δ`` (mean, min, max), the fraction of tokens a TIS cap ``C`` would change
(``ratio > C`` for C = 2 and 3), and the per-sequence ``|Σ_t Δ|`` (what sequence-level IS sees).

The pairs a run actually uses are the diagonal: ``fp32 → fp32`` (``model.dtype=fp32``; float noise
between a cached decode and a full forward) and ``bf16 → bf16`` (``model.dtype=bf16``: bf16-weight
decode, bf16-autocast training). The off-diagonal pairs show what mixing would cost.

Run (``--model testbed`` is fast; ``default`` is SmolLM2-135M and slow in bf16 on a CPU without native
bf16)::

    HF_HUB_OFFLINE=1 flock /tmp/rlvr-heavy.lock python benchmarks/precision_gap.py --model testbed
    HF_HUB_OFFLINE=1 flock /tmp/rlvr-heavy.lock python benchmarks/precision_gap.py --model default \\
        --prompts 2 --gens 4 --max-new 48

Prints the machine first (CPU, capability, fp32/bf16 matmul GFLOP/s); writes
``benchmarks/results/precision_gap_<model>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from rlvr.config import build_config  # noqa: E402
from rlvr.engines.hf import HFEngine  # noqa: E402
from rlvr.models import load_policy  # noqa: E402
from rlvr.precision import resolve_precision, set_model_precision  # noqa: E402
from rlvr.samplers.group import GroupSampler, PromptEncoder  # noqa: E402
from rlvr.tasks import build_task  # noqa: E402
from rlvr.trainer.forward import batch_logprobs  # noqa: E402
from rlvr.types import SamplingParams  # noqa: E402

from machine import print_machine  # noqa: E402  (benchmarks/machine.py)

RESULTS = Path(__file__).parent / "results"


def gap_stats(train: torch.Tensor, roll: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Statistics of ``Δ = train − roll`` over ``mask > 0`` (see the module docstring)."""
    m = mask > 0
    d = (train - roll)[m].double()
    r = d.exp()
    seq = ((train - roll) * mask).sum(1).abs().double()
    return {
        "tokens": int(m.sum()),
        "abs_diff_mean": float(d.abs().mean()), "abs_diff_p99": float(d.abs().quantile(0.99)),
        "abs_diff_max": float(d.abs().max()),
        "ratio_mean": float(r.mean()), "ratio_min": float(r.min()), "ratio_max": float(r.max()),
        "frac_ratio_gt_2": float((r > 2).double().mean()), "frac_ratio_gt_3": float((r > 3).double().mean()),
        "frac_ratio_outside_0.8_1.25": float(((r < 0.8) | (r > 1.25)).double().mean()),
        "seq_abs_logratio_mean": float(seq.mean()), "seq_abs_logratio_max": float(seq.max()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="testbed", help="testbed | tiny | default | a model path")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--gens", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    machine = print_machine()
    recipe = ["testbed"] if args.model == "testbed" else []
    name = "default" if args.model == "tiny" else args.model
    cfg = build_config(recipe, [f"model.name_or_path={name}", "model.dtype=fp32",
                                f"max_completion_length={args.max_new}"])
    if args.model == "tiny":  # the tests' random llama (peakier with a larger init) on the toy task: seconds
        from rlvr.models.tiny import build_tiny_model
        from rlvr.testing import ToyTask

        task = ToyTask()
        model, tok = build_tiny_model(0, initializer_range=0.2)
    else:
        task = build_task(cfg.task)
        model, tok = load_policy(cfg.model)
    pad = tok.pad_token_id
    encoder = PromptEncoder(tok, cfg.task.system_prompt or task.system_prompt, cfg.max_prompt_length)
    problems = task.problems("train")[: args.prompts]
    params = SamplingParams(temperature=cfg.temperature, max_new_tokens=args.max_new, seed=args.seed)
    policies = {"fp32": resolve_precision("fp32", log=False), "bf16": resolve_precision("bf16", log=False)}
    out: dict = {"settings": vars(args), **machine, "pairs": {}}
    for gen_name, gen_pol in policies.items():
        t = time.perf_counter()
        engine = HFEngine(model, tok, precision=gen_pol)
        batch = GroupSampler(engine, encoder, pad).sample(problems, args.gens, params, first_group_id=0)
        gen_s = time.perf_counter() - t
        for train_name, train_pol in policies.items():
            set_model_precision(model, train_pol)
            t = time.perf_counter()
            logp, _ = batch_logprobs(model, batch, pad_token_id=pad, rows_per_micro=cfg.per_device_train_batch_size)
            st = gap_stats(logp, batch.sampler_logp, batch.completion_mask)
            st.update({"generate_s": gen_s, "train_forward_s": time.perf_counter() - t})
            key = f"{gen_name}->{train_name}"
            out["pairs"][key] = st
            print(f"gen {gen_name:>4} -> train {train_name:>4}: {st['tokens']} tokens, |Δ| mean {st['abs_diff_mean']:.2e} "
                  f"p99 {st['abs_diff_p99']:.2e} max {st['abs_diff_max']:.2e}; ratio mean {st['ratio_mean']:.4f} "
                  f"[{st['ratio_min']:.3f}, {st['ratio_max']:.3f}], >2: {st['frac_ratio_gt_2']:.2%}, "
                  f"outside [0.8,1.25]: {st['frac_ratio_outside_0.8_1.25']:.2%}; seq |Σ Δ| mean "
                  f"{st['seq_abs_logratio_mean']:.3f}", flush=True)
        set_model_precision(model, None)
    path = Path(args.out) if args.out else RESULTS / f"precision_gap_{Path(args.model).name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

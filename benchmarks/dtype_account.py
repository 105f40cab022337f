"""The dtype account of one policy update (``rlvr.precision.dtype_account``): which matmul FLOPs run in bf16 and which in
fp32, the casts (and how often each weight is converted per micro-batch), the passes over full-vocabulary
tensors, and the bytes other ops move per dtype.

One real GRPO step through ``Trainer.train`` (generation, scoring, then ``policy_update``); only the update
is recorded. Counts, not timings: the numbers are the same on any CPU, with or without native bf16 (on a CPU
without, bf16 is emulated and slow, which is why the default settings are small).

    PYTHONPATH=$PWD/src .venv/bin/python benchmarks/dtype_account.py --model tiny
    flock /tmp/rlvr-heavy.lock env PYTHONPATH=$PWD/src .venv/bin/python benchmarks/dtype_account.py --model default

``--model tiny``: the tests' random llama, 4 prompts × 4 completions × ≤ 16 tokens, micro-batches of 8;
``--model default``: SmolLM2-135M on ``chain_sum``, 1 prompt × 4 × ≤ 16 tokens. ``--chunk`` sets
``logprob_chunk_size`` (the LM head's rows per chunk). Extra ``key=value`` overrides go to the config.
Writes the table to stdout and the summary to ``--out`` (JSON).
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

RESULTS = Path(__file__).parent / "results"


def build_trainer(model_name: str, dtype: str, chunk: int, overrides: list[str], run_dir: str):
    """A :class:`rlvr.trainer.trainer.Trainer` for one step at this script's setting."""
    from rlvr.config import build_config
    from rlvr.models import load_policy
    from rlvr.models.tiny import build_tiny_model
    from rlvr.tasks import build_task
    from rlvr.testing import ToyTask, small_config
    from rlvr.trainer.trainer import Trainer

    common = [f"model.dtype={dtype}", "max_steps=1", f"logprob_chunk_size={chunk}", "logging.log_completions_steps=0",
              "logging.tensorboard=false"]
    if model_name == "tiny":
        cfg = small_config(run_dir, "num_generations=4", "generation_batch_size=16", "per_device_train_batch_size=8",
                           "max_completion_length=16", *common, *overrides)
        model, tok = build_tiny_model(0)
        return Trainer(cfg, model, tok, ToyTask())
    cfg = build_config(overrides=[
        "task.type=reasoning_gym", "task.name=chain_sum", "num_generations=4", "generation_batch_size=4",
        "per_device_train_batch_size=4", "max_completion_length=16", "max_prompt_length=256", "beta=0",
        f"model.name_or_path={model_name}", f"logging.output_dir={run_dir}", "logging.progress=false", *common,
        *overrides])
    model, tok = load_policy(cfg.model)
    return Trainer(cfg, model, tok, build_task(cfg.task))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny", help="'tiny', 'default' (SmolLM2-135M) or a path")
    p.add_argument("--dtype", default="bf16", help="model.dtype (bf16, fp32, bf16-pure)")
    p.add_argument("--chunk", type=int, default=1024, help="logprob_chunk_size")
    p.add_argument("--run-dir", default="/tmp/rlvr_dtype_account")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/dtype_account_<model>.json)")
    p.add_argument("override", nargs="*")
    args = p.parse_args(argv)
    from rlvr.precision.dtype_account import DtypeAccount, account_updates, format_account

    torch.manual_seed(0)
    tr = build_trainer(args.model, args.dtype, args.chunk, args.override, args.run_dir)
    vocab = tr.model.get_output_embeddings().weight.shape[0]
    acc = DtypeAccount(params=dict(tr.model.named_parameters()), vocab_size=vocab)
    t = time.perf_counter()
    with account_updates(tr, acc):
        tr.train()
    wall = time.perf_counter() - t
    summary = acc.summary()
    print(f"{time.strftime('%H:%M:%S', time.gmtime())} UTC; model {args.model}, model.dtype={args.dtype} "
          f"({tr.precision.mode}), logprob_chunk_size={args.chunk}, vocab {vocab}; step {wall:.1f} s "
          f"(load average {os.getloadavg()[0]:.2f})")
    print(format_account(summary))
    out = Path(args.out) if args.out else RESULTS / f"dtype_account_{Path(args.model).name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"settings": vars(args), "precision": tr.precision.as_dict(), "step_s": wall,
                               "account": summary}, indent=2, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

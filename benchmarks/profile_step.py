"""Profile the two halves of a GRPO step at ``bench_step.py``'s setting: one generation round and the update.

``--part gen`` builds the trainer exactly as ``bench_step.py`` does (SmolLM2-135M, 8 prompts × 8, ≤ 128 new
tokens, ``chain_sum``), runs one generation round (``Trainer.generate_batch``) with timers around the
engine's model forward (prefill vs decode steps) and its sampling, then a ``torch.profiler`` table of the
same round's ops; it saves the batch (``--batch``, a ``torch.save`` dict of tensors and lists) so the
update can be profiled without generating again.

``--part train`` loads that batch and runs ``policy_update``'s work per micro-batch (completion log-probs +
the loss's backward, no optimizer step) under timers and ``torch.profiler``; it reports the padding of the
length buckets (tokens the body computes vs real tokens).

Heavy: take the shared lock. ``--model tiny`` is a seconds-long smoke test. Output: stdout and ``--out``
(JSON). Timings are for finding costs, never test assertions.

    flock /tmp/rlvr-heavy.lock env PYTHONPATH=$PWD/src .venv/bin/python benchmarks/profile_step.py --part gen
    flock /tmp/rlvr-heavy.lock env PYTHONPATH=$PWD/src .venv/bin/python benchmarks/profile_step.py --part train
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

from timers import time_engine_forwards, timed  # noqa: E402


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", choices=["gen", "train", "micro"], required=True,
                   help="gen: one generation round; train: the update of a saved batch; micro: a few decode steps "
                   "at 64 rows, one training micro-batch and small-M matmul rates, each under the profiler")
    p.add_argument("--model", default="default")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--gens", type=int, default=8)
    p.add_argument("--max-new", type=int, default=128)
    p.add_argument("--batch", default="/tmp/rlvr_profile_batch.pt")
    p.add_argument("--micro", type=int, default=0, help="train: profile only the first N micro-batches (0: all)")
    p.add_argument("--no-profiler", action="store_true", help="timers only")
    p.add_argument("--out", default=None)
    p.add_argument("override", nargs="*")
    a = p.parse_args(argv)
    a.steps, a.dtype, a.run_dir = 1, "auto", "/tmp/rlvr_profile_run"
    return a


def _table(prof, n=30):
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=n)


def part_gen(args) -> dict[str, Any]:
    import rlvr.engines.hf as hf
    from bench_step import build
    from rlvr.trainer.trainer import Trainer

    cfg, task, model, tok = build(args, Path(args.run_dir))
    tr = Trainer(cfg, model, tok, task)
    acc = {"prefill_s": 0.0, "decode_fwd_s": 0.0, "decode_steps": 0, "rows_steps": 0, "sample_s": 0.0}
    time_engine_forwards(tr.engine, acc)
    hf.sample_from_logits = timed(hf.sample_from_logits, acc, "sample_s")
    t = time.perf_counter()
    batch, _ = tr.generate_batch()
    total = time.perf_counter() - t
    res = {"generate_total_s": total, **acc, "tokens": int(batch.completion_mask.sum()),
           "lengths": batch.completion_lengths.tolist(), "context_lens": [len(c) for c in batch.context_ids]}
    res["other_s"] = total - acc["prefill_s"] - acc["decode_fwd_s"] - acc["sample_s"]
    print(json.dumps({k: v for k, v in res.items() if k not in ("lengths", "context_lens")}), flush=True)
    torch.save({"context_ids": batch.context_ids, "completion_ids": batch.completion_ids,
                "completion_mask": batch.completion_mask, "advantages": batch.advantages,
                "group_id": batch.group_id}, args.batch)
    if not args.no_profiler:
        from torch.profiler import ProfilerActivity, profile

        acc.update({k: 0 if isinstance(v, int) else 0.0 for k, v in acc.items()})
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            tr.generate_batch()
            res["profiled_generate_s"] = time.perf_counter() - t
        res["profile"] = _table(prof)
        print(res["profile"], flush=True)
    return res


def _load_batch(path):
    from rlvr.types import RolloutBatch

    d = torch.load(path, weights_only=True)
    n = len(d["context_ids"])
    return RolloutBatch(
        context_ids=d["context_ids"], completion_ids=d["completion_ids"], completion_mask=d["completion_mask"],
        group_id=d["group_id"], prompt_index=d["group_id"].clone(), is_truncated=torch.zeros(n, dtype=torch.bool),
        sampling_temperature=torch.ones(n), logprob_temperature=torch.ones(n),
        policy_version=torch.zeros(n, dtype=torch.long), advantages=d["advantages"],
    )


def padding_report(batch, rows_per_micro=8) -> dict[str, Any]:
    """Tokens the body runs per micro-batch (shared prompt once + buckets padded) vs real tokens."""
    from rlvr.trainer.forward import length_buckets, micro_batches, shares_context

    real = computed = rect = 0
    for rows in micro_batches(batch, rows_per_micro):
        micro = batch.select(rows)
        lens = micro.completion_lengths.tolist()
        C = len(micro.context_ids[0])
        real += C + sum(lens)
        rect += C + len(lens) * max(lens)
        if shares_context(micro):
            computed += C + sum(len(b) * max(1, max(lens[i] for i in b)) for b in length_buckets([max(1, k) for k in lens]))
        else:
            computed += sum(len(c) for c in micro.context_ids) + len(lens) * max(lens)
    return {"real_tokens": real, "computed_tokens": computed, "rectangle_tokens": rect,
            "padding_fraction": 1 - real / computed}


def part_train(args) -> dict[str, Any]:
    from rlvr.models import load_policy
    from rlvr.models.tiny import build_tiny_model
    from rlvr.config import ModelConfig
    from rlvr.trainer.forward import completion_logprobs, micro_batches

    batch = _load_batch(args.batch)
    if args.model == "tiny":
        model, tok = build_tiny_model(0)
    else:
        model, tok = load_policy(ModelConfig(name_or_path=args.model))
    model.train()
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    res: dict[str, Any] = {"padding": padding_report(batch)}
    print(json.dumps(res), flush=True)
    groups = micro_batches(batch, 8)
    if args.micro:
        groups = groups[: args.micro]
    fwd_s = bwd_s = 0.0
    for rows in groups:
        micro = batch.select(rows)
        t = time.perf_counter()
        logp, ent = completion_logprobs(model, micro, pad_token_id=pad, with_entropy=True)
        t1 = time.perf_counter()
        loss = -(logp * micro.advantages[:, None]).sum() / max(1.0, float(micro.completion_mask.sum()))
        loss.backward()
        fwd_s += t1 - t
        bwd_s += time.perf_counter() - t1
    model.zero_grad(set_to_none=True)
    res.update(forward_s=fwd_s, backward_s=bwd_s, micro_batches=len(groups))
    print(json.dumps({k: v for k, v in res.items()}), flush=True)
    if not args.no_profiler:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for rows in groups[:2]:
                micro = batch.select(rows)
                logp, ent = completion_logprobs(model, micro, pad_token_id=pad, with_entropy=True)
                (-(logp * micro.advantages[:, None]).sum()).backward()
        res["profile"] = _table(prof, 40)
        print(res["profile"], flush=True)
    return res


def part_micro(args) -> dict[str, Any]:
    """Short pieces (seconds each): matmul rate vs rows, 10 decode steps at 64 rows, one micro-batch."""
    from torch.profiler import ProfilerActivity, profile

    from rlvr.config import ModelConfig
    from rlvr.engines.hf import HFEngine
    from rlvr.models import load_policy
    from rlvr.models.tiny import build_tiny_model
    from rlvr.trainer.forward import completion_logprobs, micro_batches

    res: dict[str, Any] = {}
    if args.model == "tiny":
        model, tok = build_tiny_model(0)
    else:
        model, tok = load_policy(ModelConfig(name_or_path=args.model))
    H, I = model.config.hidden_size, model.config.intermediate_size
    V = model.config.vocab_size
    rates = {}
    for rows in (4096, 512, 64, 16):
        for name, (k, n) in {"h_i": (H, I), "i_h": (I, H), "h_v": (H, V)}.items():
            a, w = torch.randn(rows, k), torch.randn(n, k)
            torch.nn.functional.linear(a, w)
            reps = max(1, int(4e9 // (2 * rows * k * n)))
            t = time.perf_counter()
            for _ in range(reps):
                torch.nn.functional.linear(a, w)
            rates[f"{name}@{rows}"] = 2 * rows * k * n * reps / (time.perf_counter() - t) / 1e9
    res["linear_gflop_per_s"] = rates
    print(json.dumps(rates), flush=True)
    batch = _load_batch(args.batch)
    # decode: the engine's loop on 8 contexts × 8 samples, only `steps` steps, profiled
    from rlvr.types import GenerationRequest, SamplingParams

    ctxs = list(dict.fromkeys(tuple(c) for c in batch.context_ids))
    reqs = [GenerationRequest(list(c), n=8) for c in ctxs]
    eng = HFEngine(model, tok)
    sp = SamplingParams(temperature=1.0, max_new_tokens=12, seed=0)
    eng.generate(reqs, sp)
    acc: dict[str, float] = {}
    time_engine_forwards(eng, acc)
    t = time.perf_counter()
    eng.generate(reqs, sp)
    res["decode_12_steps_s"] = time.perf_counter() - t
    res["decode_step_ms"] = 1000 * acc["decode_fwd_s"] / max(acc["decode_steps"], 1)
    print(f"decode: {res['decode_12_steps_s']:.2f} s for 12 tokens x 64 rows; {res['decode_step_ms']:.1f} ms per "
          f"64-row decode forward; loadavg {os.getloadavg()}", flush=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        eng.generate(reqs, sp)
    res["decode_profile"] = _table(prof, 25)
    print(res["decode_profile"], flush=True)
    model.train()
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    rows = micro_batches(batch, 8)[0]
    micro = batch.select(rows)
    for it in range(2):
        t = time.perf_counter()
        logp, _ = completion_logprobs(model, micro, pad_token_id=pad, with_entropy=True)
        t1 = time.perf_counter()
        (-(logp * micro.advantages[:, None]).sum()).backward()
        res[f"micro_fwd_s_{it}"], res[f"micro_bwd_s_{it}"] = t1 - t, time.perf_counter() - t1
    print(f"micro-batch ({int(micro.completion_mask.sum())} completion tokens): forward {res['micro_fwd_s_1']:.2f} s, "
          f"backward {res['micro_bwd_s_1']:.2f} s; loadavg {os.getloadavg()}", flush=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        logp, _ = completion_logprobs(model, micro, pad_token_id=pad, with_entropy=True)
        (-(logp * micro.advantages[:, None]).sum()).backward()
    res["micro_profile"] = _table(prof, 40)
    print(res["micro_profile"], flush=True)
    return res


def main(argv=None) -> int:
    args = _args(argv)
    print(f"{time.strftime('%H:%M:%S', time.gmtime())} UTC, loadavg {os.getloadavg()}", flush=True)
    torch.manual_seed(0)
    res = {"gen": part_gen, "train": part_train, "micro": part_micro}[args.part](args)
    res["loadavg_end"] = os.getloadavg()
    print(f"loadavg at the end {res['loadavg_end']}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

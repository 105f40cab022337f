"""Prompt sharing in the training forward: one group's micro-batch, forward+backward with and without it.

A group of ``--rows`` completions of ragged lengths after one ``--context``-token prompt (the shape of a
GRPO micro-batch) runs through :func:`rlvr.trainer.forward.completion_logprobs` with
``share_prompt=False`` (every row carries its own copy of the prompt) and ``share_prompt=True`` (the
prompt runs once, completions bucketed by length on top of its KV states). Prints a table, writes JSON,
and with ``--profile`` the top autograd ops of each mode.

    HF_HUB_OFFLINE=1 python benchmarks/bench_prompt_sharing.py --out benchmarks/results/prompt_sharing.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from rlvr.types import RolloutBatch


def group_batch(context: int, lengths: list[int], vocab: int, seed: int = 0) -> RolloutBatch:
    """One group: ``len(lengths)`` rows sharing a ``context``-token prompt, random tokens."""
    g = torch.Generator().manual_seed(seed)
    n, T = len(lengths), max(lengths)
    ctx = torch.randint(10, vocab, (context,), generator=g).tolist()
    ids = torch.randint(10, vocab, (n, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).float()
    return RolloutBatch(
        context_ids=[ctx] * n, completion_ids=torch.where(mask > 0, ids, torch.zeros_like(ids)), completion_mask=mask,
        group_id=torch.zeros(n, dtype=torch.long), prompt_index=torch.zeros(n, dtype=torch.long),
        is_truncated=torch.zeros(n, dtype=torch.bool), sampling_temperature=torch.ones(n),
        logprob_temperature=torch.ones(n), policy_version=torch.zeros(n, dtype=torch.long),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct) or 'tiny'")
    p.add_argument("--context", type=int, default=90)
    p.add_argument("--lengths", default="128,128,101,77,64,52,40,23", help="completion lengths of the group")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--out", default="benchmarks/results/prompt_sharing.json")
    a = p.parse_args(argv)

    from rlvr.config import ModelConfig
    from rlvr.models import load_policy
    from rlvr.models.tiny import build_tiny_model
    from rlvr.trainer.forward import completion_logprobs

    model = build_tiny_model(0)[0] if a.model == "tiny" else load_policy(ModelConfig(name_or_path=a.model))[0]
    model.float().train()
    lengths = [int(x) for x in a.lengths.split(",")]
    batch = group_batch(a.context, lengths, model.config.vocab_size)
    print(f"threads {torch.get_num_threads()}, context {a.context}, completions {lengths}")

    def once(share: bool) -> tuple[float, float]:
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        lp, _ = completion_logprobs(model, batch, pad_token_id=0, share_prompt=share)
        t1 = time.perf_counter()
        lp.sum().backward()
        return t1 - t0, time.perf_counter() - t1

    res: dict = {"args": vars(a), "modes": {}}
    for share in (False, True):
        once(share)  # warm-up
        runs = [once(share) for _ in range(a.repeats)]
        fwd, bwd = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        res["modes"]["shared" if share else "separate"] = {"forward_s": round(fwd, 3), "backward_s": round(bwd, 3)}
        if a.profile:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                once(share)
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
            print(f"--- profile, share_prompt={share}\n{table}")
    print("\n| mode | forward s | backward s | total s |\n|---|---|---|---|")
    for k, v in res["modes"].items():
        print(f"| {k} | {v['forward_s']} | {v['backward_s']} | {v['forward_s'] + v['backward_s']:.3f} |")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Why decode runs at ~3× its compute floor on CPU: small-row matmul rates, and where a decode round's time goes.

Two parts, both on the default model's own shapes (SmolLM2-135M: hidden 576, MLP 1536, vocabulary 49 152,
30 layers), printed as tables and written to ``--out`` (JSON):

``--part kernels``
    The fp32 rate (GFLOP/s) of one decode projection at ``M`` rows (the rows still generating; a GRPO
    round of 8 × 8 starts at 64 and shrinks), for four ways of computing ``x @ W.T``:

    * ``cached``: ``F.linear`` with one weight reused (it stays in cache: what a one-shape benchmark measures);
    * ``streamed``: ``F.linear`` over 30 distinct weights in turn, as a 30-layer decode step reads them
      (each from memory once per step): the in-model rate;
    * ``tall``: the same streamed weights as ``W @ x.T`` (the weight as the long operand);
    * ``mkl_packed``: MKL's prepacked weights (``torch.ops.mkl._mkl_linear``, what inductor's freezing uses).

    The LM head (``49 152 × 576``) is timed once per call (one weight, 113 MB in fp32).

``--part tall_ab``
    The same round's requests generated ``--reps`` times each way, alternating: plain, and with every
    ``nn.Linear`` of the model computing ``(W @ x.T).T`` (made contiguous) for ≤ 256 rows. It is the
    in-model test of the ``tall`` kernel, reported in seconds per decode row-step. The sampled tokens are
    expected to match, since the two ways differ only in rounding. The engine itself does not use ``tall``:
    this A/B found no gain outside the noise (``docs/benchmark.md``, "Sixth session").

``--part round``
    One generation round at ``bench_step.py``'s setting (8 ``chain_sum`` prompts × 8 samples, ≤ 128 new
    tokens, the config's seed, so the tokens of its step 1) through :class:`rlvr.engines.hf.HFEngine`, with
    forward hooks timing each module kind (MLP projections, attention projections, the rest of attention —
    rotary, KV cache, SDPA — norms, LM head) and the rows alive at each decode step.

Timings are for understanding costs, never test assertions. Heavy (the default model): take the shared lock::

    flock /tmp/rlvr-heavy.lock env HF_HUB_OFFLINE=1 PYTHONPATH=$PWD/src .venv/bin/python \\
        benchmarks/bench_decode_kernels.py --part kernels --part round
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402

from machine import print_machine  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "bench_decode_kernels.json"
SHAPES = {"q_proj/o_proj": (576, 576), "k_proj/v_proj": (192, 576), "gate_proj/up_proj": (1536, 576),
          "down_proj": (576, 1536)}
LAYERS = 30


def _median_s(fn: Callable[[], Any], reps: int = 7) -> float:
    fn()
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2]


def part_kernels(rows: list[int]) -> dict[str, Any]:
    """Rates of one projection shape at ``M`` rows, four ways (see the module docstring)."""
    torch.manual_seed(0)
    F = torch.nn.functional
    out: dict[str, Any] = {}
    print(f"\n{'projection':18s} {'M':>4s} {'cached':>8s} {'streamed':>9s} {'tall':>7s} {'mkl_packed':>11s}  (GFLOP/s)")
    shapes = dict(SHAPES, lm_head=(49152, 576))
    for name, (n, k) in shapes.items():
        layers = 1 if name == "lm_head" else LAYERS
        ws = [torch.randn(n, k) for _ in range(layers)]
        for m in rows:
            x = torch.randn(m, k)
            packed = [torch.ops.mkl._mkl_reorder_linear_weight(w, m) for w in ws]
            ways = {
                "cached": lambda: [F.linear(x, ws[0]) for _ in ws],
                "streamed": lambda: [F.linear(x, w) for w in ws],
                "tall": lambda: [torch.mm(w, x.t()) for w in ws],
                "mkl_packed": lambda: [torch.ops.mkl._mkl_linear(x, p, w, None, m) for p, w in zip(packed, ws)],
            }
            gflop = 2 * m * k * n * layers / 1e9
            rates = {way: gflop / _median_s(fn) for way, fn in ways.items()}
            out[f"{name}@{m}"] = rates
            print(f"{name:18s} {m:4d} {rates['cached']:8.1f} {rates['streamed']:9.1f} {rates['tall']:7.1f} "
                  f"{rates['mkl_packed']:11.1f}", flush=True)
    return out


def _bench_trainer() -> Any:
    """A :class:`~rlvr.trainer.trainer.Trainer` built exactly as ``bench_step.py`` builds its rlvr arm
    (default model, 8 ``chain_sum`` prompts × 8, ≤ 128 new tokens, the config's seed), so that a round
    samples the tokens of bench_step's step 1."""
    import bench_step
    from rlvr.trainer.trainer import Trainer

    args = argparse.Namespace(model="default", prompts=8, gens=8, max_new=128, dtype="auto", steps=1,
                              override=[])
    cfg, task, model, tok = bench_step.build(args, Path("/tmp/rlvr_bench_decode_kernels"))
    return Trainer(cfg, model, tok, task)


def _count_decode_rows(eng: Any) -> list[int]:
    """Wrap ``eng._forward`` so that each decode step (one new token per row) appends its row count to the
    returned list (clear it between rounds); prefill calls are not counted."""
    alive: list[int] = []
    forward = eng._forward

    def counting(ids, mask, pos, cache):
        if ids.shape[1] == 1:
            alive.append(int(ids.shape[0]))
        return forward(ids, mask, pos, cache)

    eng._forward = counting
    return alive


def part_round() -> dict[str, Any]:
    """One bench_step-sized generation round with per-module-kind timers (forward hooks)."""
    tr = _bench_trainer()
    model = tr.model
    acc: dict[str, float] = collections.defaultdict(float)
    alive = _count_decode_rows(tr.engine)

    def hooks(kind: str):
        def pre(mod, a):
            mod._rlvr_t0 = time.perf_counter()

        def post(mod, a, o):
            acc[kind] += time.perf_counter() - mod._rlvr_t0

        return pre, post

    handles = []
    for name, mod in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        kind = None
        if isinstance(mod, torch.nn.Linear):
            kind = {"gate_proj": "mlp_proj", "up_proj": "mlp_proj", "down_proj": "mlp_proj", "lm_head": "lm_head"}.get(
                leaf, "attn_proj")
        elif type(mod).__name__.endswith("Attention"):
            kind = "attn_module"
        elif type(mod).__name__.endswith("RMSNorm"):
            kind = "norm"
        elif mod is model:
            kind = "model"
        if kind:
            pre, post = hooks(kind)
            handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    t0 = time.perf_counter()
    batch, _ = tr.generate_batch()
    total = time.perf_counter() - t0
    for h in handles:
        h.remove()
    res = {
        "generate_s": total,
        "generated_tokens": int(batch.completion_mask.sum()),
        "decode_steps": len(alive),
        "row_steps": sum(alive),
        "rows_alive_histogram": {
            "49-64": sum(a > 48 for a in alive), "33-48": sum(32 < a <= 48 for a in alive),
            "17-32": sum(16 < a <= 32 for a in alive), "1-16": sum(a <= 16 for a in alive)},
        "seconds": {
            "mlp_projections": acc["mlp_proj"],
            "attention_projections": acc["attn_proj"],
            "attention_rest (rotary, KV cache, SDPA)": acc["attn_module"] - acc["attn_proj"],
            "norms": acc["norm"],
            "lm_head": acc["lm_head"],
            "model_other": acc["model"] - acc["mlp_proj"] - acc["attn_module"] - acc["norm"] - acc["lm_head"],
            "engine_outside_model (sampling, masks, cache compaction)": total - acc["model"],
        },
    }
    print(f"\ngeneration round: {total:.1f} s, {res['generated_tokens']} tokens, {res['decode_steps']} decode steps, "
          f"{res['row_steps']} row-steps; rows alive per step: {res['rows_alive_histogram']}")
    for k, v in res["seconds"].items():
        print(f"  {k:58s} {v:6.2f} s  ({100 * v / total:4.1f} %)")
    return res


def part_tall_ab(seed: int, reps: int) -> dict[str, Any]:
    """Alternate plain and ``tall`` linears over the bench round's requests; seconds per decode row-step."""
    import types

    from rlvr.engines.hf import HFEngine
    from rlvr.types import GenerationRequest, SamplingParams

    tr = _bench_trainer()
    model = tr.model
    batch, _ = tr.generate_batch()
    contexts: list[list[int]] = []
    for c in batch.context_ids:
        if list(c) not in contexts:
            contexts.append(list(c))
    reqs = [GenerationRequest(context_ids=c, n=8) for c in contexts]
    params = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=128, seed=seed)
    eng = HFEngine(model, tr.tokenizer)
    alive = _count_decode_rows(eng)

    def tall(self, x):
        rows = x.numel() // x.shape[-1]
        if rows > 256:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        y = torch.mm(self.weight, x.reshape(rows, x.shape[-1]).t()).t().contiguous()
        y = y if self.bias is None else y + self.bias
        return y.reshape(*x.shape[:-1], self.weight.shape[0])

    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    runs = []
    for rep in range(reps):
        for way in ("plain", "tall"):
            if way == "tall":  # an instance attribute, removed below: the module's class is untouched
                for m in linears:
                    m.forward = types.MethodType(tall, m)
            alive.clear()
            t0 = time.perf_counter()
            try:
                out = eng.generate(reqs, params)
            finally:
                for m in linears:
                    m.__dict__.pop("forward", None)
            dt = time.perf_counter() - t0
            toks = sum(len(g.token_ids) for gs in out for g in gs)
            runs.append({"way": way, "rep": rep, "seconds": dt, "tokens": toks, "row_steps": sum(alive),
                         "ms_per_row_step": 1e3 * dt / max(1, sum(alive))})
            print(f"tall_ab {way:5s} rep {rep}: {dt:5.1f} s, {toks} tokens, {sum(alive)} row-steps, "
                  f"{runs[-1]['ms_per_row_step']:.2f} ms/row-step", flush=True)
    return {"runs": runs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", action="append", choices=["kernels", "round", "tall_ab"],
                    help="repeatable; default: kernels and round")
    ap.add_argument("--rows", default="64,40,16,4", help="kernels: comma-separated row counts M")
    ap.add_argument("--seed", type=int, default=0, help="tall_ab: sampling seed of the timed rounds")
    ap.add_argument("--reps", type=int, default=2, help="tall_ab: alternations")
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args(argv)
    parts = a.part or ["kernels", "round"]
    res: dict[str, Any] = {"machine": print_machine(), "threads": torch.get_num_threads()}
    if "kernels" in parts:
        res["kernels_gflop_per_s"] = part_kernels([int(r) for r in a.rows.split(",")])
    if "round" in parts:
        res["round"] = part_round()
    if "tall_ab" in parts:
        res["tall_ab"] = part_tall_ab(a.seed, a.reps)
    res["loadavg_end"] = list(os.getloadavg())
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(f"\nwrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

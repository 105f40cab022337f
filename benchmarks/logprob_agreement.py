"""Per-token agreement of the engine's behaviour log-probs with the trainer's, and where a bf16 gap comes from.

On one model and one batch of prompts, the HF engine samples ``--gens`` completions per prompt (its own
decode loop: prefill, then one token at a time on a KV cache) and the trainer's forward
(:func:`rlvr.trainer.forward.batch_logprobs`: the code that computes ``old_logp`` and, with gradient, the
update's log-probs; fp32 master weights under the model's precision policy) recomputes the log-probs of the
same tokens. Over all completion tokens it reports ``|Δ log p|`` (median, p99, max, mean) and the share of
tokens whose TIS weight the default correction would change (``actor/rollout_is_changed``: the same
:func:`rlvr.core.rollout_is.rollout_is_weights` call as :func:`rlvr.core.objective.policy_objective`, with the
config's default ``vllm_importance_sampling_mode`` and clip bounds).

Arms:

* ``fp32``: engine fp32 vs trainer fp32 (``model.dtype=fp32``; float noise only);
* ``bf16``: engine bf16 (its bf16 copy of the weights) vs trainer bf16 (autocast over the fp32 masters):
  what a ``model.dtype=bf16`` run sees;
* ``decode_vs_full``: the same bf16-weight model, the engine's incremental KV-cache decode vs one full
  forward of the trainer's code (no autocast): the kernel / shape / accumulation-order part;
* ``weights_vs_autocast``: one full forward each, bf16-cast weights vs fp32 masters under autocast: the part
  due to a bf16 residual stream and norms (autocast keeps them in fp32). With ``decode_vs_full`` it adds up to
  ``bf16`` token by token (``Δ_bf16 = Δ_decode + Δ_weights``);
* with ``--options`` (default on), the bf16 policy with the switches of :class:`rlvr.precision.PrecisionPolicy`:
  ``bf16+generation_autocast`` (the engine decodes from the masters under the trainer's autocast),
  ``bf16+cast_lm_head_to_fp32`` (the LM head in fp32 on both sides) and ``bf16+both``. Each samples its own
  completions (same seed), so their tokens differ from the ``bf16`` arm's.

The engine's generate time and the trainer forward's time are reported per sampled arm (one call each, the
first arm's including warm-up: an indication only). ``--cost-repeats N`` times the cost properly for ``bf16``
and ``bf16+both``: the arms alternate ``N`` times, each timing one generation round (the same requests) and one
training forward + backward over the round (micro-batches of ``per_device_train_batch_size`` rows, the
update's code path), and the best of each is reported.

    PYTHONPATH=$PWD/src .venv/bin/python benchmarks/logprob_agreement.py --model tiny          # seconds
    flock /tmp/rlvr-heavy.lock env HF_HUB_OFFLINE=1 PYTHONPATH=$PWD/src .venv/bin/python \\
        benchmarks/logprob_agreement.py --model default                     # SmolLM2-135M, 4 x 4 x 24

Prints the machine first (``benchmarks/machine.py``) and a table; writes
``benchmarks/results/logprob_agreement_<model>.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from rlvr.config import build_config  # noqa: E402
from rlvr.core.rollout_is import rollout_is_weights  # noqa: E402
from rlvr.engines.hf import HFEngine  # noqa: E402
from rlvr.precision import resolve_precision, set_model_precision  # noqa: E402
from rlvr.samplers.group import GroupSampler, PromptEncoder  # noqa: E402
from rlvr.trainer.forward import batch_logprobs  # noqa: E402
from rlvr.types import SamplingParams  # noqa: E402

from machine import print_machine  # noqa: E402  (benchmarks/machine.py)

RESULTS = Path(__file__).parent / "results"
OPTIONS = {"bf16+generation_autocast": {"generation_autocast": True},
           "bf16+cast_lm_head_to_fp32": {"lm_head_fp32": True},
           "bf16+both": {"generation_autocast": True, "lm_head_fp32": True}}


def agreement_stats(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, tis: dict[str, Any] | None = None
                    ) -> dict[str, float]:
    """``|a − b|`` over ``mask > 0`` (``[n, T]`` log-probs, nats): tokens, median, p99, max, mean; with
    ``tis`` (``mode``, ``clip_max``, ``clip_min``) also ``rollout_is_changed``, the share of those tokens whose
    truncated/masked IS weight differs from the raw ratio, ``a`` taken as the trainer's side and ``b`` as the
    rollout's (the metric ``actor/rollout_is_changed``), and the raw ratio's range."""
    m = mask > 0
    d = (a - b)[m].double().abs()
    out = {"tokens": int(m.sum()), "median": float(d.median()), "p99": float(d.quantile(0.99)),
           "max": float(d.max()), "mean": float(d.mean())}
    if tis is not None:
        _, changed = rollout_is_weights(a, b, mask.to(a.dtype), mode=tis["mode"], clip_max=tis["clip_max"],
                                        clip_min=tis["clip_min"])
        ratio = (a - b)[m].double().exp()
        out.update({"rollout_is_changed": float(changed[m].double().mean()), "ratio_min": float(ratio.min()),
                    "ratio_max": float(ratio.max())})
    return out


def _load(model_name: str, max_new: int):
    """(cfg, task, model in fp32, tokenizer) for ``tiny`` (the tests' random llama, peakier init, toy task) or
    a model name / path (``default``: SmolLM2-135M-Instruct on the default task)."""
    cfg = build_config([], [f"model.name_or_path={'default' if model_name == 'tiny' else model_name}",
                            "model.dtype=fp32", f"max_completion_length={max_new}"])
    if model_name == "tiny":
        from rlvr.models import build_tiny_model
        from rlvr.testing import ToyTask

        model, tok = build_tiny_model(0, initializer_range=0.2)
        return cfg, ToyTask(), model, tok
    from rlvr.models import load_policy
    from rlvr.tasks import build_task

    model, tok = load_policy(cfg.model)
    return cfg, build_task(cfg.task), model, tok


def _cost(model, tok, encoder, problems, gens, params, pad, rows, policies, repeats) -> dict[str, dict]:
    """Best-of-``repeats`` seconds of one generation round and one training forward + backward per policy,
    the policies alternating (so a drift in the machine's load hits all alike); ``{}`` when ``repeats < 1``."""
    from rlvr.trainer.forward import completion_logprobs, micro_batches

    if repeats < 1:
        return {}
    best: dict[str, dict] = {}
    engines = {name: HFEngine(model, tok, precision=p) for name, p in policies.items()}
    for _ in range(repeats):
        for name, policy in policies.items():
            set_model_precision(model, None)
            t = time.perf_counter()
            batch = GroupSampler(engines[name], encoder, pad).sample(problems, gens, params, first_group_id=0)
            gen_s = time.perf_counter() - t
            set_model_precision(model, policy)
            model.train()
            t = time.perf_counter()
            for idx in micro_batches(batch, rows):
                lp, _ = completion_logprobs(model, batch.select(idx), pad_token_id=pad, with_entropy=False)
                lp.sum().backward()
            fb_s = time.perf_counter() - t
            model.zero_grad(set_to_none=True)
            model.eval()
            set_model_precision(model, None)
            row = {"generate_s": gen_s, "forward_backward_s": fb_s,
                   "generated_tokens": int(batch.completion_mask.sum())}
            old = best.get(name)
            best[name] = row if old is None else {
                "generate_s": min(old["generate_s"], gen_s), "forward_backward_s": min(old["forward_backward_s"], fb_s),
                "generated_tokens": row["generated_tokens"]}
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default", help="tiny | default | a model path")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--gens", type=int, default=4)
    ap.add_argument("--max-new", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--options", action=argparse.BooleanOptionalAction, default=True,
                    help="also measure the bf16 policy with generation_autocast / cast_lm_head_to_fp32")
    ap.add_argument("--cost-repeats", type=int, default=0,
                    help="time generate and forward+backward for bf16 vs bf16+both, alternating, best of N")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    machine = print_machine()
    cfg, task, model, tok = _load(args.model, args.max_new)
    pad = tok.pad_token_id
    encoder = PromptEncoder(tok, cfg.task.system_prompt or task.system_prompt, cfg.max_prompt_length)
    problems = task.problems("train")[: args.prompts]
    params = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                            max_new_tokens=args.max_new, seed=args.seed)
    tis = {"mode": cfg.vllm_importance_sampling_mode, "clip_max": cfg.vllm_importance_sampling_clip_max,
           "clip_min": cfg.vllm_importance_sampling_clip_min}
    rows = cfg.per_device_train_batch_size
    fp32, bf16 = resolve_precision("fp32", log=False), resolve_precision("bf16", log=False)

    def sampled(policy):
        """(engine, batch, trainer log-probs, timings) of one policy on both sides."""
        set_model_precision(model, None)
        t = time.perf_counter()
        engine = HFEngine(model, tok, precision=policy)
        batch = GroupSampler(engine, encoder, pad).sample(problems, args.gens, params, first_group_id=0)
        gen_s = time.perf_counter() - t
        set_model_precision(model, policy)
        t = time.perf_counter()
        logp, _ = batch_logprobs(model, batch, pad_token_id=pad, rows_per_micro=rows)
        set_model_precision(model, None)
        return engine, batch, logp, {"generate_s": round(gen_s, 3), "train_forward_s": round(time.perf_counter() - t, 3)}

    arms: dict[str, dict] = {}
    _, b32, lp32, t32 = sampled(fp32)
    arms["fp32"] = {**agreement_stats(lp32, b32.sampler_logp, b32.completion_mask, tis), **t32}
    eng16, b16, lp16, t16 = sampled(bf16)
    mask = b16.completion_mask
    arms["bf16"] = {**agreement_stats(lp16, b16.sampler_logp, mask, tis), **t16}
    copy = eng16._decode_model  # the engine's bf16-weight copy: the same weights the decode ran
    set_model_precision(copy, None)  # no policy: a plain bf16 forward, no autocast
    lp_w, _ = batch_logprobs(copy, b16, pad_token_id=pad, rows_per_micro=rows)
    arms["decode_vs_full"] = agreement_stats(lp_w, b16.sampler_logp, mask, tis)
    arms["weights_vs_autocast"] = agreement_stats(lp16, lp_w, mask)
    resid = ((lp16 - b16.sampler_logp) - (lp16 - lp_w) - (lp_w - b16.sampler_logp))[mask > 0].abs().max()
    if args.options:
        for name, switches in OPTIONS.items():
            _, b, lp, t = sampled(dataclasses.replace(bf16, **switches))
            arms[name] = {**agreement_stats(lp, b.sampler_logp, b.completion_mask, tis), **t}

    cost = _cost(model, tok, encoder, problems, args.gens, params, pad, rows,
                 {"bf16": bf16, "bf16+both": dataclasses.replace(bf16, **OPTIONS["bf16+both"])}, args.cost_repeats)
    n_tok = arms["fp32"]["tokens"]
    print(f"\n{args.model}: {args.prompts} prompts x {args.gens} samples x <= {args.max_new} new tokens, "
          f"temperature {params.temperature}; TIS {tis['mode']} clip [{tis['clip_min']}, {tis['clip_max']}]")
    print(f"| arm | tokens | median |Δ log p| | p99 | max | mean | rollout_is_changed | generate s | train fwd s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, st in arms.items():
        chg = f"{st['rollout_is_changed']:.2%}" if "rollout_is_changed" in st else "–"
        print(f"| {name} | {st['tokens']} | {st['median']:.2e} | {st['p99']:.2e} | {st['max']:.2e} | "
              f"{st['mean']:.2e} | {chg} | {st.get('generate_s', '–')} | {st.get('train_forward_s', '–')} |")
    print(f"(decomposition residual max {float(resid):.1e}; fp32 arm {n_tok} tokens)")
    for name, c in cost.items():
        print(f"cost {name}: generate {c['generate_s']:.2f} s ({c['generated_tokens']} tokens), forward+backward "
              f"{c['forward_backward_s']:.2f} s (best of {args.cost_repeats})")
    out = {"settings": vars(args), "machine": machine, "sampling": dataclasses.asdict(params), "tis": tis,
           "arms": arms, "decomposition_residual_max": float(resid), "cost": cost}
    path = Path(args.out) if args.out else RESULTS / f"logprob_agreement_{Path(args.model).name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

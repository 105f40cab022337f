"""Rollout throughput of a 3-turn tools environment vs single-turn generation (issue 26, "Measured").

Arms, on the same problems, engine and sampling settings, timed side by side (alternating, ``--repeats``
rounds, the order rotated every round):

* ``single``  — single-turn generation as training does it without an environment:
  :class:`rlvr.samplers.group.GroupSampler`, ``G`` samples of each of ``P`` prompts, ``turns × T`` new
  tokens each;
* ``single_tools_prompt`` — the same, each prompt rendered as the ``tools`` episodes open (the tools'
  schemas in the system turn: ~200 tokens on SmolLM2 instead of ~30), so that the only difference left to
  ``tools`` is the turns;
* ``tools``   — the ``tools`` environment (:class:`rlvr.envs.tools.ToolEnv`, the ``calculator`` tool)
  through :class:`rlvr.samplers.multiturn.MultiTurnSampler`: ``turns`` model turns of ``T`` tokens each,
  every turn but the last followed by a calculator call and its ``tool`` message. The same ``P × G ×
  turns × T`` generated tokens as ``single``. The engine keeps each row's KV cache between the turns
  (:meth:`rlvr.engines.hf.HFEngine.kv_session`, which the sampler opens), so a later turn prefills only the
  last sampled token and the observation;
* ``tools_recompute`` — the same episodes with the engine's KV session hidden: every later turn prefills its
  whole context again (what the sampler did before the session existed).

Equal generated tokens: the engine's EOS set is emptied for both arms (``--eos`` keeps it), so every
turn runs to its cap; and an untrained model rarely writes a well-formed call, so :class:`BenchToolEnv`
makes the call itself when the turn has none (``calculator`` on the problem's expression, run by
``ToolEnv``'s own thread-pool path), so every episode has exactly ``turns`` turns. What is timed for
``tools`` is the sampler as shipped: one batched engine call per turn over all live episodes, the
observation tokens rendered once per observation by the chat template, the environment's steps
concurrently in threads.

Reported per arm: the share of wall time in the engine's prefills (every arm), generated (model) tokens per wall second, the fastest and the median round, and per CPU
second of the process (``tok/cpu-s``: with ``--threads 1`` the number least disturbed by other users of a
shared machine, as in ``bench_generate.py``); for
``tools`` also the share of its wall time in the engine, in environment steps (``tools``: parsing,
the tool threads, the calculator), in chat-template rendering (the opening prompts and every
observation: render + tokenize) and the rest (decoding actions, building the batch). The headline is
``ratio`` = tools tok/s ÷ single tok/s (median rounds; target ≥ 0.8, docs/environments.md), and ``ratios``
also against ``single_tools_prompt`` (what the turns cost) and for ``tools_recompute``. ``--arms`` picks the arms
(``single`` and ``tools`` always; ``tools_recompute`` is slow on a CPU and off by default).

Run (the default model, under the shared lock)::

    HF_HUB_OFFLINE=1 flock /tmp/rlvr-heavy.lock python benchmarks/bench_envs.py

``--model tiny`` runs the same code on the tiny random model (seconds; what the test does). Prints the
machine (``benchmarks/machine.py``), a table, and writes ``benchmarks/results/bench_envs.json``. Timings
on the shared 2-core machines are noisy; they are never test assertions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402

from rlvr.envs import Step  # noqa: E402
from rlvr.envs.template import render_opening  # noqa: E402
from rlvr.envs.tools import ToolCall, ToolEnv  # noqa: E402
from rlvr.samplers.group import GroupSampler, PromptEncoder  # noqa: E402
from rlvr.samplers.multiturn import EpisodeLimits, MultiTurnSampler  # noqa: E402
from rlvr.tasks.prompts import build_messages  # noqa: E402
from rlvr.types import SamplingParams  # noqa: E402

from machine import print_machine  # noqa: E402  (benchmarks/machine.py)

RESULTS = Path(__file__).parent / "results" / "bench_envs.json"
QUESTIONS = ["What is 17 + 25?", "What is 8 * 7?", "What is 144 / 12?", "What is 1000 - 387?",
             "What is 12 + 19 + 33?", "What is 60 * 3?", "What is 45 - 17?", "What is 9 * 12?"]


class _Problem:
    def __init__(self, i: int, q: str) -> None:
        self.uid, self.question = f"bench{i}", q
        self.answer = str(int(eval(q.split("is ")[1].rstrip("?"))))  # noqa: S307 - our own literals
        self.metadata: dict[str, Any] = {}


class _Verdict:
    def __init__(self, ok: bool) -> None:
        self.correct, self.score, self.feedback, self.extracted = ok, float(ok), None, None


class BenchTask:
    """Arithmetic questions (:data:`QUESTIONS`, cycled) with an exact-number verifier."""

    name = "bench_arith"
    system_prompt = "Answer with a number."

    def __init__(self, n: int) -> None:
        self._problems = [_Problem(i, QUESTIONS[i % len(QUESTIONS)]) for i in range(n)]

    def problems(self, split: str = "train") -> list[_Problem]:
        """The ``n`` problems (both splits)."""
        return self._problems

    def verify(self, problem: _Problem, text: str) -> _Verdict:
        """Correct when the last number in ``text`` is the answer."""
        nums = re.findall(r"-?\d+", text)
        return _Verdict(bool(nums) and nums[-1] == problem.answer)


class BenchToolEnv(ToolEnv):
    """``ToolEnv`` with the ``calculator`` whose episodes always last ``turns`` model turns.

    Turns ``1..turns-1``: the turn's tool calls (parsed as ``ToolEnv`` does), or, when it has none, a
    ``calculator`` call on the problem's expression; they run through ``ToolEnv._run_calls`` (threads,
    timeout, output cut) and come back as ``tool`` messages. Turn ``turns``: scored by the task, done.
    Source: interpretation (issue 26 "Measured": a fixed number of turns makes the comparison at equal
    generated tokens exact).
    """

    def __init__(self, task: Any, turns: int = 3, **kw: Any) -> None:
        super().__init__(task, tools=("calculator",), **kw)
        self.turns, self.turn = int(turns), 0

    def step(self, action: str) -> Step:
        """A tool turn (the model's calls or the scripted one) until the last turn, then the verdict."""
        self.turn += 1
        if self.turn >= self.turns:
            score, correct, feedback = self._judge(action)
            return Step([], score, True, feedback, {"correct": correct, "tool_calls": 0, "tool_errors": 0})
        calls = self.parse(action) or [ToolCall("calculator", {"expression": self.problem.question.split("is ")[1].rstrip("?")})]
        outs, errors = self._run_calls(calls)
        obs = [{"role": "tool", "name": c.name or "unknown", "content": o} for c, o in zip(calls, outs)]
        return Step(obs, 0.0, False, None, {"tool_calls": len(calls), "tool_errors": errors})


class _Timer:
    """Wraps callables so their wall time adds up under a name."""

    def __init__(self) -> None:
        self.s: dict[str, float] = {}
        self.calls: dict[str, list[float]] = {}

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                took = time.perf_counter() - t
                self.s[name] = self.s.get(name, 0.0) + took
                self.calls.setdefault(name, []).append(took)
        return timed


def load(model_name: str) -> tuple[Any, Any]:
    """``(model, tokenizer)``: ``tiny`` (random, in-process) or any ``model.name_or_path`` (default: SmolLM2-135M)."""
    from rlvr.config import ModelConfig
    from rlvr.models import load_policy

    return load_policy(ModelConfig(name_or_path=model_name))


class _ToolsPromptEncoder(PromptEncoder):
    """The prompt the ``tools`` episodes open with (the tools' schemas in it), for ``single_tools_prompt``."""

    def __init__(self, tok: Any, system_prompt: str, tools: Any) -> None:
        super().__init__(tok, system_prompt, 4096)
        self.tools = tools

    def text(self, problem: Any) -> str:
        """The opening prompt of a ``tools`` episode of ``problem``."""
        return render_opening(self.tokenizer, build_messages(problem, self.system_prompt), self.tools)


def run_single(engine: Any, tok: Any, task: BenchTask, G: int, params: SamplingParams,
               tools_prompt: bool = False) -> dict[str, Any]:
    """One round of the ``single`` arm (``tools_prompt``: ``single_tools_prompt``): generated tokens and wall seconds."""
    encoder = (_ToolsPromptEncoder(tok, task.system_prompt, BenchToolEnv(task).tools) if tools_prompt
               else PromptEncoder(tok, task.system_prompt, 4096))
    sampler = GroupSampler(engine, encoder, tok.pad_token_id)
    timer = _Timer()
    engine._prefill = timer.wrap("prefill", engine._prefill)
    try:
        t, c = time.perf_counter(), time.process_time()
        batch = sampler.sample(task.problems(), G, params)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
    finally:
        del engine._prefill
    return {"tokens": int(batch.completion_mask.sum()), "wall_s": wall, "cpu_s": cpu, "prefill_s": timer.s["prefill"], "prompt_tokens": len(encoder(task.problems()[0]))}


def run_tools(engine: Any, tok: Any, task: BenchTask, G: int, params: SamplingParams, turns: int,
              turn_tokens: int, reuse: bool = True) -> dict[str, Any]:
    """One round of the ``tools`` arm (``reuse=False``: ``tools_recompute``, the engine without
    :meth:`~rlvr.engines.hf.HFEngine.kv_session`): model tokens, wall seconds and where the time went."""
    encoder = PromptEncoder(tok, task.system_prompt, 4096)
    limits = EpisodeLimits(max_turns=turns, max_tokens=1 << 20, timeout_s=0.0)
    sampler = MultiTurnSampler(engine, tok, lambda: BenchToolEnv(task, turns=turns, system_prompt=task.system_prompt), limits, encoder, tok.pad_token_id)
    timer = _Timer()
    gen, session = engine.generate, engine.kv_session
    stores: list[Any] = []

    @contextlib.contextmanager
    def counted():
        with session() as store:
            stores.append(store)
            yield store

    engine.kv_session = counted if reuse else None  # the sampler opens a session when the engine has one
    engine.generate = timer.wrap("engine", gen)
    engine._prefill = timer.wrap("prefill", engine._prefill)  # inside the engine calls
    sampler.renderer.tokens = timer.wrap("template", sampler.renderer.tokens)
    sampler._prompt_ids = timer.wrap("template", sampler._prompt_ids)
    calls = sampler._calls
    sampler._calls = lambda eps, method, args: (timer.wrap("env_" + method, calls)(eps, method, args))
    try:
        t, c = time.perf_counter(), time.process_time()
        batch = sampler.sample(task.problems(), G, SamplingParams(**{**params.__dict__, "max_new_tokens": turn_tokens}))
        wall, cpu = time.perf_counter() - t, time.process_time() - c
    finally:
        del engine.generate, engine.kv_session, engine._prefill  # the instance attributes: back to the class's methods
    m = batch.metrics
    model_tokens = int(batch.model_mask.sum())
    return {"tokens": model_tokens, "wall_s": wall, "cpu_s": cpu, "turns_mean": m["env/turns_mean"],
            "tool_calls": m["env/tool_calls"], "env_tokens": m["env/env_tokens"],
            "engine_s": timer.s.get("engine", 0.0), "tools_s": timer.s.get("env_step", 0.0),
            "template_s": timer.s.get("template", 0.0), "reset_s": timer.s.get("env_reset", 0.0),
            "engine_calls_s": timer.calls.get("engine", []), "prefill_s": timer.s.get("prefill", 0.0),
            "kv_hits": sum(st.hits for st in stores), "kv_reused_tokens": sum(st.reused_tokens for st in stores)}


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["tokens"] / r["wall_s"] for r in rows]
    cpu_rates = [r["tokens"] / r["cpu_s"] for r in rows if r["cpu_s"] > 0]
    out = {"rounds": len(rows), "tokens": rows[0]["tokens"], "tok_per_s_best": max(rates),
           "tok_per_s_median": statistics.median(rates), "wall_s_median": statistics.median(r["wall_s"] for r in rows),
           "tok_per_cpu_s_median": statistics.median(cpu_rates) if cpu_rates else math.nan,
           "prefill_share": statistics.median(r["prefill_s"] / r["wall_s"] for r in rows)}
    if "engine_s" in rows[0]:
        for k in ("engine_s", "tools_s", "template_s", "reset_s"):
            out[k.replace("_s", "_share")] = statistics.median(r[k] / r["wall_s"] for r in rows)
        out["other_share"] = 1 - sum(out[k] for k in ("engine_share", "tools_share", "template_share", "reset_share"))
        for k in ("turns_mean", "tool_calls", "env_tokens", "kv_hits", "kv_reused_tokens"):
            out[k] = rows[0][k]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default", help="model.name_or_path (default: SmolLM2-135M; tiny for a smoke run)")
    ap.add_argument("--prompts", type=int, default=8, help="P problems per round")
    ap.add_argument("--generations", type=int, default=8, help="G episodes per problem")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--turn-tokens", type=int, default=32, help="T tokens per model turn (single: turns × T)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds; each runs every arm once, order rotated")
    ap.add_argument("--arms", default="single,single_tools_prompt,tools",
                    help="comma-separated, from single, single_tools_prompt, tools, tools_recompute (slow)")
    ap.add_argument("--eos", action="store_true", help="keep EOS (token counts then differ between arms)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = print_machine()
    from rlvr.engines.hf import HFEngine

    model, tok = load(args.model)
    model.eval()
    task = BenchTask(args.prompts)
    engine = HFEngine(model, tok, max_batch_size=args.prompts * args.generations)
    if not args.eos:
        engine.eos_token_ids = set()  # every turn runs to its cap: equal generated tokens in both arms
    params = SamplingParams(temperature=1.0, max_new_tokens=args.turns * args.turn_tokens, seed=args.seed)
    arms: dict[str, Callable[[], dict[str, Any]]] = {
        "single": lambda: run_single(engine, tok, task, args.generations, params),
        "single_tools_prompt": lambda: run_single(engine, tok, task, args.generations, params, tools_prompt=True),
        "tools": lambda: run_tools(engine, tok, task, args.generations, params, args.turns, args.turn_tokens),
        "tools_recompute": lambda: run_tools(engine, tok, task, args.generations, params, args.turns, args.turn_tokens,
                                             reuse=False),
    }
    names = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(names) - set(arms))
    if unknown or "single" not in names or "tools" not in names:
        ap.error(f"--arms: need single and tools, from {', '.join(arms)}; got unknown {unknown}")
    rows: dict[str, list[dict[str, Any]]] = {a: [] for a in names}
    arms["single"]()  # warm-up (allocator, thread pools), not timed
    for r in range(args.repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for a in order:
            res = arms[a]()
            rows[a].append(res)
            print(f"[round {r + 1}] {a:7} {res['tokens']:6d} tok in {res['wall_s']:6.2f} s = "
                  f"{res['tokens'] / res['wall_s']:7.1f} tok/s", flush=True)
    summ = {a: _summary(rows[a]) for a in names}
    ratio = summ["tools"]["tok_per_s_median"] / summ["single"]["tok_per_s_median"]
    base = summ.get("single_tools_prompt", summ["single"])["tok_per_s_median"]
    ratios = {f"tools/{a}": summ["tools"]["tok_per_s_median"] / summ[a]["tok_per_s_median"]
              for a in ("single", "single_tools_prompt") if a in summ}
    cpu_ratios = {f"tools/{a}": summ["tools"]["tok_per_cpu_s_median"] / summ[a]["tok_per_cpu_s_median"]
                  for a in ("single", "single_tools_prompt") if a in summ}
    if "tools_recompute" in summ:
        ratios["tools_recompute/single"] = summ["tools_recompute"]["tok_per_s_median"] / summ["single"]["tok_per_s_median"]
        ratios["tools_recompute/single_tools_prompt"] = summ["tools_recompute"]["tok_per_s_median"] / base
    t = summ["tools"]
    print("\n| arm | generated tokens | tok/s (median) | tok/s (best) | tok/cpu-s (median) | wall s (median) | "
          "prefill share |\n|---|---|---|---|---|---|---|")
    for a in names:
        s = summ[a]
        print(f"| {a} | {s['tokens']} | {s['tok_per_s_median']:.1f} | {s['tok_per_s_best']:.1f} | "
              f"{s['tok_per_cpu_s_median']:.1f} | {s['wall_s_median']:.2f} | {s['prefill_share']:.1%} |")
    print("\nratios (median tok/s; target tools >= 0.8x single): " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items())
          + "; per CPU second: " + ", ".join(f"{k} {v:.2f}" for k, v in cpu_ratios.items()))
    print(f"tools time: engine {t['engine_share']:.1%}, "
          f"environment steps (tools) {t['tools_share']:.1%}, template rendering {t['template_share']:.1%}, "
          f"resets {t['reset_share']:.1%}, other {t['other_share']:.1%}; "
          f"{t['turns_mean']:.1f} turns, {t['tool_calls']:.1f} tool calls and {t['env_tokens']:.0f} environment tokens per episode")
    out = {"machine": machine, "args": vars(args), "model": args.model, "torch_threads": torch.get_num_threads(),
           "decode_dtype": str(engine.decode_dtype).removeprefix("torch."),
           "arms": summ, "rounds": rows, "ratio": ratio, "ratios": ratios,
           "cpu_ratios": cpu_ratios}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

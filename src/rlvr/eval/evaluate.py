"""Held-out evaluation: unbiased pass@k, maj@k and mean reward, with 95 % intervals, on a task split.

What is measured and how (sampling, greedy, intervals, tie rules) is written up in
``docs/evaluation.md``; the statistics live in :mod:`rlvr.eval.stats`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from rlvr.core.pass_at_k import pass_at_k
from rlvr.eval.stats import answer_key, maj_at_k, majority_vote
from rlvr.eval.summary import summarize_records
from rlvr.rewards import Scorer, ScoreStats
from rlvr.samplers.group import GroupSampler, PromptEncoder
from rlvr.types import SamplingParams

CONTINUOUS_QUEUE = 4
"""Under ``continuous=True``, problems per engine call as a multiple of those whose samples fill the decode
slots (interpretation: 4x gave 1.47x tokens/s on GSM8K, ``bench_continuous.py`` 64 questions / 16 slots; a
longer queue keeps the slots fuller but delays the progress bar and the streamed records by as much)."""

ProblemCallback = Callable[[dict[str, Any]], None]
SamplerFactory = Callable[[Any, PromptEncoder, Scorer], Any]
"""``(engine, encoder, scorer) -> sampler`` for environment episodes (the CLI builds
:func:`rlvr.samplers.multiturn.make_multiturn_sampler` from the run's ``env:``)."""


def evaluate(
    model: Any,
    tokenizer: Any,
    task: Any,
    *,
    num_samples: int,
    ks: Sequence[int],
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 256,
    max_prompt_length: int = 512,
    system_prompt: str | None = None,
    prompts_per_batch: int = 8,
    seed: int = 0,
    engine: Any = None,
    split: str = "eval",
    limit: int | None = None,
    offset: int = 0,
    progress: bool = False,
    label: str | None = None,
    on_problem: ProblemCallback | None = None,
    make_sampler: SamplerFactory | None = None,
    continuous: bool = False,
) -> dict[str, Any]:
    """Sample ``num_samples`` completions per problem of ``split`` and report pass@k, maj@k and rewards.

    * pass@k: the unbiased estimator of Chen et al. (2021, §2.1) averaged over problems; a
      completion passes when its verdict is ``correct``.
    * maj@k: majority vote over the verifier's extracted answers (:func:`rlvr.eval.stats.maj_at_k`:
      consecutive blocks of k samples, ties to the answer given first, abstentions ignored);
      omitted when the verifier extracts no answers at all.
    * 95 % intervals (``ci95/<metric>`` = ``[low, high]``, ``ci_method/<metric>``): Wilson when each
      problem contributes a 0/1 outcome, else a percentile bootstrap over problems
      (:func:`rlvr.eval.stats.mean_with_ci`), for every pass@k, maj@k and ``reward/mean``.

    ``temperature == 0`` is greedy decoding: the engine's argmax (ties to the lowest token id), so
    one sample per problem is drawn whatever ``num_samples`` says and only k = 1 is reported
    (``ks_skipped`` lists the others). Otherwise ``ks`` larger than ``num_samples`` are skipped too.

    Args:
        split: which split of ``task``; its problems are used in the task's order.
        limit: evaluate only the first ``limit`` problems (None: all); ``num_problems_total`` keeps
            the split's size and ``problems`` says ``"N of M"`` when the split was capped (by
            ``limit`` or by a task's ``eval_size``, via ``task.source_sizes``).
        offset: skip the split's first ``offset`` problems (then ``limit`` counts from there): one
            shard of a split evaluated in pieces (``row_range`` = ``[offset, offset + N)`` in the result;
            :func:`rlvr.eval.merge.merge_samples` combines the pieces). Batch seeds and group ids use
            the problem's index in the whole split, so shards whose offsets are multiples of
            ``prompts_per_batch`` draw exactly the batches of one run over all problems.
        prompts_per_batch: problems per engine call; their ``prompts_per_batch × samples`` sequences
            decode together (the default engine's ``max_batch_size`` is set to that, so no call is
            split into smaller decode batches).
        progress: show a tqdm bar (problems, rate, ETA) on stderr.
        label: the model's name in the bar and the result (``model``).
        on_problem: called after each problem with its record (uid, question, gold, every sample
            with text, extracted answer, verdict and reward; pass/maj outcomes) — e.g. to stream
            per-problem JSONL; the records are not kept in memory otherwise.
        make_sampler: environment episodes instead of single completions (``env.type``): the factory's
            :class:`rlvr.samplers.multiturn.MultiTurnSampler` runs each sample as an episode, as in
            training. A sample's ``reward`` is the episode's reward (the sum of its step rewards), its
            ``correct`` the sampler's verdict (the environment's last ``info["correct"]``, else
            reward > 0; an episode that failed is not correct), its ``extracted`` answer (maj@k) the
            task verifier's on the last model turn, ``length`` its model tokens, ``truncated`` its
            last model turn hit a token cap, ``text`` the whole episode, and ``episode`` its turns, tool calls and
            finish reasons; the result then has the ``env/*`` metrics of training over all samples.
        continuous: continuous batching (config ``continuous_batching``; the default engine only): the engine
            keeps ``prompts_per_batch × samples`` decode slots and each call queues
            :data:`CONTINUOUS_QUEUE` times as many problems, so a finished row's slot is refilled at once
            instead of idling until the call's longest row ends (1.47x tokens/s on 64 GSM8K questions,
            greedy, <= 512 tokens, ``benchmarks/bench_continuous.py``). Greedy results are the chunked
            loop's up to float rounding; sampled ones are drawn per call, whose seed is ``seed`` plus its
            first problem's index, so they are reproducible but differ from ``continuous=False``'s, and
            shards (``offset``) reproduce a whole run when their offsets are multiples of
            ``CONTINUOUS_QUEUE × prompts_per_batch``.

    Returns:
        a JSON-serialisable dict: settings (``task``, ``split``, ``model``, ``num_problems``,
        ``num_problems_total``, ``problems``, ``row_range``, ``num_samples``, ``temperature``, ``decoding``,
        ``top_p``, ``max_new_tokens``, ``seed``, ``ks``, ``continuous_batching`` (whether the engine batched
        continuously: sampled draws depend on it), ``precision``: the mode the samples were drawn at,
        also in every ``on_problem`` record), metrics (``pass@k``, ``maj@k``,
        ``reward/mean``, ``reward/pass_rate``, their ``ci95/`` and ``ci_method/``, ``answers/extracted_ratio``,
        ``completions/mean_length``, ``completions/clipped_ratio``, ``reward/verifier_errors``),
        ``time_s``, ``tokens_per_s`` (generated tokens per wall second), ``torch_threads`` and ``per_problem`` (uid, correct count, n, mean reward,
        seen_in_train, the first sample's text). When some eval problems also occur in the train
        split (``metadata["seen_in_train"]``), ``unseen/pass@k`` reports the others only.

    Raises:
        ValueError: ``num_samples < 1``, ``limit < 1``, ``offset < 0`` or past the split's end, a ``k < 1``,
            ``temperature < 0``, or the split is empty.
    """
    _check_eval_args(num_samples, limit, offset, ks, temperature)
    greedy = temperature == 0
    n_draw = 1 if greedy else num_samples
    ks_used = sorted({int(k) for k in ks if int(k) <= n_draw})
    ks_skipped = sorted({int(k) for k in ks} - set(ks_used))
    problems, total = _split_problems(task, split, limit, offset)
    sampler, scorer, precision = _eval_sampler(model, tokenizer, task, engine, make_sampler,
                                               max(1, prompts_per_batch * n_draw), system_prompt, max_prompt_length,
                                               continuous)
    if continuous and engine is None:  # the queue a call hands the engine: more problems than slots
        prompts_per_batch *= CONTINUOUS_QUEUE
    run = _SampledProblems(episodes=make_sampler is not None)
    bar = _progress_bar(len(problems), label, enabled=progress)
    t0 = time.perf_counter()
    try:
        for start in range(0, len(problems), prompts_per_batch):
            chunk = problems[start : start + prompts_per_batch]
            index = offset + start  # the batch's first problem in the whole split
            params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                    seed=seed + index)
            run.add_batch(sampler.sample(chunk, n_draw, params, first_group_id=index), chunk, sampler, scorer,
                          ks_used, precision, on_problem)
            bar.update(len(chunk))
    finally:
        bar.close()
    elapsed = time.perf_counter() - t0
    out: dict[str, Any] = {
        "task": getattr(task, "name", "task"),
        "split": split,
        "model": label,
        "num_problems": len(problems),
        "num_problems_total": total,
        "problems": _problems_text(len(problems), total, offset),
        "row_range": [offset, offset + len(problems)],
        "num_samples": n_draw,
        "temperature": temperature,
        "decoding": "greedy" if greedy else "sampled",
        "top_p": top_p,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "ks": ks_used,
        "precision": precision,
        "continuous_batching": bool(continuous if engine is None else getattr(engine, "continuous", False)),
    }
    if ks_skipped:
        out["ks_skipped"] = ks_skipped
        out["ks_skipped_reason"] = ("temperature 0 is greedy: one sample per problem" if greedy
                                    else f"k > num_samples={num_samples}")
    out.update(run.summary(ks_used, seed, elapsed))
    return out


def _eval_sampler(model: Any, tokenizer: Any, task: Any, engine: Any, make_sampler: SamplerFactory | None,
                  max_batch_size: int, system_prompt: str | None, max_prompt_length: int,
                  continuous: bool = False) -> tuple[Any, Scorer, str]:
    """``(sampler, scorer, precision)`` of one evaluation: the group sampler (or ``make_sampler``'s episode
    sampler) on ``engine`` (default: an :class:`~rlvr.engines.hf.HFEngine` on ``model`` decoding up to
    ``max_batch_size`` sequences at once, ``continuous``: with continuous batching), the task's scorer, and the
    precision the samples are drawn at."""
    if engine is None:
        from rlvr.engines.hf import HFEngine

        engine = HFEngine(model, tokenizer, max_batch_size=max_batch_size, continuous=continuous)
    precision = _precision_of(model, engine)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encoder = PromptEncoder(tokenizer, system_prompt or task.system_prompt, max_prompt_length)
    scorer = Scorer(task, tokenizer)
    sampler = GroupSampler(engine, encoder, pad) if make_sampler is None else make_sampler(engine, encoder, scorer)
    return sampler, scorer, precision


def _check_eval_args(num_samples: int, limit: int | None, offset: int, ks: Sequence[int], temperature: float) -> None:
    """:func:`evaluate`'s argument checks.

    Raises:
        ValueError: ``num_samples < 1``, ``limit < 1``, ``offset < 0``, a ``k < 1`` or ``temperature < 0``.
    """
    if num_samples < 1:
        raise ValueError(f"eval num_samples must be ≥ 1, got {num_samples}")
    if limit is not None and limit < 1:
        raise ValueError(f"eval limit must be ≥ 1 (or None for all problems), got {limit}")
    if offset < 0:
        raise ValueError(f"eval offset must be ≥ 0, got {offset}")
    if any(int(k) < 1 for k in ks):
        raise ValueError(f"eval ks must all be ≥ 1, got {list(ks)}")
    if not temperature >= 0:
        raise ValueError(f"eval temperature must be ≥ 0 (0 = greedy), got {temperature}")


def _split_problems(task: Any, split: str, limit: int | None, offset: int) -> tuple[list[Any], int]:
    """``(problems, total)``: the ``limit`` problems of ``split`` from ``offset`` on, in the task's order, and
    the split's size (the larger of its problems and ``task.source_sizes[split]``, the size before a cap).

    Raises:
        ValueError: the split is empty, or ``offset`` is past its end.
    """
    all_problems = list(task.problems(split))
    if not all_problems:
        raise ValueError(f"task {getattr(task, 'name', task)!r} has no {split!r} problems")
    if offset >= len(all_problems):
        raise ValueError(f"eval offset {offset} is past the end of the {split!r} split ({len(all_problems)} problems)")
    problems = all_problems[offset : offset + limit] if limit else all_problems[offset:]
    return problems, max(len(all_problems), int(getattr(task, "source_sizes", {}).get(split, 0)))


@dataclass
class _SampledProblems:
    """What :func:`evaluate` keeps of the sampled batches: per-problem summaries (``per_problem``), the
    records without texts (``slim``, for :func:`rlvr.eval.summary.summarize_records`), the generated
    token count, the verifier's error counts and (``episodes``) the environments' fault counts."""

    episodes: bool
    per_problem: list[dict[str, Any]] = field(default_factory=list)
    slim: list[dict[str, Any]] = field(default_factory=list)
    generated: int = 0
    stats: ScoreStats = field(default_factory=ScoreStats)
    env_faults: dict[str, float] = field(default_factory=lambda: {"env/errors": 0.0, "env/timeouts": 0.0})

    def add_batch(self, batch: Any, chunk: Sequence[Any], sampler: Any, scorer: Scorer, ks_used: list[int],
                  precision: str, on_problem: ProblemCallback | None) -> None:
        """Score one sampled batch of the problems ``chunk`` and record each problem (``on_problem`` is
        called with each full record, in order)."""
        if self.episodes:
            for key in self.env_faults:
                self.env_faults[key] += float(batch.metrics.get(key, 0.0))
        texts = scorer.decode(batch)
        lens, clipped = batch.model_lengths.tolist(), batch.is_truncated.tolist()
        for p_i, prob in enumerate(chunk):
            rows = (batch.prompt_index == p_i).nonzero(as_tuple=True)[0].tolist()
            samples = [{**_sample(batch, r, texts[r], prob, scorer, self.stats,
                                  sampler.last_episodes[r] if self.episodes else None),
                        "length": int(lens[r]), "truncated": bool(clipped[r])} for r in rows]
            rec = {**_problem_record(prob, samples, ks_used), "precision": precision}
            self.slim.append({**rec, "question": None, "samples": [{**s, "text": None} for s in samples]})
            self.generated += sum(s["length"] for s in samples)
            self.per_problem.append({
                "uid": prob.uid, "correct": rec["correct"], "n": rec["n"], "mean_reward": rec["mean_reward"],
                "seen_in_train": rec["seen_in_train"], "sample": samples[0]["text"] if samples else "",
            })
            if on_problem is not None:
                on_problem(rec)

    def summary(self, ks_used: list[int], seed: int, elapsed: float) -> dict[str, Any]:
        """The result's metrics (:func:`rlvr.eval.summary.summarize_records`), the verifier's error count,
        the environments' fault counts (``episodes``), the timing and the per-problem summaries, in
        :func:`evaluate`'s key order (``elapsed``: wall seconds of the sampling)."""
        out = dict(summarize_records(self.slim, ks_used, seed=seed))
        out["reward/verifier_errors"] = self.stats.errors
        if self.episodes:
            out.update(self.env_faults)
        out["time_s"] = round(elapsed, 2)
        out["tokens_per_s"] = round(self.generated / elapsed, 1) if elapsed > 0 else None
        out["torch_threads"] = torch.get_num_threads()
        out["per_problem"] = self.per_problem
        return out


def _sample(batch: Any, r: int, text: str, prob: Any, scorer: Scorer, stats: ScoreStats,
            episode: dict[str, Any] | None) -> dict[str, Any]:
    """Row ``r`` of ``batch`` as a sample record (its text, answer, verdict, reward); an episode (``episode`` = the sampler's summary with
    its last ``action``) keeps the sampler's reward and verdict (see :func:`evaluate`)."""
    if episode is None:
        v = scorer.judge_one(prob, text, stats)
        return {"text": text, "extracted": None if v is None else v.extracted, "correct": bool(v is not None and v.correct),
                "reward": 0.0 if v is None else float(v.score)}
    episode = dict(episode)
    v = scorer.judge_one(prob, episode.pop("action"), stats)
    return {"text": text, "extracted": None if v is None else v.extracted, "correct": bool(batch.correct[r]),
            "reward": float(batch.rewards[r]), "episode": episode}


def _precision_of(model: Any, engine: Any) -> str:
    """The precision the samples are drawn at: the engine's policy (``HFEngine.precision``), else the
    model's (:func:`rlvr.precision.precision_label`)."""
    from rlvr.precision import PrecisionPolicy, precision_label

    policy = getattr(engine, "precision", None)
    return policy.mode if isinstance(policy, PrecisionPolicy) else precision_label(model)


def _problem_record(prob: Any, samples: list[dict[str, Any]], ks: Sequence[int]) -> dict[str, Any]:
    """One problem's JSONL record: its samples, and its pass@k / maj@k outcomes for each k."""
    n = len(samples)
    c = sum(s["correct"] for s in samples)
    keys = [answer_key(s["extracted"]) for s in samples]
    correct = [s["correct"] for s in samples]
    return {
        "uid": prob.uid,
        "question": prob.question,
        "gold": prob.answer,
        "n": n,
        "correct": c,
        "mean_reward": sum(s["reward"] for s in samples) / n,
        "seen_in_train": bool(prob.metadata.get("seen_in_train", False)),
        **({"source": prob.metadata["source"]} if "source" in prob.metadata else {}),  # a task mixture's
        "pass": {str(k): pass_at_k(n, c, k) for k in ks},
        "maj": {str(k): maj_at_k(keys, correct, k) for k in ks},
        "majority_answer": _majority_answer(samples, keys),
        "samples": samples,
    }


def _problems_text(n: int, total: int, offset: int) -> str:
    """``"all 1319"``, ``"50 of 1319"`` or, for a shard, ``"192 of 1319 (rows 200–391)"`` (1-based, inclusive)."""
    if n >= total and offset == 0:
        return f"all {total}"
    return f"{n} of {total}" + (f" (rows {offset + 1}–{offset + n})" if offset else "")


def _majority_answer(samples: list[dict[str, Any]], keys: list[Any]) -> str | None:
    """The extracted answer (as written by its first sample) that wins the vote of all samples."""
    j = majority_vote(keys)
    return None if j is None else samples[j]["extracted"]


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, label: str | None, *, enabled: bool) -> Any:
    """A tqdm bar over problems (rate and ETA) on stderr, or a no-op."""
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"eval {label}" if label else "eval", unit="problem", dynamic_ncols=True)


def write_eval(result: dict[str, Any], path: str | Path) -> Path:
    """Write an evaluation result as indented JSON (parent folders created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return path

"""Held-out evaluation: unbiased pass@k, maj@k and mean reward, with 95 % intervals, on a task split.

What is measured and how (sampling, greedy, intervals, tie rules) is written up in
``docs/evaluation.md``; the statistics live in :mod:`rlvr.eval.stats`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from rlvr.core.pass_at_k import mean_pass_at_k, pass_at_k
from rlvr.eval.stats import answer_key, maj_at_k, majority_vote, mean_with_ci
from rlvr.rewards import Scorer, ScoreStats
from rlvr.samplers.group import GroupSampler, PromptEncoder
from rlvr.types import SamplingParams

ProblemCallback = Callable[[dict[str, Any]], None]


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
    progress: bool = False,
    label: str | None = None,
    on_problem: ProblemCallback | None = None,
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
        prompts_per_batch: problems per engine call (their samples decode together).
        progress: show a tqdm bar (problems, rate, ETA) on stderr.
        label: the model's name in the bar and the result (``model``).
        on_problem: called after each problem with its record (uid, question, gold, every sample
            with text, extracted answer, verdict and reward; pass/maj outcomes) — e.g. to stream
            per-problem JSONL; the records are not kept in memory otherwise.

    Returns:
        a JSON-serialisable dict: settings (``task``, ``split``, ``model``, ``num_problems``,
        ``num_problems_total``, ``problems``, ``num_samples``, ``temperature``, ``decoding``,
        ``top_p``, ``max_new_tokens``, ``seed``, ``ks``), metrics (``pass@k``, ``maj@k``,
        ``reward/mean``, ``reward/pass_rate``, their ``ci95/`` and ``ci_method/``, ``answers/extracted_ratio``,
        ``completions/mean_length``, ``completions/clipped_ratio``, ``reward/verifier_errors``),
        ``time_s``, ``tokens_per_s`` and ``per_problem`` (uid, correct count, n, mean reward,
        seen_in_train, the first sample's text). When some eval problems also occur in the train
        split (``metadata["seen_in_train"]``), ``unseen/pass@k`` reports the others only.

    Raises:
        ValueError: ``num_samples < 1``, ``limit < 1``, a ``k < 1``, ``temperature < 0``, or the split is empty.
    """
    if num_samples < 1:
        raise ValueError(f"eval num_samples must be ≥ 1, got {num_samples}")
    if limit is not None and limit < 1:
        raise ValueError(f"eval limit must be ≥ 1 (or None for all problems), got {limit}")
    if any(int(k) < 1 for k in ks):
        raise ValueError(f"eval ks must all be ≥ 1, got {list(ks)}")
    if not temperature >= 0:
        raise ValueError(f"eval temperature must be ≥ 0 (0 = greedy), got {temperature}")
    greedy = temperature == 0
    n_draw = 1 if greedy else num_samples
    ks_used = sorted({int(k) for k in ks if int(k) <= n_draw})
    ks_skipped = sorted({int(k) for k in ks} - set(ks_used))
    all_problems = list(task.problems(split))
    if not all_problems:
        raise ValueError(f"task {getattr(task, 'name', task)!r} has no {split!r} problems")
    problems = all_problems[:limit] if limit else all_problems
    total = max(len(all_problems), int(getattr(task, "source_sizes", {}).get(split, 0)))
    if engine is None:
        from rlvr.engines.hf import HFEngine

        engine = HFEngine(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encoder = PromptEncoder(tokenizer, system_prompt or task.system_prompt, max_prompt_length)
    sampler = GroupSampler(engine, encoder, pad)
    scorer = Scorer(task, tokenizer)
    stats = ScoreStats()
    bar = _progress_bar(len(problems), label, enabled=progress)
    t0 = time.perf_counter()
    per_problem: list[dict[str, Any]] = []
    outcomes: dict[str, list[float]] = {}  # metric -> per-problem value
    lengths, truncated, rewards, voted = [], [], [], 0
    try:
        for start in range(0, len(problems), prompts_per_batch):
            chunk = problems[start : start + prompts_per_batch]
            params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                    seed=seed + start)
            batch = sampler.sample(chunk, n_draw, params, first_group_id=start)
            texts = scorer.decode(batch)
            lens, clipped = batch.completion_lengths.tolist(), batch.is_truncated.tolist()
            for p_i, prob in enumerate(chunk):
                rows = (batch.prompt_index == p_i).nonzero(as_tuple=True)[0].tolist()
                samples = []
                for r in rows:
                    v = scorer.judge_one(prob, texts[r], stats)
                    samples.append({
                        "text": texts[r],
                        "extracted": None if v is None else v.extracted,
                        "correct": bool(v is not None and v.correct),
                        "reward": 0.0 if v is None else float(v.score),
                        "length": int(lens[r]),
                        "truncated": bool(clipped[r]),
                    })
                rec = _problem_record(prob, samples, ks_used)
                voted += sum(s["extracted"] is not None for s in samples)
                for k in ks_used:
                    outcomes.setdefault(f"pass@{k}", []).append(rec["pass"][str(k)])
                    outcomes.setdefault(f"maj@{k}", []).append(rec["maj"][str(k)])
                outcomes.setdefault("reward/mean", []).append(rec["mean_reward"])
                lengths += [s["length"] for s in samples]
                truncated += [s["truncated"] for s in samples]
                rewards += [s["reward"] for s in samples]
                per_problem.append({
                    "uid": prob.uid, "correct": rec["correct"], "n": rec["n"], "mean_reward": rec["mean_reward"],
                    "seen_in_train": rec["seen_in_train"], "sample": samples[0]["text"] if samples else "",
                })
                if on_problem is not None:
                    on_problem(rec)
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
        "problems": f"{len(problems)} of {total}" if len(problems) < total else f"all {total}",
        "num_samples": n_draw,
        "temperature": temperature,
        "decoding": "greedy" if greedy else "sampled",
        "top_p": top_p,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "ks": ks_used,
    }
    if ks_skipped:
        out["ks_skipped"] = ks_skipped
        out["ks_skipped_reason"] = ("temperature 0 is greedy: one sample per problem" if greedy
                                    else f"k > num_samples={num_samples}")
    has_answers = voted > 0
    for metric, values in outcomes.items():
        if metric.startswith("maj@") and not has_answers:
            continue  # the verifier extracts no answers: nothing to vote on
        ci = mean_with_ci(values, seed=seed)
        out[metric] = ci["mean"]
        out[f"ci95/{metric}"] = ci["ci95"]
        out[f"ci_method/{metric}"] = ci["ci_method"]
    if not has_answers:
        out["maj_skipped_reason"] = "the verifier extracted no answers (Verdict.extracted is always None)"
    unseen = [p for p in per_problem if not p["seen_in_train"]]
    if len(unseen) < len(per_problem):
        out["unseen/num_problems"] = len(unseen)
        for k in ks_used:
            if unseen:
                out[f"unseen/pass@{k}"] = mean_pass_at_k([p["n"] for p in unseen], [p["correct"] for p in unseen], k)
    out["reward/pass_rate"] = sum(p["correct"] for p in per_problem) / sum(p["n"] for p in per_problem)
    out["answers/extracted_ratio"] = voted / len(lengths)
    out["completions/mean_length"] = sum(lengths) / len(lengths)
    out["completions/clipped_ratio"] = sum(truncated) / len(truncated)
    out["reward/verifier_errors"] = stats.errors
    out["time_s"] = round(elapsed, 2)
    out["tokens_per_s"] = round(sum(lengths) / elapsed, 1) if elapsed > 0 else None
    out["per_problem"] = per_problem
    return out


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
        "pass": {str(k): pass_at_k(n, c, k) for k in ks},
        "maj": {str(k): maj_at_k(keys, correct, k) for k in ks},
        "majority_answer": _majority_answer(samples, keys),
        "samples": samples,
    }


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

"""Held-out evaluation: unbiased pass@k and mean reward on a task split."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

from rlvr.core.pass_at_k import mean_pass_at_k
from rlvr.rewards import Scorer
from rlvr.samplers.group import GroupSampler, PromptEncoder
from rlvr.types import SamplingParams


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
) -> dict[str, Any]:
    """Sample ``num_samples`` completions per problem of ``split`` and report pass@k and rewards.

    pass@k is the unbiased estimator of Chen et al. (2021, §2.1) averaged over problems; ``ks``
    larger than ``num_samples`` are skipped. A completion passes when its verdict is ``correct``.

    Returns:
        a JSON-serialisable dict: ``pass@k`` for each k, ``reward/mean``, ``reward/pass_rate``,
        ``num_problems``, ``num_samples``, ``completions/mean_length``, ``completions/clipped_ratio``,
        ``time_s`` and ``per_problem`` (uid, correct count, mean reward, seen_in_train). When some
        eval problems also occur in the train split (``metadata["seen_in_train"]``, small problem
        spaces), ``unseen/pass@k`` reports the estimator on the others only.

    Raises:
        ValueError: ``num_samples < 1`` or the split is empty.
    """
    if num_samples < 1:
        raise ValueError(f"eval num_samples must be ≥ 1, got {num_samples}")
    problems = list(task.problems(split))[: limit or None]
    if not problems:
        raise ValueError(f"task {getattr(task, 'name', task)!r} has no {split!r} problems")
    if engine is None:
        from rlvr.engines.hf import HFEngine

        engine = HFEngine(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encoder = PromptEncoder(tokenizer, system_prompt or task.system_prompt, max_prompt_length)
    sampler = GroupSampler(engine, encoder, pad)
    scorer = Scorer(task, tokenizer)
    t0 = time.perf_counter()
    per_problem, lengths, truncated, rewards, errors = [], [], [], [], 0
    for start in range(0, len(problems), prompts_per_batch):
        chunk = problems[start : start + prompts_per_batch]
        params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed + start)
        batch = sampler.sample(chunk, num_samples, params, first_group_id=start)
        stats = scorer.score(batch)
        errors += stats.errors
        lengths += batch.completion_lengths.tolist()
        truncated += batch.is_truncated.tolist()
        rewards += batch.rewards.tolist()
        for p_i, prob in enumerate(chunk):
            rows = (batch.prompt_index == p_i).nonzero(as_tuple=True)[0]
            per_problem.append({
                "uid": prob.uid,
                "correct": int(batch.correct[rows].sum()),
                "n": len(rows),
                "mean_reward": float(batch.rewards[rows].mean()),
                "seen_in_train": bool(prob.metadata.get("seen_in_train", False)),
                "sample": batch.texts[int(rows[0])] if len(rows) else "",
            })
    ns = [p["n"] for p in per_problem]
    cs = [p["correct"] for p in per_problem]
    out: dict[str, Any] = {
        "task": getattr(task, "name", "task"),
        "split": split,
        "num_problems": len(problems),
        "num_samples": num_samples,
        "temperature": temperature,
    }
    for k in ks:
        if k <= num_samples:
            out[f"pass@{k}"] = mean_pass_at_k(ns, cs, k)
    unseen = [p for p in per_problem if not p["seen_in_train"]]
    if len(unseen) < len(per_problem):
        out["unseen/num_problems"] = len(unseen)
        for k in ks:
            if k <= num_samples and unseen:
                out[f"unseen/pass@{k}"] = mean_pass_at_k([p["n"] for p in unseen], [p["correct"] for p in unseen], k)
    out["reward/mean"] = sum(rewards) / len(rewards)
    out["reward/pass_rate"] = sum(cs) / sum(ns)
    out["completions/mean_length"] = sum(lengths) / len(lengths)
    out["completions/clipped_ratio"] = sum(truncated) / len(truncated)
    out["reward/verifier_errors"] = errors
    out["time_s"] = round(time.perf_counter() - t0, 2)
    out["per_problem"] = per_problem
    return out


def write_eval(result: dict[str, Any], path: str | Path) -> Path:
    """Write an evaluation result as indented JSON (parent folders created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return path

"""From per-problem records to the metrics of an evaluation: one code path for a run and for merged shards.

:func:`rlvr.eval.evaluate.evaluate` feeds it the records it builds as problems finish;
:func:`rlvr.eval.merge.merge_samples` feeds it the records read back from per-sample JSONL files
(``X.samples.jsonl``), so a split evaluated in several pieces gets exactly the numbers — and the
intervals — of one run over all its problems.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from rlvr.core.pass_at_k import mean_pass_at_k
from rlvr.eval.stats import mean_with_ci

__all__ = ["summarize_records"]

MAJ_SKIPPED = "the verifier extracted no answers (Verdict.extracted is always None)"


def summarize_records(records: Iterable[dict[str, Any]], ks: Sequence[int], *, seed: int = 0) -> dict[str, Any]:
    """Aggregate per-problem records into pass@k, maj@k, mean reward (with 95 % intervals) and length stats.

    Each record is a problem's line of the per-sample JSONL: ``n``, ``correct``, ``mean_reward``,
    ``seen_in_train``, ``pass`` / ``maj`` (``{str(k): outcome}``, the problem's unbiased pass@k and
    its maj@k), and ``samples`` (each with ``extracted``, ``reward``, ``length``, ``truncated`` and, for
    environment episodes, ``episode``).

    The value of a metric is the mean of its per-problem outcomes; its interval is
    :func:`rlvr.eval.stats.mean_with_ci` over the problems (Wilson when all outcomes are 0/1, else
    a percentile bootstrap seeded with ``seed``). maj@k is left out when no sample of any problem
    has an extracted answer (``maj_skipped_reason``).

    Returns:
        ``pass@k``, ``maj@k``, ``reward/mean`` and their ``ci95/`` (``[low, high]``) and
        ``ci_method/``; ``reward/pass_rate`` (correct samples / samples), ``answers/extracted_ratio``,
        ``completions/mean_length`` (tokens), ``completions/clipped_ratio``; ``unseen/num_problems`` and
        ``unseen/pass@k`` when some problems were seen in training; the ``env/*`` episode metrics
        (:func:`rlvr.samplers.multiturn.episode_metrics`) when the samples carry an ``episode``; for the
        problems of a task mixture (records with a ``source``), the same metrics of each source under
        ``source/<label>/`` (``source/<label>/pass@1``, ``source/<label>/reward/mean``, ...) and
        ``source/<label>/num_problems``.

    Raises:
        ValueError: no records, a record without a sample, or one that lacks an outcome for some k
            (the message names the record's ``uid``).
    """
    records = list(records)
    out = _summarize(records, ks, seed)
    by_source: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        if rec.get("source") is not None:
            by_source.setdefault(str(rec["source"]), []).append(rec)
    for label, recs in sorted(by_source.items()):
        sub = _summarize([{k: v for k, v in r.items() if k != "source"} for r in recs], ks, seed)
        out[f"source/{label}/num_problems"] = len(recs)
        out.update({f"source/{label}/{k}": v for k, v in sub.items()})
    return out


def _summarize(records: Sequence[dict[str, Any]], ks: Sequence[int], seed: int) -> dict[str, Any]:
    """:func:`summarize_records` of ``records`` as one set (no per-source split)."""
    outcomes: dict[str, list[float]] = {}
    n_samples = n_correct = voted = clipped = length = 0
    unseen_n: list[int] = []
    unseen_c: list[int] = []
    episodes: list[dict[str, Any]] = []
    count = 0
    for rec in records:
        count += 1
        samples = rec.get("samples") or []
        if not samples:
            raise ValueError(f"problem {rec.get('uid')!r}: no samples")
        for k in ks:
            key = str(int(k))
            if key not in rec.get("pass", {}) or key not in rec.get("maj", {}):
                raise ValueError(f"problem {rec.get('uid')!r}: no pass/maj outcome for k={k} "
                                 f"(it has k = {sorted(rec.get('pass', {}))})")
            outcomes.setdefault(f"pass@{k}", []).append(float(rec["pass"][key]))
            outcomes.setdefault(f"maj@{k}", []).append(float(rec["maj"][key]))
        outcomes.setdefault("reward/mean", []).append(float(rec["mean_reward"]))
        n_samples += len(samples)
        n_correct += int(rec["correct"])
        voted += sum(s.get("extracted") is not None for s in samples)
        clipped += sum(bool(s.get("truncated")) for s in samples)
        length += sum(int(s.get("length", 0)) for s in samples)
        episodes += [s["episode"] for s in samples if s.get("episode") is not None]
        if not rec.get("seen_in_train", False):
            unseen_n.append(int(rec["n"]))
            unseen_c.append(int(rec["correct"]))
    if count == 0:
        raise ValueError("no problem records to summarize")
    out: dict[str, Any] = {}
    for metric, values in outcomes.items():
        if metric.startswith("maj@") and voted == 0:
            continue  # the verifier extracts no answers: nothing to vote on
        ci = mean_with_ci(values, seed=seed)
        out[metric] = ci["mean"]
        out[f"ci95/{metric}"] = ci["ci95"]
        out[f"ci_method/{metric}"] = ci["ci_method"]
    if voted == 0:
        out["maj_skipped_reason"] = MAJ_SKIPPED
    if len(unseen_n) < count:
        out["unseen/num_problems"] = len(unseen_n)
        for k in ks:
            if unseen_n:
                out[f"unseen/pass@{k}"] = mean_pass_at_k(unseen_n, unseen_c, int(k))
    out["reward/pass_rate"] = n_correct / n_samples
    out["answers/extracted_ratio"] = voted / n_samples
    out["completions/mean_length"] = length / n_samples
    out["completions/clipped_ratio"] = clipped / n_samples
    if episodes:  # environment episodes (env.type set): the training run's env/* metrics over all samples
        from rlvr.samplers.multiturn import episode_metrics

        out.update(episode_metrics(episodes))
    return out


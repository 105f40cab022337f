"""The comparison's held-out evaluation: the same problems, samples and seed for every run
(:func:`_held_out_eval`) and the ``eval/*`` keys a run records from it, per testbed level too
(:func:`_eval_keys`).

Separate from :mod:`rlvr.compare.harness` because it changes with the evaluation (samples, ks,
per-level pass@k), not with run scheduling; the harness calls it after each run, at the mid-run curve
points and for the untrained baseline.
"""

from __future__ import annotations

from typing import Any

from rlvr.compare.spec import CompareSpec

def _held_out_eval(spec: CompareSpec, cfg: Any, model: Any, tok: Any, task: Any) -> dict[str, Any]:
    """The comparison's held-out evaluation (same problems, samples and seed for every run)."""
    from rlvr.eval.evaluate import evaluate

    return evaluate(
        model, tok, task, num_samples=spec.eval_num_samples, ks=spec.eval_ks, temperature=cfg.eval.temperature,
        top_p=cfg.top_p, max_new_tokens=cfg.max_completion_length, max_prompt_length=cfg.max_prompt_length,
        system_prompt=cfg.task.system_prompt, prompts_per_batch=max(1, 64 // spec.eval_num_samples), seed=10_007,
        limit=spec.eval_limit,
    )


def _eval_keys(ev: dict[str, Any], task: Any) -> dict[str, float]:
    """The ``eval/*`` keys a run records from one evaluation: ``eval/pass@k``, ``eval/reward/mean`` and,
    when the eval problems carry ``metadata["level"]`` (the testbed), ``eval/level<L>/pass@k`` per level
    (unbiased pass@k over that level's problems, from ``per_problem`` correct counts)."""
    from rlvr.core.pass_at_k import pass_at_k

    out = {f"eval/{k}": v for k, v in ev.items() if k.startswith("pass@") or k in ("reward/mean",)}
    ks = sorted(int(k.split("@")[1]) for k in ev if k.startswith("pass@") and k.split("@")[1].isdigit())
    try:
        level_of = {p.uid: p.metadata.get("level") for p in task.problems("eval")}
    except Exception:  # noqa: BLE001 - a task without an eval split or metadata: no per-level keys
        return out
    per: dict[Any, list[tuple[int, int]]] = {}
    for rec in ev.get("per_problem") or []:
        lv = level_of.get(rec.get("uid"))
        if lv is not None and "correct" in rec and "n" in rec:
            per.setdefault(lv, []).append((int(rec["n"]), int(rec["correct"])))
    for lv, rows in sorted(per.items()):
        for k in ks:
            ok = [pass_at_k(n, c, k) for n, c in rows if k <= n]
            if ok:
                out[f"eval/level{lv}/pass@{k}"] = sum(ok) / len(ok)
    return out

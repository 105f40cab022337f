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

EVAL_ENV_KEYS = ("env/tool_rate", "env/tool_calls", "env/tool_errors", "env/turns_mean", "env/model_tokens")
"""Episode metrics of an environment run's evaluation kept as ``eval/<key>``: ``env/tool_rate`` (the share of
episodes with at least one tool call, mean over problems of each problem's share) and the per-episode means of
:func:`rlvr.samplers.multiturn.episode_metrics`."""


def _held_out_eval(spec: CompareSpec, cfg: Any, model: Any, tok: Any, task: Any) -> dict[str, Any]:
    """The comparison's held-out evaluation (same problems, samples and seed for every run). With ``env.type``
    set, each sample is an episode of the run's environment, as in training and ``rlvr eval``, and the result
    also has ``env/tool_rate`` with its 95 % interval over problems (``ci95/env/tool_rate``,
    :func:`rlvr.eval.stats.mean_with_ci`)."""
    from rlvr.eval.evaluate import evaluate
    from rlvr.eval.stats import mean_with_ci
    from rlvr.samplers.multiturn import episode_sampler_factory

    episodes = episode_sampler_factory(cfg, tok)
    tool_share: list[float] = []  # per problem: the share of its episodes that called a tool

    def on_problem(rec: dict[str, Any]) -> None:
        eps = [s.get("episode") or {} for s in rec.get("samples", [])]
        if eps:
            tool_share.append(sum(int(e.get("tool_calls", 0) or 0) > 0 for e in eps) / len(eps))

    ev = evaluate(
        model, tok, task, num_samples=spec.eval_num_samples, ks=spec.eval_ks, temperature=cfg.eval.temperature,
        top_p=cfg.top_p, max_new_tokens=cfg.max_completion_length, max_prompt_length=cfg.max_prompt_length,
        system_prompt=cfg.task.system_prompt, prompts_per_batch=max(1, 64 // spec.eval_num_samples), seed=10_007,
        limit=spec.eval_limit, make_sampler=episodes, on_problem=on_problem if episodes is not None else None,
    )
    if episodes is not None and tool_share:
        ci = mean_with_ci(tool_share)
        ev["env/tool_rate"], ev["ci95/env/tool_rate"] = ci["mean"], ci["ci95"]
    return ev


def _eval_keys(ev: dict[str, Any], task: Any) -> dict[str, float]:
    """The ``eval/*`` keys a run records from one evaluation: ``eval/pass@k``, ``eval/reward/mean`` and,
    when the eval problems carry ``metadata["level"]`` (the testbed), ``eval/level<L>/pass@k`` per level
    (unbiased pass@k over that level's problems, from ``per_problem`` correct counts); an environment run's
    evaluation also gives ``eval/env/tool_rate`` etc. (:data:`EVAL_ENV_KEYS`); every 95 % interval of the
    evaluation is kept as ``eval/ci95/<metric>`` (``[low, high]`` over problems)."""
    from rlvr.core.pass_at_k import pass_at_k

    out = {f"eval/{k}": v for k, v in ev.items() if k.startswith("pass@") or k in ("reward/mean",)}
    out.update({f"eval/{k}": v for k, v in ev.items() if k in EVAL_ENV_KEYS or k.startswith("ci95/")})
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

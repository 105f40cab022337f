"""Tables and plots of the regression diagnosis (issue 17 §1) from finished ``rlvr compare`` folders.

Reads ``OUT/<arm>/seed<k>/{result.json, metrics.jsonl, curve.jsonl}`` of the diagnosis comparisons
(``docs/results/replication/diag_*.yaml``) and writes

* markdown tables to stdout: per arm (held-out pass@1, steps, train reward, pre-clip grad norm and the
  fraction of steps it exceeded ``max_grad_norm`` = 1, entropy, zero-std groups); μ-GRPO per update
  index within a stage (ratio mean/min/max, clipped-token fraction, KL to the behaviour policy, veto
  rates); IB-TPO's ``ib/*`` advantage statistics; FBOS-RL's ``fbos/*`` pass rates of initial and
  feedback-augmented (FAP) rollouts and its per-phase grad norms and entropies; the training reward
  at equal steps and at equal rollouts;
* ``--json``: every number of those tables;
* ``--plot``: one figure (μ-GRPO ratio / veto / grad norm per update index; grad norm per step of
  each variant; training reward against steps and rollouts).

Cheap (reads JSON only)::

    PYTHONPATH=src python benchmarks/diag_regressions.py runs/compare/diag_mu_ib runs/compare/diag_fbos \\
        --json docs/results/replication/diag_summary.json --plot docs/results/replication/diag.png
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any


def load_runs(folders: list[str]) -> dict[str, list[dict[str, Any]]]:
    """``{arm: [run, ...]}``; a run is ``{"result", "metrics" (list of step dicts), "curve", "seed"}``.
    Arms are keyed ``<folder name>/<arm>``; unfinished runs (no ``result.json``) are skipped."""
    out: dict[str, list[dict[str, Any]]] = {}
    for f in folders:
        root = Path(f)
        for res in sorted(root.glob("*/seed*/result.json")):
            d = res.parent
            arm = d.parent.name
            if arm == "initial":
                continue
            rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()] \
                if (d / "metrics.jsonl").exists() else []
            curve = [json.loads(x) for x in (d / "curve.jsonl").read_text().splitlines() if x.strip()] \
                if (d / "curve.jsonl").exists() else []
            out.setdefault(f"{root.name}/{arm}", []).append(
                {"result": json.loads(res.read_text()), "metrics": rows, "curve": curve, "seed": d.name})
    return out


def _f(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(float(x)) else math.nan


def mean_sd(xs: list[float]) -> tuple[float, float]:
    xs = [x for x in xs if x == x]
    if not xs:
        return math.nan, math.nan
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def col(rows: list[dict[str, Any]], key: str) -> list[float]:
    """Finite values of ``key`` over the logged steps (phase-prefixed FBOS keys: pass ``epa/...``)."""
    return [_f(r[key]) for r in rows if key in r and _f(r[key]) == _f(r[key])]


def primary_key(rows: list[dict[str, Any]], key: str) -> str:
    """``key`` itself, or FBOS-RL's EPA-phase ``epa/<key>`` when only phased values were logged (the
    update on the task's own prompt; the ECC phase is on the FAP context — reported separately)."""
    if any(key in r for r in rows):
        return key
    return f"epa/{key}" if any(f"epa/{key}" in r for r in rows) else key


def grad_keys(rows: list[dict[str, Any]]) -> list[str]:
    return [primary_key(rows, "actor/grad_norm")]


def arm_table(runs: dict[str, list[dict[str, Any]]], baseline: float) -> list[dict[str, Any]]:
    table = []
    for arm, rs in runs.items():
        g_all, ent_all, clipped = [], [], []
        for r in rs:
            gs = [g for k in grad_keys(r["metrics"]) for g in col(r["metrics"], k)]
            gs = [g for g in gs if g > 0]  # a zero gradient = a step with no signal (all groups zero-variance)
            g_all.append(statistics.fmean(gs) if gs else math.nan)  # FBOS-RL: EPA steps only
            clipped.append(sum(g > 1.0 for g in gs) / len(gs) if gs else math.nan)
            k_ent = primary_key(r["metrics"], "actor/entropy")
            ents = col([m for m in r["metrics"] if k_ent in m][-8:], k_ent)
            ent_all.append(statistics.fmean(ents) if ents else math.nan)
        res = [r["result"] for r in rs]
        p1 = [_f(x.get("eval/pass@1")) for x in res]
        row = {
            "arm": arm, "seeds": len(rs), "pass@1": mean_sd(p1), "pass@1/per_seed": p1,
            "delta_vs_pretrained": mean_sd(p1)[0] - baseline,
            "pass@8": mean_sd([_f(x.get("eval/pass@8")) for x in res]),
            "steps": mean_sd([_f(x.get("steps")) for x in res]), "rollouts": mean_sd([_f(x.get("rollouts")) for x in res]),
            "reward_final": mean_sd([_f(x.get("reward/final")) for x in res]),
            "reward_best": mean_sd([_f(x.get("reward/best")) for x in res]),
            "grad_norm_preclip": mean_sd(g_all), "frac_steps_clipped": mean_sd(clipped),
            "entropy_last8": mean_sd(ent_all), "zero_std_groups": mean_sd([_f(x.get("zero_std_groups/mean")) for x in res]),
        }
        table.append(row)
    return table


MU_KEYS = ("actor/ratio", "actor/ratio/min", "actor/ratio/max", "actor/clip_ratio/region", "actor/approx_kl_old",
           "mu_grpo/veto_token_frac", "mu_grpo/veto_response_rate", "mu_grpo/trigger_pos_frac",
           "mu_grpo/ratio_neg_mean", "mu_grpo/ratio_pos_mean", "actor/grad_norm", "actor/entropy")


def mu_by_update(rs: list[dict[str, Any]], mu: int = 16) -> dict[str, list[float]]:
    """Per update index ``j`` within a stage (``(step − 1) mod μ``), each key's mean over stages and
    seeds (``ratio/min``: the minimum, ``ratio/max``: the maximum)."""
    out: dict[str, list[float]] = {}
    for k in MU_KEYS:
        vals: list[list[float]] = [[] for _ in range(mu)]
        for r in rs:
            for m in r["metrics"]:
                if k in m and _f(m[k]) == _f(m[k]):
                    vals[(int(m["step"]) - 1) % mu].append(_f(m[k]))
        red = min if k.endswith("/min") else max if k.endswith("/max") else statistics.fmean
        out[k] = [red(v) if v else math.nan for v in vals]
    return out


def veto_totals(rs: list[dict[str, Any]]) -> dict[str, float]:
    tok = [v for r in rs for v in col(r["metrics"], "mu_grpo/veto_token_frac")]
    resp = [v for r in rs for v in col(r["metrics"], "mu_grpo/veto_response_rate")]
    rmin = [v for r in rs for v in col(r["metrics"], "actor/ratio/min")]
    rmax = [v for r in rs for v in col(r["metrics"], "actor/ratio/max")]
    return {"updates": len(tok), "updates_with_veto": sum(v > 0 for v in tok),
            "veto_token_frac_mean": statistics.fmean(tok) if tok else math.nan,
            "veto_token_frac_max": max(tok) if tok else math.nan,
            "veto_response_rate_max": max(resp) if resp else math.nan,
            "ratio_min": min(rmin) if rmin else math.nan, "ratio_max": max(rmax) if rmax else math.nan,
            "updates_ratio_max_gt_5": sum(v > 5 for v in rmax), "updates_ratio_min_lt_1e-4": sum(v < 1e-4 for v in rmin)}


def prefix_stats(rs: list[dict[str, Any]], prefix: str) -> dict[str, tuple[float, float]]:
    """Mean ± std over seeds of each run's mean of every ``prefix*`` key."""
    keys = sorted({k for r in rs for m in r["metrics"] for k in m if k.startswith(prefix)})
    out = {}
    for k in keys:
        per = [statistics.fmean(c) for r in rs if (c := col(r["metrics"], k))]
        out[k] = mean_sd(per)
    return out


def reward_at(rs: list[dict[str, Any]], *, step: int | None = None, rollouts: int | None = None, w: int = 3) -> tuple[float, float]:
    """Training reward at an equal step / rollout count: the ``w``-point mean of ``reward/mean`` ending at
    the last curve point with ``step <= step`` (or ``rollouts <= rollouts``), mean ± std over seeds;
    NaN where a run has no point that early. Rewards are logged once per generation round, so for
    μ-GRPO (one round per 16-update stage) the point is the last stage start at or before ``step``."""
    per = []
    for r in rs:
        c = [p for p in r["curve"] if "reward/mean" in p]
        ok = [i for i, p in enumerate(c) if (step is not None and p["step"] <= step)
              or (rollouts is not None and p["rollouts"] <= rollouts)]
        if not ok:
            continue
        idx = ok[-1]
        lo = max(0, idx - w + 1)
        per.append(statistics.fmean(p["reward/mean"] for p in c[lo: idx + 1]))
    return mean_sd(per)


def fmt(ms: tuple[float, float] | float, nd: int = 3) -> str:
    if isinstance(ms, tuple):
        m, s = ms
        return "–" if m != m else f"{m:.{nd}f} ± {s:.{nd}f}"
    return "–" if ms != ms else f"{ms:.{nd}f}"


def plot(runs: dict[str, list[dict[str, Any]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 3, figsize=(15, 8))
    mus = [a for a in runs if a.endswith("/mu_grpo") or a.endswith("/mu_lr3e-5") or a.endswith("/mu_lr1e-5")
           or a.endswith("/mu_clip02")]
    for a in mus:
        d = mu_by_update(runs[a])
        x = list(range(1, 17))
        ax[0, 0].semilogy(x, d["actor/ratio/max"], "-o", ms=3, label=a.split("/")[-1] + " max")
        ax[0, 0].semilogy(x, d["actor/ratio/min"], "--", label=a.split("/")[-1] + " min")
        ax[0, 1].plot(x, d["actor/clip_ratio/region"], "-o", ms=3, label=a.split("/")[-1] + " clipped tokens")
        ax[0, 1].plot(x, d["mu_grpo/veto_token_frac"], ":", label=a.split("/")[-1] + " vetoed tokens")
        ax[0, 2].plot(x, d["actor/approx_kl_old"], "-o", ms=3, label=a.split("/")[-1])
    ax[0, 0].axhline(5.0, color="k", lw=0.5)
    ax[0, 0].axhline(1e-4, color="k", lw=0.5)
    ax[0, 0].set(title="μ-GRPO token ratio extremes per update index in a stage", xlabel="update index within stage (1–16)")
    ax[0, 1].set(title="clipped / vetoed token fraction", xlabel="update index within stage")
    ax[0, 2].set(title="KL(behaviour ‖ current), nats/token", xlabel="update index within stage")
    show = ("grpo", "mu_grpo", "mu_lr3e-5", "ib_tpo", "ib_lr3e-5", "fbos_rl", "fbos_lr1e-4")
    for a in runs:
        name = a.split("/")[-1]
        if name not in show:
            continue
        # grad norm: per step, the median over seeds of the non-zero pre-clip norms (FBOS: the EPA view;
        # its ECC steps have gradient 0 with the default FAP), 5-point moving average
        per_step: dict[int, list[float]] = {}
        for r in runs[a]:
            for m in r["metrics"]:
                v = _f(m.get("actor/grad_norm", m.get("epa/actor/grad_norm")))
                if v == v and v > 0:
                    per_step.setdefault(int(m["step"]), []).append(v)
        xs = sorted(per_step)
        ys = [statistics.median(per_step[x]) for x in xs]
        sm = [statistics.fmean(ys[max(0, i - 4): i + 1]) for i in range(len(ys))]
        ax[1, 0].semilogy(xs, sm, lw=1, label=name)
        for xk, axj in (("step", ax[1, 1]), ("rollouts", ax[1, 2])):
            per = [[p["reward/mean"] for p in rr["curve"] if "reward/mean" in p] for rr in runs[a]]
            xs2 = [[p[xk] for p in rr["curve"] if "reward/mean" in p] for rr in runs[a]]
            n = min(len(p) for p in per)
            if n:
                mean = [statistics.fmean(p[i] for p in per) for i in range(n)]
                sm2 = [statistics.fmean(mean[max(0, i - 4): i + 1]) for i in range(n)]
                axj.plot(xs2[0][:n], sm2, label=name)
    ax[1, 0].axhline(1.0, color="k", lw=0.5)
    ax[1, 0].set(title="pre-clip grad norm (seed median, 5-pt MA)", xlabel="optimizer step")
    ax[1, 1].set(title="train reward (seed mean, 5-pt MA; FBOS incl. FAP rows)", xlabel="optimizer step")
    ax[1, 2].set(title="training reward vs rollouts", xlabel="rollouts")
    for a_ in ax.flat:
        a_.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--baseline", type=float, default=0.436, help="pre-trained held-out pass@1 (testbed_compare.md)")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    args = ap.parse_args(argv)
    runs = load_runs(args.folders)
    out: dict[str, Any] = {"arms": arm_table(runs, args.baseline)}
    print("| arm | seeds | held-out pass@1 | per seed | Δ vs pre-trained | steps | final / best train reward | "
          "pre-clip grad norm | steps clipped | entropy (last 8) | zero-std groups |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in out["arms"]:
        print(f"| {r['arm']} | {r['seeds']} | {fmt(r['pass@1'])} | {', '.join(f'{x:.3f}' for x in r['pass@1/per_seed'])} | "
              f"{r['delta_vs_pretrained']:+.3f} | {fmt(r['steps'], 0)} | {fmt(r['reward_final'][0])} / {fmt(r['reward_best'][0])} | "
              f"{fmt(r['grad_norm_preclip'], 2)} | {fmt(r['frac_steps_clipped'], 2)} | {fmt(r['entropy_last8'])} | "
              f"{fmt(r['zero_std_groups'], 2)} |")
    mu_arms = [a for a in runs if a.split("/")[-1].startswith("mu_")]
    out["mu"] = {}
    for a in mu_arms:
        out["mu"][a] = {"by_update": mu_by_update(runs[a]), "veto": veto_totals(runs[a])}
    if mu_arms:
        print("\nμ-GRPO veto and ratio extremes over all updates and seeds:\n")
        print("| arm | updates | updates with any veto | vetoed-token frac (mean / max) | ratio min | ratio max | "
              "updates with ratio max > 5 | updates with ratio min < 1e-4 |")
        print("|---|---|---|---|---|---|---|---|")
        for a in mu_arms:
            v = out["mu"][a]["veto"]
            print(f"| {a} | {v['updates']} | {v['updates_with_veto']} | {fmt(v['veto_token_frac_mean'], 4)} / "
                  f"{fmt(v['veto_token_frac_max'], 4)} | {v['ratio_min']:.2e} | {v['ratio_max']:.2f} | "
                  f"{v['updates_ratio_max_gt_5']} | {v['updates_ratio_min_lt_1e-4']} |")
        for a in mu_arms:
            d = out["mu"][a]["by_update"]
            if not any(x == x for x in d["actor/ratio"]):
                continue
            print(f"\n{a}: per update index within a stage (mean over stages × seeds; min/max: extreme)\n")
            print("| j | ratio mean | ratio min | ratio max | clipped tokens | KL old | vetoed tokens | grad norm | entropy |")
            print("|---|---|---|---|---|---|---|---|---|")
            for j in range(16):
                if d["actor/ratio"][j] != d["actor/ratio"][j]:
                    continue
                print(f"| {j + 1} | {d['actor/ratio'][j]:.3f} | {d['actor/ratio/min'][j]:.2e} | {d['actor/ratio/max'][j]:.2f} | "
                      f"{d['actor/clip_ratio/region'][j]:.3f} | {d['actor/approx_kl_old'][j]:.4f} | "
                      f"{d['mu_grpo/veto_token_frac'][j]:.4f} | {d['actor/grad_norm'][j]:.2f} | {d['actor/entropy'][j]:.3f} |")
    for pre, name in (("ib/", "ib"), ("fbos/", "fbos"), ("advantages/", "adv")):
        arms = [a for a in runs if prefix_stats(runs[a], pre)]
        if not arms or (name == "adv" and False):
            continue
        out[name] = {a: prefix_stats(runs[a], pre) for a in arms}
        if name == "adv":
            continue
        keys = sorted({k for a in arms for k in out[name][a]})
        print(f"\n{pre}* per-run means (mean ± std over seeds)\n")
        print("| key | " + " | ".join(a.split("/")[-1] for a in arms) + " |")
        print("|---|" + "---|" * len(arms))
        for k in keys:
            print(f"| {k} | " + " | ".join(fmt(out[name][a].get(k, (math.nan, math.nan))) for a in arms) + " |")
    fb = [a for a in runs if "fbos" in a]
    if fb:
        print("\nFBOS-RL per phase (mean over steps, mean ± std over seeds)\n")
        print("| arm | EPA grad norm | ECC grad norm | EPA entropy | ECC entropy | EPA |adv| | ECC |adv| |")
        print("|---|---|---|---|---|---|---|")
        for a in fb:
            st = prefix_stats(runs[a], "epa/") | prefix_stats(runs[a], "ecc/")
            print(f"| {a} | {fmt(st.get('epa/actor/grad_norm', (math.nan, math.nan)), 2)} | "
                  f"{fmt(st.get('ecc/actor/grad_norm', (math.nan, math.nan)), 2)} | {fmt(st.get('epa/actor/entropy', (math.nan, math.nan)))} | "
                  f"{fmt(st.get('ecc/actor/entropy', (math.nan, math.nan)))} | {fmt(st.get('epa/advantages/abs_mean', (math.nan, math.nan)))} | "
                  f"{fmt(st.get('ecc/advantages/abs_mean', (math.nan, math.nan)))} |")
    print("\nTraining reward at equal optimizer steps and at equal rollouts (3-point mean, mean ± std over seeds)\n")
    print("| arm | step 16 | step 32 | step 64 | 256 rollouts | 512 rollouts | 1000 rollouts |")
    print("|---|---|---|---|---|---|---|")
    out["equal"] = {}
    for a, rs in runs.items():
        e = {f"step{s}": reward_at(rs, step=s) for s in (16, 32, 64)}
        e.update({f"rollouts{n}": reward_at(rs, rollouts=n) for n in (256, 512, 1000)})
        out["equal"][a] = e
        print(f"| {a} | " + " | ".join(fmt(e[k]) for k in e) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=float))
    if args.plot:
        plot(runs, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

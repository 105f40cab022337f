"""Plot ``benchmarks/fbos_vs_grpo.py``'s summary: x-context pass rate, rescued / zero-variance prompts,
entropy and gradient norm per training step, GRPO vs FBOS-RL arms.

    python benchmarks/plot_fbos_cmp.py runs/fbos_cmp/summary.json docs/fbos_rl_curves.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def per_training_step(rows: list[dict]) -> list[dict]:
    """Merge the optimizer updates of one generation round into one dict per training step."""
    steps: dict[int, dict] = {}
    for r in rows:
        steps.setdefault(int(r["round"]), {}).update(r)
    return [steps[k] for k in sorted(steps)]


def main(src: str, dst: str) -> None:
    s = json.load(open(src))
    fig, ax = plt.subplots(1, 4, figsize=(17, 3.6))
    for name, arm in s["arms"].items():
        if not isinstance(arm, dict):
            continue
        st = per_training_step(arm["updates"])
        x = list(range(1, len(st) + 1))
        if name == "grpo":
            ax[0].plot(x, [r["reward/pass_rate"] for r in st], "o-", label="GRPO: all G rollouts from x")
            ax[1].plot(x, [r["reward/frac_zero_std_groups"] for r in st], "o-", label="GRPO zero-variance groups")
            ax[2].plot(x, [r["actor/entropy"] for r in st], "o-", label="GRPO")
            ax[3].plot(x, [r["actor/grad_norm"] for r in st], "o-", label="GRPO")
        else:
            ax[0].plot(x, [r["fbos/pass_rate_initial"] for r in st], "s-", label=f"{name}: G1 initial rollouts from x")
            ax[0].plot(x, [r["fbos/fap_success_rate"] for r in st], "s--", label=f"{name}: FAP rollouts")
            ax[1].plot(x, [r["fbos/zero_adv_frac_before"] for r in st], "s--", label=f"{name} zero-var. before FAP")
            ax[1].plot(x, [r["fbos/zero_adv_frac_after"] for r in st], "s-", label=f"{name} zero-var. after FAP")
            ax[1].plot(x, [r["fbos/rescued_frac"] for r in st], "^-", label=f"{name} rescued")
            ax[2].plot(x, [r["entropy/x_initial"] for r in st], "s-", label=f"{name} (x initial)")
            ax[3].plot(x, [r.get("epa/actor/grad_norm", float("nan")) for r in st], "s-", label=f"{name} EPA")
            ax[3].plot(x, [r.get("ecc/actor/grad_norm", float("nan")) for r in st], "s--", label=f"{name} ECC")
    for a_, t in zip(ax, ["pass rate of sampled rollouts", "fraction of prompts", "token entropy (nats)",
                          "pre-clip grad norm"]):
        a_.set_xlabel("training step (one generation batch)")
        a_.set_title(t)
        a_.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


def table(src: str) -> str:
    """Markdown tables of the summary: per training step of each arm, the evals and the diagnostic."""
    s = json.load(open(src))
    lines = ["| arm | step | pass rate (x) | FAP success | rescued | zero-var groups (before → after) | "
             "entropy (x) | grad norm | s/step |", "|---|---|---|---|---|---|---|---|---|"]
    for name, arm in s["arms"].items():
        if not isinstance(arm, dict):
            lines.append(f"| {name} | {arm} |||||||")
            continue
        for i, r in enumerate(per_training_step(arm["updates"]), 1):
            if name == "grpo":
                lines.append(f"| grpo | {i} | {r['reward/pass_rate']:.3f} | – | – | {r['reward/frac_zero_std_groups']:.2f} | "
                             f"{r['actor/entropy']:.3f} | {r['actor/grad_norm']:.3f} | {r.get('timing/step_s', 0):.0f} |")
            else:
                lines.append(
                    f"| {name} | {i} | {r['fbos/pass_rate_initial']:.3f} | {r['fbos/fap_success_rate']:.3f} | "
                    f"{r['fbos/rescued_frac']:.2f} | {r['fbos/zero_adv_frac_before']:.2f} → {r['fbos/zero_adv_frac_after']:.2f} | "
                    f"{r['entropy/x_initial']:.3f} | EPA {r.get('epa/actor/grad_norm', float('nan')):.3f} / "
                    f"ECC {r.get('ecc/actor/grad_norm', float('nan')):.3f} | {arm['train_s'] / max(len(per_training_step(arm['updates'])), 1):.0f} |")
    lines += ["", "| eval (held-out) | pass@1 | problems × samples | mean length | clipped |", "|---|---|---|---|---|"]
    for tag, e in s["evals"].items():
        if isinstance(e, dict):
            lines.append(f"| {tag} | {e['pass@1']:.3f} | {e['num_problems']} × {e['num_samples']} | "
                         f"{e['completions/mean_length']:.1f} | {e['completions/clipped_ratio']:.2f} |")
        else:
            lines.append(f"| {tag} | {e} ||||")
    d = s.get("diagnostic")
    if d:
        lines += ["", f"Diagnostic batch: rescued {d['rescued_frac']}, triggered {d['triggered_frac']}.", "",
                  "| EPA weighting | loss | pre-clip grad norm | mean off-policy weight |", "|---|---|---|---|"]
        for k in ("shaping", "trunc_is", "plain"):
            if k in d:
                lines.append(f"| {k} | {d[k]['loss']:.4f} | {d[k]['grad_norm']:.4f} | {d[k]['offpolicy_weight_mean']:.4f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        print(table(sys.argv[2]))
    else:
        main(sys.argv[1], sys.argv[2])

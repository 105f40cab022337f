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


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

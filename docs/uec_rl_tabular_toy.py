"""Spec §7.5 tabular toy: UEC-RL vs GRPO on 128 contexts × 32 actions (one correct action each).

The policy is a table of logits ``z [128, 32]``; the correct action's initial logit sets the difficulty.
Each step draws B contexts, G = 5 samples each at T = 1 (binary reward), GRPO advantages per group and
one step of the core clipped surrogate (token-mean) with Adam. UEC-RL adds: G′ = 20 samples at t′ = 1.2
for contexts whose G samples all failed (advantages within the G′ group, log-probs at T = 1), retention
(regular ``|Â| > 0.05``, exploration ``Â > 0``), accumulation to N_upd = B·G rows, and a FIFO replay
buffer (``Â > A_0 = 1``, capacity 2·N_upd, replayed every f = 5 steps with stored ``old_logp`` and ``Â``).

Reports the share of initially hard contexts solved (``p(correct) > 0.5``) against steps and against
rollouts, over 5 seeds. Cheap (seconds, pure tensors)::

    .venv/bin/python docs/uec_rl_tabular_toy.py --out docs/uec_rl_toy.json --plot docs/uec_rl_toy.png
"""

from __future__ import annotations

import argparse
import json

import torch

from rlvr.core.advantages import grpo_advantages
from rlvr.core.objective import LossSettings, policy_objective
from rlvr.core.uec import replay_admission_mask, retention_mask, softmax_entropy

C, V, G, GX, TX, A0, F = 128, 32, 5, 20, 1.2, 1.0, 5


def init(seed):
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(C, V, generator=gen)
    correct = torch.randint(0, V, (C,), generator=gen)
    # difficulty: the correct action's logit from −2 (p ≈ 0.004, very hard) to 3 (p ≈ 0.4)
    z[torch.arange(C), correct] = torch.linspace(-2.0, 3.0, C)[torch.randperm(C, generator=gen)]
    return z, correct, gen


def sample(z, ctx, n, temp, gen):
    p = torch.softmax(z[ctx] / temp, -1)  # [b, V]
    return torch.multinomial(p, n, replacement=True, generator=gen)  # [b, n]


def step_loss(z, ctx, act, adv, old_logp=None):
    logp = torch.log_softmax(z[ctx], -1).gather(1, act[:, None])  # [N, 1] at T = 1
    W = torch.ones_like(logp)
    s = LossSettings(epsilon=0.2, epsilon_high=0.2, clip_ratio_c=3.0)
    loss, _ = policy_objective(logp, old_logp, adv, W, s, s.denominators(W))
    return loss


def run(method, seed, steps, B, lr):
    z, correct, gen = init(seed)
    hard0 = torch.softmax(z, -1)[torch.arange(C), correct] < 0.05
    z = z.clone().requires_grad_(True)
    opt = torch.optim.Adam([z], lr=lr)
    n_upd = B * G
    pending = {"ctx": [], "act": [], "adv": []}
    replay = {"ctx": torch.zeros(0, dtype=torch.long), "act": torch.zeros(0, dtype=torch.long),
              "adv": torch.zeros(0), "old": torch.zeros(0, 1)}
    curve, rollouts = [], 0

    def update(ctx, act, adv, old=None):
        opt.zero_grad()
        step_loss(z, ctx, act, adv, old).backward()
        opt.step()

    for t in range(1, steps + 1):
        ctx = torch.randint(0, C, (B,), generator=gen)
        with torch.no_grad():
            act = sample(z, ctx, G, 1.0, gen)  # [B, G]
        r = (act == correct[ctx][:, None]).float()
        rollouts += B * G
        c_r, a_r = ctx.repeat_interleave(G), act.flatten()
        adv_r = grpo_advantages(r.flatten(), torch.arange(B).repeat_interleave(G))
        if method == "grpo":
            update(c_r, a_r, adv_r)
        else:
            hard = r.sum(1) == 0
            hc = ctx[hard]
            if len(hc):
                with torch.no_grad():
                    ax = sample(z, hc, GX, TX, gen)
                rx = (ax == correct[hc][:, None]).float()
                rollouts += len(hc) * GX
                adv_x = grpo_advantages(rx.flatten(), torch.arange(len(hc)).repeat_interleave(GX))
                c_all = torch.cat([c_r, hc.repeat_interleave(GX)])
                a_all = torch.cat([a_r, ax.flatten()])
                adv_all = torch.cat([adv_r, adv_x])
                is_x = torch.cat([torch.zeros(len(c_r), dtype=torch.bool), torch.ones(len(adv_x), dtype=torch.bool)])
            else:
                c_all, a_all, adv_all, is_x = c_r, a_r, adv_r, torch.zeros(len(c_r), dtype=torch.bool)
            keep = retention_mask(adv_all, is_x, torch.zeros_like(is_x))
            pending["ctx"].append(c_all[keep])
            pending["act"].append(a_all[keep])
            pending["adv"].append(adv_all[keep])
            pc, pa, pv = (torch.cat(pending[k]) for k in ("ctx", "act", "adv"))
            pc, pa, pv = pc[-4 * n_upd:], pa[-4 * n_upd:], pv[-4 * n_upd:]
            k = (len(pc) // n_upd) * n_upd
            pending = {"ctx": [pc[k:]], "act": [pa[k:]], "adv": [pv[k:]]}
            if k:
                uc, ua, uv = pc[:k], pa[:k], pv[:k]
                adm = replay_admission_mask(uv, "positive", A0)
                with torch.no_grad():
                    old = torch.log_softmax(z[uc[adm]], -1).gather(1, ua[adm][:, None])
                update(uc, ua, uv)
                for key, val in (("ctx", uc[adm]), ("act", ua[adm]), ("adv", uv[adm]), ("old", old)):
                    replay[key] = torch.cat([replay[key], val])[-2 * n_upd:]
            if t % F == 0 and len(replay["ctx"]) >= n_upd:
                n = len(replay["ctx"])
                idx = torch.arange(n) if n >= 2 * n_upd else torch.randperm(n, generator=gen)[: (n // n_upd) * n_upd]
                update(replay["ctx"][idx], replay["act"][idx], replay["adv"][idx], replay["old"][idx])
        with torch.no_grad():
            p = torch.softmax(z, -1)
            solved = p[torch.arange(C), correct] > 0.5
            curve.append({"step": t, "rollouts": rollouts, "hard_solved": float(solved[hard0].float().mean()),
                          "all_solved": float(solved.float().mean()), "entropy": float(softmax_entropy(z).mean())})
    return curve


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200, help="UEC-RL steps")
    ap.add_argument("--grpo_steps", type=int, default=480, help="GRPO steps (enough to match UEC-RL's rollouts)")
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", default="docs/uec_rl_toy.json")
    ap.add_argument("--plot", default=None)
    args = ap.parse_args()
    n_steps = {"grpo": args.grpo_steps, "uec": args.steps}
    res = {m: [run(m, s, n_steps[m], args.B, args.lr) for s in range(args.seeds)] for m in ("grpo", "uec")}
    summary = {"args": vars(args), "curves_mean": {}}
    for m, runs in res.items():
        mean = []
        for i in range(n_steps[m]):
            mean.append({k: sum(r[i][k] for r in runs) / len(runs) for k in runs[0][i]})
        summary["curves_mean"][m] = mean
    def at_rollouts(m, r):
        cm = summary["curves_mean"][m]
        return next((x for x in cm if x["rollouts"] >= r), cm[-1])

    table = []
    for at in (25, 50, 100, 150, args.steps):
        u = summary["curves_mean"]["uec"][at - 1]
        g_step = summary["curves_mean"]["grpo"][min(at, args.grpo_steps) - 1]
        g_roll = at_rollouts("grpo", u["rollouts"])
        row = {"uec_step": at, "uec_rollouts": u["rollouts"], "uec_hard_solved": u["hard_solved"],
               "uec_entropy": u["entropy"], "grpo_hard_solved_same_step": g_step["hard_solved"],
               "grpo_entropy_same_step": g_step["entropy"], "grpo_step_same_rollouts": g_roll["step"],
               "grpo_rollouts_same_rollouts": g_roll["rollouts"], "grpo_hard_solved_same_rollouts": g_roll["hard_solved"],
               "grpo_entropy_same_rollouts": g_roll["entropy"]}
        table.append(row)
        print({k: round(v, 3) for k, v in row.items()})
    summary["table"] = table
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(1, 3, figsize=(13, 3.4))
        for m, c in (("grpo", "tab:blue"), ("uec", "tab:red")):
            cm = summary["curves_mean"][m]
            cs = [r for r in cm if r["step"] <= args.steps]
            ax[0].plot([r["step"] for r in cs], [r["hard_solved"] for r in cs], color=c, label=m)
            ax[1].plot([r["rollouts"] for r in cm], [r["hard_solved"] for r in cm], color=c, label=m)
            ax[2].plot([r["rollouts"] for r in cm], [r["entropy"] for r in cm], color=c, label=m)
        ax[0].set(xlabel="step", title="initially-hard contexts solved (p>0.5)")
        ax[1].set(xlabel="rollouts", title="same, against rollouts")
        ax[2].set(xlabel="rollouts", title="mean entropy (nats)")
        for a in ax:
            a.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=80)


if __name__ == "__main__":
    main()

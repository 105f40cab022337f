# Usage: python docs/results/replication/v4/interim_fbos.py docs/results/replication/v4/v4_fbos_rl
"""Interim paired differences of the finished v4_fbos_rl lr 1e-4 runs (seeds with all four arms)."""
import json, os, statistics as st, sys
from scipy import stats
R = sys.argv[1]
arms = ["fbos_rl_lr1e-4", "grpo_lr1e-4", "grpo_spg2_lr1e-4", "grpo_it2_lr1e-4"]
def val(d, m):
    if m == "hard/pass@1":
        return st.mean([d["eval/level7/pass@1"], d["eval/level8/pass@1"]])
    return d[m]
res = {a: {} for a in arms}
for a in arms:
    for s in os.listdir(os.path.join(R, a)):
        f = os.path.join(R, a, s, "result.json")
        if os.path.exists(f):
            res[a][int(s[4:])] = json.load(open(f))
seeds = sorted(set.intersection(*(set(v) for v in res.values())))
print(f"seeds with all four arms: {seeds} (n={len(seeds)})\n")
print("| contrast | metric | mean d | 95% t-interval | seeds d>0 |")
print("|---|---|---|---|---|")
for other in arms[1:]:
    for m in ("hard/pass@1", "eval/pass@1"):
        d = [val(res[arms[0]][s], m) - val(res[other][s], m) for s in seeds]
        mu = st.mean(d); se = st.stdev(d) / len(d) ** 0.5; t = stats.t.ppf(0.975, len(d) - 1)
        print(f"| fbos_rl − {other.replace('_lr1e-4','')} | `{m}` | {mu:+.3f} | [{mu-t*se:+.3f}, {mu+t*se:+.3f}] | {sum(x>0 for x in d)}/{len(d)} |")
for a in arms:
    print(f"\n{a}: mean steps {st.mean(res[a][s]['steps'] for s in seeds):.1f}, rollouts {st.mean(res[a][s]['rollouts'] for s in seeds):.0f}", end="")
print()

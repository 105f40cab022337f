"""The v4 seed rule per claim (preregistration_v4.md §Power): how many paired seeds each primary asks for.

    PYTHONPATH=src python docs/results/replication/v4/seed_rule.py [rates|best]

For every primary of reading (a) (``rates``, the default: ``v4_rates_claims.yaml``) or reading (b) (``best``:
``v4_claims.yaml``) with committed runs: the paired seeds n, the sd of the per-seed differences d, the MDE at
n (one-sided paired t, alpha 0.05, 80 % power), and the seed rule's n: :func:`power_v4.n_for_mde` (``higher``
claims, MDE <= 0.06) or :func:`power_v4.n_for_tost` (``match`` claims, margin 0.05), capped at 48. The rule is
read from the spread only, never from the mean of d, and a cell is extended (both arms to that n) before its
next analysis; each extension is recorded in the commit message of the runs that follow it.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path

import yaml

from rlvr.compare.claim_values import seed_values
from rlvr.compare.stats_rules import min_detectable_effect

HERE = Path(__file__).resolve().parent
CAP = 48


def _power():
    spec = importlib.util.spec_from_file_location("power_v4", HERE / "power_v4.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rows(reading: str = "rates") -> list[dict]:
    """One dict per primary with at least 2 paired seeds: claim, n, sd, mde, rule_n (capped), capped, arm_n, ref_n."""
    power = _power()
    doc = yaml.safe_load((HERE.parent / ("v4_rates_claims.yaml" if reading == "rates" else "v4_claims.yaml")).read_text())
    out = []
    for c in doc["claims"]:
        if not c.get("primary") or "seeds" not in c:
            continue
        folder = HERE / c["compare"].rsplit("/", 1)[-1]
        a, r = seed_values(folder, c["arm"], c["metric"]), seed_values(folder, c["ref"], c["metric"])
        both = sorted(set(a) & set(r))
        sd = statistics.stdev([a[s] - r[s] for s in both])
        n = power.n_for_tost(sd, 0.05, 0.05) if c["direction"] == "match" else power.n_for_mde(sd, 0.05)
        out.append({"claim": c["claim"], "n": len(both), "sd": sd, "mde": min_detectable_effect(sd, len(both), alpha=0.05),
                    "rule_n": min(n, CAP), "capped": n > CAP, "arm_n": len(a), "ref_n": len(r)})
    return out


def main(argv: list[str] | None = None) -> None:
    reading = (argv if argv is not None else sys.argv[1:] or ["rates"])[0]
    for row in rows(reading):
        flag = " (cap)" if row["capped"] else ""
        todo = "  <- extend" if row["rule_n"] > row["n"] else ""
        print(f"n={row['n']:2d} sd={row['sd']:.3f} MDE={row['mde']:.3f} rule n={row['rule_n']}{flag} "
              f"[arm {row['arm_n']}, ref {row['ref_n']}]  {row['claim']}{todo}")


if __name__ == "__main__":
    main()

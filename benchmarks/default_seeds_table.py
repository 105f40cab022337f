"""Per-seed held-out pass@1 of default-model comparison runs, with 95 % t-intervals and paired
differences against GRPO (issue 17 §3, last sentence; docs/results/default_compare_3seeds.md).

Reads the flat result files the docs keep, ``DIR/<arm>.seed<k>.result.json`` (copies of
``rlvr compare``'s ``OUT/<arm>/seed<k>/result.json``), from one or more folders; a later folder's file
for the same arm × seed wins (so a rerun of GRPO replaces the older one). Prints a Markdown table:

* per arm, pass@1 of every seed, mean ± half-width of the two-sided 95 % Student-t interval over seeds
  (``t_{0.975, n-1} · s / √n``, :func:`rlvr.compare.claim_values.t_interval`), pass@4 mean, generated tokens
  mean and wall seconds per run;
* per arm, the paired difference arm − reference (same seed: same training draw and the same held-out
  problems and sampling seed) per seed, with its mean ± 95 % t half-width over seeds.

Usage::

    python benchmarks/default_seeds_table.py docs/results/default3 docs/results/default_variants3 \
        --arms grpo,mu_grpo,fbos_rl,uec_rl,ib_tpo --ref grpo

Source: interpretation of issue 17 §3 ("mean ± 95 % confidence interval (say how computed)").
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any, Sequence

from rlvr.compare.claim_values import t_interval

_NAME = re.compile(r"^(?P<arm>[A-Za-z0-9_.-]+?)\.seed(?P<seed>\d+)\.result\.json$")


def load_results(folders: Sequence[str | Path]) -> dict[tuple[str, int], dict[str, Any]]:
    """``{(arm, seed): result}`` from the ``<arm>.seed<k>.result.json`` files of ``folders`` (later
    folders win).

    Raises:
        FileNotFoundError: a folder that does not exist (named).
    """
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for folder in folders:
        p = Path(folder)
        if not p.is_dir():
            raise FileNotFoundError(f"{p}: no such folder (expected <arm>.seed<k>.result.json files)")
        for f in sorted(p.iterdir()):
            m = _NAME.match(f.name)
            if m:
                out[(m["arm"], int(m["seed"]))] = json.loads(f.read_text())
    return out


def _fmt(mean: float, half: float, nd: int = 3, sign: str = "") -> str:
    if math.isnan(mean):
        return "–"
    if math.isinf(half):
        return f"{mean:{sign}.{nd}f} (1 seed)"
    return f"{mean:{sign}.{nd}f} ± {half:.{nd}f}"


def table(results: dict[tuple[str, int], dict[str, Any]], arms: Sequence[str], ref: str,
          key: str = "eval/pass@1") -> str:
    """The Markdown tables (per-seed values with intervals, then paired differences against ``ref``)."""
    seeds = sorted({s for (_, s) in results})
    head = "| arm | " + " | ".join(f"seed {s}" for s in seeds) + \
        " | mean ± 95 % t | pass@4 mean | tokens mean | wall s mean |"
    lines = [head, "|" + "---|" * (len(seeds) + 5)]
    for arm in arms:
        vals = {s: results[(arm, s)][key] for s in seeds if (arm, s) in results}
        if not vals:
            continue
        m, h, _ = t_interval(list(vals.values()))
        p4 = [results[(arm, s)].get("eval/pass@4", math.nan) for s in vals]
        tok = [results[(arm, s)].get("tokens", math.nan) for s in vals]
        wall = [results[(arm, s)].get("wall_s") for s in vals]
        wall = [w for w in wall if isinstance(w, (int, float))]
        cells = [f"{vals[s]:.3f}" if s in vals else "–" for s in seeds]
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {_fmt(m, h)} | {sum(p4) / len(p4):.3f} | "
                     f"{sum(tok) / len(tok):,.0f} | ".replace(",", " ") + (f"{sum(wall) / len(wall):.0f}" if wall else "–") + " |")
    lines += ["", f"| arm − {ref} (paired by seed) | " + " | ".join(f"seed {s}" for s in seeds) +
              " | mean ± 95 % t | seeds above |", "|" + "---|" * (len(seeds) + 3)]
    for arm in arms:
        if arm in (ref, "initial"):  # the untrained row is not an arm to pair
            continue
        diffs = {s: results[(arm, s)][key] - results[(ref, s)][key]
                 for s in seeds if (arm, s) in results and (ref, s) in results}
        if not diffs:
            continue
        m, h, n = t_interval(list(diffs.values()))
        cells = [f"{diffs[s]:+.3f}" if s in diffs else "–" for s in seeds]
        above = sum(d > 0 for d in diffs.values())
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {_fmt(m, h, sign='+')} | {above} of {n} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: print the tables for the given folders."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", help="folders of <arm>.seed<k>.result.json (later ones win)")
    ap.add_argument("--arms", required=True, help="comma-separated arms, in row order")
    ap.add_argument("--ref", default="grpo", help="reference arm of the paired differences (default grpo)")
    args = ap.parse_args(argv)
    print(table(load_results(args.folders), [a for a in args.arms.split(",") if a], args.ref), end="")


if __name__ == "__main__":
    main()

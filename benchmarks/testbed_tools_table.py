"""The tools-testbed study's table (issue 26 item 7; docs/environments.md "Tools testbed"): held-out tool-call rate
and pass@1 of the pre-trained policy (``initial``) and after GRPO, with 95 % intervals.

Reads an ``rlvr compare`` folder (``OUT/<arm>/seed<k>/result.json``, e.g. of
``docs/results/testbed_tools_compare.yaml``) or a folder of their flat copies (``<arm>.seed<k>.result.json``, as
``docs/results/testbed_tools/`` keeps them) and prints a Markdown table, one row per metric:

* ``initial``: the pre-trained policy is one policy and the held-out evaluation is the same for every seed
  (same problems, same sampling seed), so its value is one number; its 95 % interval is over the held-out
  problems (the evaluation's ``eval/ci95/<metric>``: Wilson or a percentile bootstrap,
  :func:`rlvr.eval.stats.mean_with_ci`);
* ``after``: mean over seeds ± the half-width of the two-sided 95 % Student-t interval over seeds
  (:func:`rlvr.compare.claim_values.t_interval`);
* ``after − initial``: the per-seed differences' mean ± 95 % t half-width, and how many seeds went up.

Usage: ``python benchmarks/testbed_tools_table.py runs/compare/testbed_tools [--arm grpo] [--json out.json]``
(or ``docs/results/testbed_tools``).
Source: interpretation of issue 26 item 7 ("with 5 seeds and 95 % intervals").
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Sequence

from rlvr.compare.claim_values import t_interval

METRICS = (("eval/env/tool_rate", "episodes with a tool call"), ("eval/pass@1", "held-out pass@1"),
           ("eval/pass@8", "held-out pass@8"), ("eval/env/tool_calls", "tool calls per episode"))
"""``(result.json key, row label)`` in row order."""


def load(folder: str | Path, arm: str) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
    """``(initial, after)``: ``{seed: result}`` of the ``initial`` rows and of ``arm``.

    Raises:
        FileNotFoundError: no result of ``arm`` or of ``initial`` in ``folder`` (named).
    """
    out = []
    for name in ("initial", arm):
        got = {int(p.parent.name.removeprefix("seed")): json.loads(p.read_text())
               for p in sorted(Path(folder).glob(f"{name}/seed*/result.json"))}
        got.update({int(p.name.split(".")[-3].removeprefix("seed")): json.loads(p.read_text())  # the docs' flat copies
                    for p in sorted(Path(folder).glob(f"{name}.seed*.result.json"))})
        if not got:
            raise FileNotFoundError(f"{folder}: no {name}/seed*/result.json (run the compare spec with eval.baseline)")
        out.append(got)
    return out[0], out[1]


def summarize(initial: dict[int, dict[str, Any]], after: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per metric: ``initial`` (value, interval over problems), ``after`` (mean, t half-width, n, per seed) and
    the paired ``diff`` (mean, t half-width, n, seeds up)."""
    out: dict[str, Any] = {}
    first = initial[min(initial)]
    for key, _ in METRICS:
        if key not in first:
            continue
        ci = first.get(key.replace("eval/", "eval/ci95/", 1))
        vals = {s: r[key] for s, r in after.items() if isinstance(r.get(key), (int, float))}
        m, h, n = t_interval(list(vals.values()))
        diffs = [vals[s] - initial[s][key] for s in vals if s in initial and key in initial[s]]
        dm, dh, dn = t_interval(diffs)
        out[key] = {"initial": first[key], "initial_ci95": ci, "after": vals, "after_mean": m, "after_half": h,
                    "n": n, "diff_mean": dm, "diff_half": dh, "seeds_up": sum(d > 0 for d in diffs), "diff_n": dn}
    return out


def _pm(m: float, h: float, sign: str = "") -> str:
    return "–" if math.isnan(m) else (f"{m:{sign}.3f} (1 seed)" if math.isinf(h) else f"{m:{sign}.3f} ± {h:.3f}")


def table(summary: dict[str, Any]) -> str:
    """The Markdown table of :func:`summarize`'s result."""
    lines = ["| metric (held-out, levels 5–7) | pre-trained [95 % over problems] | after GRPO, per seed | "
             "after: mean ± 95 % t | after − pre-trained | seeds up |", "|---|---|---|---|---|---|"]
    labels = dict(METRICS)
    for key, s in summary.items():
        ci = s["initial_ci95"]
        init = f"{s['initial']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
        seeds = " ".join(f"{v:.3f}" for _, v in sorted(s["after"].items()))
        lines.append(f"| {labels[key]} | {init} | {seeds} | {_pm(s['after_mean'], s['after_half'])} | "
                     f"{_pm(s['diff_mean'], s['diff_half'], '+')} | {s['seeds_up']} of {s['diff_n']} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: print the table (and write ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="the rlvr compare output folder")
    ap.add_argument("--arm", default="grpo")
    ap.add_argument("--json", default=None, help="also write the summary here")
    args = ap.parse_args(argv)
    summary = summarize(*load(args.folder, args.arm))
    print(table(summary), end="")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

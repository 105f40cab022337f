"""Regenerate every claims table of the replication results pages from the committed per-run files, by one
command (issue 38 item 3)::

    PYTHONPATH=src python -m rlvr.compare.results_page          # rewrite the tables and the pages' blocks
    PYTHONPATH=src python -m rlvr.compare.results_page --check  # exit 1 and name what differs

Each entry of :data:`TABLES` is a claims file (whose ``compare`` paths point at the committed copies under
``docs/results/replication/prereg/``) and the Markdown (+ JSON) table it writes. ``*_v4rule`` entries read the
same files under the v4 rule (:mod:`rlvr.compare.verdict_v4`), so the v3 data can be shown relabelled.
A results page embeds tables between markers::

    <!-- begin table:prereg_tuned paper=FBOS-RL -->   (paper= and primary=1 filter the rows; both optional)
    <!-- end table -->
    <!-- begin primaries -->                            (the v3-vs-v4 summary of every primary)
    <!-- end primaries -->
    <!-- begin tuning:v4_fbos_rl_tune -->                (each arm's mean tuning pass@1 per rate, and its best)
    <!-- end tuning -->

and everything between a pair is replaced by the generated rows; text outside the markers is the authors'.
Figures are not redrawn (slow, and not numbers): a figure line is written when its file exists.

Source: interpretation of issue 38 item 3 ("every number on the results page regenerated from the files by
one command; a test checks the page matches").
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from rlvr.compare.claim_values import seed_values
from rlvr.compare.claims import TABLE_HEAD, ClaimsFile, claim_row, evaluate

REPLICATION = "docs/results/replication"
TABLES: dict[str, tuple[str, str, str | None]] = {
    "prereg_tuned": (f"{REPLICATION}/prereg_claims.yaml", "docs/results/replication_prereg_claims.md", None),
    "prereg_common": (f"{REPLICATION}/prereg_claims_common.yaml", "docs/results/replication_prereg_claims_common.md",
                      None),
    "prereg_default": (f"{REPLICATION}/prereg_default_claims.yaml",
                       "docs/results/replication_prereg_default_claims.md", None),
    "prereg_tuned_v4rule": (f"{REPLICATION}/prereg_claims.yaml", "docs/results/replication_prereg_claims_v4rule.md",
                            "v4"),
    "prereg_common_v4rule": (f"{REPLICATION}/prereg_claims_common.yaml",
                             "docs/results/replication_prereg_claims_common_v4rule.md", "v4"),
    "prereg_default_v4rule": (f"{REPLICATION}/prereg_default_claims.yaml",
                              "docs/results/replication_prereg_default_claims_v4rule.md", "v4"),
    "v4": (f"{REPLICATION}/v4_claims.yaml", "docs/results/replication_v4_claims.md", None),
    "v4_rates": (f"{REPLICATION}/v4_rates_claims.yaml", "docs/results/replication_v4_rates_claims.md", None),
}
"""``name: (claims file, table it writes, rule override or None)``, paths relative to the repository root."""

PAGES = ("docs/results/replication.md", "docs/results/replication_prereg.md")
"""The pages whose marked blocks are regenerated."""

_BLOCK = re.compile(r"(<!-- begin (table:[\w]+[^>]*|tuning:[\w-]+|primaries) -->\n)(.*?)"
                    r"(<!-- end (?:table|tuning|primaries) -->)", re.S)
TUNING_ROOT = f"{REPLICATION}/v4"
"""Where a ``tuning:NAME`` block reads its runs: ``TUNING_ROOT/NAME/<arm>_lr<rate>/seed<k>/result.json``."""


def tuning_md(root: Path, name: str) -> str:
    """The tuning table of the committed folder ``name``: per arm, the mean held-out pass@1 over its tuning
    seeds at each rate (with the seed count when it differs between rates) and the best rate, the highest
    mean with ties to the smaller rate (the rule of ``docs/results/replication/v4/make_v4.py``'s ``best_rate``).

    Raises:
        FileNotFoundError: the folder does not exist.
    """
    folder = root / TUNING_ROOT / name
    if not folder.is_dir():
        raise FileNotFoundError(f"results page marker tuning:{name}: no folder {folder}")
    cells: dict[str, dict[str, list[float]]] = {}
    for d in sorted(folder.iterdir()):
        if d.is_dir() and "_lr" in d.name:
            arm, lr = d.name.rsplit("_lr", 1)
            cells.setdefault(arm, {})[lr] = list(seed_values(folder, d.name, "eval/pass@1").values())
    rates = sorted({lr for c in cells.values() for lr in c}, key=float)
    lines = ["| arm | " + " | ".join(rates) + " | best |", "|---|" + "---:|" * len(rates) + "---|"]
    for arm, by in cells.items():
        means = {lr: sum(v) / len(v) for lr, v in by.items() if v}
        best = max(sorted(means, key=float), key=lambda lr: (means[lr], -float(lr))) if means else "–"
        ns = {len(by.get(lr, [])) for lr in rates}
        txt = [("–" if lr not in means else (f"**{means[lr]:.3f}**" if lr == best else f"{means[lr]:.3f}"))
               + ("" if len(ns) == 1 else f" (n={len(by.get(lr, []))})") for lr in rates]
        lines.append(f"| `{arm}` | " + " | ".join(txt) + f" | {best} |")
    return "\n".join(lines) + "\n"


def _load(root: Path, claims_file: str, rule: str | None) -> ClaimsFile:
    cf = ClaimsFile.load(root / claims_file)
    for c in cf.claims:
        if rule is not None:
            c.rule_version = rule
        if not Path(c.compare).is_absolute():
            c.compare = str(root / c.compare)
    return cf


def _rel(results: list[dict[str, Any]], root: Path) -> list[dict[str, Any]]:
    pre = str(root) + "/"
    return [{**r, "compare": str(r["compare"]).removeprefix(pre)} for r in results]


def table_results(root: Path) -> dict[str, tuple[ClaimsFile, list[dict[str, Any]]]]:
    """``{name: (claims file, evaluate() results)}`` of every :data:`TABLES` entry read under ``root``."""
    out = {}
    for name, (cfile, _, rule) in TABLES.items():
        cf = _load(root, cfile, rule)
        out[name] = (cf, _rel(evaluate(cf.claims), root))
    return out


def _table_md(cf: ClaimsFile, results: list[dict[str, Any]], rule: str | None, root: Path) -> str:
    title = cf.title + (" — relabelled under the v4 rule (issue 38)" if rule == "v4" else "")
    figs = [f"![{f['paper']}]({Path(f['path']).name})\n" for f in cf.figures if (root / f["path"]).exists()]
    lines = [f"### {title}", "", *TABLE_HEAD, *(claim_row(r) for r in results), ""]
    return "\n".join(lines) + "\n" + "\n".join(figs)


def _block(spec: str, tables: dict[str, tuple[ClaimsFile, list[dict[str, Any]]]], root: Path) -> str:
    if spec == "primaries":
        return primaries_md(tables)
    if spec.startswith("tuning:"):
        return tuning_md(root, spec.removeprefix("tuning:"))
    name, *opts = spec.removeprefix("table:").split()
    kw = dict(o.split("=", 1) for o in opts)
    if name not in tables:
        raise KeyError(f"results page marker names table {name!r}; known: {sorted(tables)}")
    rows = [r for r in tables[name][1] if ("paper" not in kw or r["paper"] == kw["paper"].replace("_", " "))
            and ("primary" not in kw or r["primary"])]
    return "\n".join([*TABLE_HEAD, *(claim_row(r) for r in rows)]) + "\n"


def primaries_md(tables: dict[str, tuple[ClaimsFile, list[dict[str, Any]]]]) -> str:
    """The summary of every primary: its v3 verdict and its verdict under the v4 rule, with the 90 % interval."""
    head = ["| table | paper | primary claim | paired difference (90 % t-interval) | effect of interest | MDE (80 %) "
            "| v3 verdict | v4 rule verdict |", "|---|---|---|---|---|---|---|---|"]
    rows = []
    for name in ("prereg_tuned", "prereg_common", "prereg_default"):
        v3 = [r for r in tables[name][1] if r["primary"]]
        v4 = [r for r in tables[name + "_v4rule"][1] if r["primary"]]
        for a, b in zip(v3, v4):
            iv = b.get("interval90", [float("nan")] * 2)
            eff = a["margin"] if a["direction"] == "match" else (a["effect"] or 0)
            eff_txt = f"± {eff:g} (equivalence)" if a["direction"] == "match" else f"{eff:g}"
            rows.append(f"| {name.removeprefix('prereg_')} | {a['paper']} | {a['claim']} | {a['d']['mean']:+.3f} "
                        f"[{iv[0]:+.3f}, {iv[1]:+.3f}] | {eff_txt} | {a.get('mde80', float('nan')):.3f} "
                        f"| {a['verdict']} | **{b['verdict']}** |")
    return "\n".join(head + rows) + "\n"


def render(root: Path, out_root: Path) -> list[str]:
    """Write every :data:`TABLES` entry and every page of :data:`PAGES` (its blocks regenerated) under
    ``out_root`` (same relative paths as under ``root``). Returns the relative paths written.

    Raises:
        KeyError: a page's marker names an unknown table.
        rlvr.errors.ConfigError: a claims file is invalid or a claim's seeds do not pair.
    """
    tables = table_results(root)
    written = []
    for name, (_, md, rule) in TABLES.items():
        cf, res = tables[name]
        dst = out_root / md
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(_table_md(cf, res, rule, root))
        dst.with_suffix(".json").write_text(json.dumps(res, indent=2, default=str) + "\n")
        written += [md, str(Path(md).with_suffix(".json"))]
    for page in PAGES:
        text = (root / page).read_text()
        new = _BLOCK.sub(lambda m: m.group(1) + _block(m.group(2), tables, root) + m.group(4), text)
        (out_root / page).parent.mkdir(parents=True, exist_ok=True)
        (out_root / page).write_text(new)
        written.append(page)
    return written


def check(root: Path) -> list[str]:
    """The relative paths whose committed text differs from what :func:`render` writes (empty: all match)."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = render(root, Path(tmp))
        return [p for p in paths if not (root / p).exists()
                or (root / p).read_text() != (Path(tmp) / p).read_text()]


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m rlvr.compare.results_page [--check] [--root DIR]`` (see the module docstring)."""
    import argparse

    ap = argparse.ArgumentParser(description="Regenerate the replication results pages from the per-run files")
    ap.add_argument("--check", action="store_true", help="compare with the committed files; exit 1 on a difference")
    ap.add_argument("--root", default=".", help="repository root (default: the current directory)")
    args = ap.parse_args(argv)
    root = Path(args.root).resolve()
    if args.check:
        bad = check(root)
        for p in bad:
            print(f"stale: {p} (run python -m rlvr.compare.results_page)", file=sys.stderr)
        raise SystemExit(1 if bad else 0)
    for p in render(root, root):
        print(f"wrote {p}")


if __name__ == "__main__":
    main()

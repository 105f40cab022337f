"""Paper claims checked against ``rlvr compare`` runs: paired tests over seeds and a verdict per claim.

A *claims file* (YAML) lists claims and figures::

    title: Replication on testbed v2l
    claims:
      - paper: FBOS-RL
        claim: higher final pass@1 than GRPO
        compare: runs/compare/v2l_main          # an rlvr compare folder, or RUNS.json#SERIES
        arm: fbos_rl
        ref: grpo                               # default grpo
        metric: eval/pass@1                     # see METRICS
        direction: higher                       # higher | lower | match | faster | band
        primary: true                           # in the Holm family of the file's primary claims
        family: fbos_rates                      # optional: primaries with the same family form their own Holm family
        effect: 0.05                            # smallest effect of interest (power; "refuted" below it)
    figures:
      - paper: FBOS-RL
        compare: runs/compare/v2l_main
        arms: [grpo, fbos_rl]
        path: docs/results/replication_fbos.png

``python -m rlvr.compare.claims CLAIMS.yaml --out docs/results/replication_claims.md`` writes the
table (Markdown + JSON next to it) and the figures.

Per-seed values come from :mod:`rlvr.compare.claim_values` (run folders, flat result copies or a
``runs.json`` series; derived metrics in its ``METRICS``).

Rules (issue 29 item 1; the statistics are :mod:`rlvr.compare.stats_rules`):

* every claim compares **paired seeds**: per seed ``s`` a difference ``d_s`` that is positive when
  the claim holds — ``higher``: ``arm − times · ref``; ``lower``: ``ref − arm``; ``faster`` (wall
  clock, ``factor`` f): ``ref / f − arm`` (seconds); ``match``: ``arm − ref``. The arm and the
  reference must have finished on the same seeds (else :class:`~rlvr.compare.stats_rules.UnpairedSeedsError`);
  ``band`` (``lo``, ``hi``) has no reference and tests the arm's own mean;
* the primary test is the one-sided **paired t-test** of ``mean d > 0`` (``test: wilcoxon`` makes the
  signed-rank test primary); the other test, a seeded BCa bootstrap interval of ``mean d`` and the
  collapse / take-off counts of both arms (:class:`~rlvr.compare.stats_rules.Regimes`) are reported
  beside it; ``match`` is TOST within ``± margin`` and ``band`` TOST of the arm's mean inside ``[lo, hi]``;
* the p-values of the claims marked ``primary: true`` are **Holm-adjusted** as one family (or, with
  ``family: NAME``, within the primaries of that name: e.g. one claim read at each of 3 shared rates is a
  family of 3, beside the file's main family); other claims are secondary and judged on their unadjusted p
  (the table says which);
* the verdict: **reproduced** when the (adjusted) p < α (0.05); **refuted** when the one-sided
  ``1 − α`` upper bound of ``mean d`` lies below ``effect`` (default 0: the opposite sign is shown)
  — for ``match``, when the two-sided ``1 − α`` t-interval lies outside ``± margin``; for ``band``,
  outside ``[lo, hi]`` — reported with the effect the design detects at 80 % power (the minimum
  detectable effect from the observed spread of ``d``); **inconclusive** otherwise; **untestable
  here** when fewer than 2 paired seeds have the metric, when a ``requires`` precondition fails
  (e.g. the veto never fired) or when the claim states ``untestable: <why>``.

Source: interpretation of issue 29 items 1 and 5 (replacing issue 17 §3's rule, which compared the
arm's interval with the reference's *point* mean and let one collapsed reference seed decide).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from rlvr.compare import stats_rules as sr
from rlvr.compare.claim_values import seed_values
from rlvr.compare.verdict_v4 import decide_v4, holm_sides, v4_stats
from rlvr.errors import ConfigError

# ------------------------------------------------------------------------------------------ claims
DIRECTIONS = ("higher", "lower", "match", "faster", "band")
VERDICTS = ("reproduced", "refuted", "inconclusive", "untestable here")
"""The verdict vocabulary of a claim under the v3 rule (see the module docstring; v4 adds
"positive, below effect of interest": :data:`rlvr.compare.verdict_v4.V4_VERDICTS`)."""
RULES = ("v3", "v4")
"""Verdict rules: ``v3`` (the issue-29 rule of this module's docstring, kept so the v3 tables regenerate
identically) and ``v4`` (:mod:`rlvr.compare.verdict_v4`, the default since issue 38)."""


@dataclass
class Claim:
    """One claim of one paper (see the module docstring for the rules).

    ``margin`` is ``match``'s equivalence margin (``tolerance`` is its older name, kept for claims files
    written before issue 29); ``effect`` the smallest effect of interest in units of the paired
    difference (power is computed for it; below it a gain counts as refuted); ``seeds`` restricts the
    pairing to these seeds; ``start`` the pre-trained value for the collapse / take-off counts (None:
    the mean of the ``initial`` row of the same comparison, when there is one); ``regimes`` the
    :class:`~rlvr.compare.stats_rules.Regimes` thresholds as a mapping, or ``False`` for none
    (default: counted for ``pass@`` metrics); ``requires`` ``{metric, min}``: untestable unless the
    arm's mean of that metric reaches ``min``; ``untestable``: a stated reason not to test.
    """

    paper: str
    claim: str
    compare: str
    arm: str
    metric: str
    direction: str = "higher"
    ref: str = "grpo"
    ref_compare: str | None = None
    tolerance: float = 0.05
    margin: float | None = None
    effect: float | None = None
    factor: float = 1.5
    times: float = 1.0
    lo: float | None = None
    hi: float | None = None
    primary: bool = False
    family: str = ""
    test: str = "t"
    alpha: float = 0.05
    seeds: list[int] | None = None
    start: float | None = None
    regimes: Any = None
    requires: dict[str, Any] | None = None
    untestable: str | None = None
    note: str = ""
    rule_version: str = "v4"

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ConfigError(f"claim {self.claim!r}: direction must be one of {', '.join(DIRECTIONS)}, "
                              f"got {self.direction!r}")
        if self.direction == "band" and (self.lo is None or self.hi is None):
            raise ConfigError(f"claim {self.claim!r}: direction band needs lo and hi")
        if self.test not in ("t", "wilcoxon"):
            raise ConfigError(f"claim {self.claim!r}: test must be t or wilcoxon, got {self.test!r}")
        if self.rule_version not in RULES:
            raise ConfigError(f"claim {self.claim!r}: rule must be one of {', '.join(RULES)}, got {self.rule_version!r}")
        if not 0 < self.alpha < 1:
            raise ConfigError(f"claim {self.claim!r}: alpha must be in (0, 1), got {self.alpha!r}")
        if self.margin is None:
            self.margin = self.tolerance
        if not self.margin > 0:
            raise ConfigError(f"claim {self.claim!r}: margin must be > 0, got {self.margin!r}")
        if self.requires is not None and set(self.requires) != {"metric", "min"}:
            raise ConfigError(f"claim {self.claim!r}: requires must be a mapping with keys metric and min, "
                              f"got {self.requires!r}")
        if self.regimes not in (None, False) and not isinstance(self.regimes, dict):
            raise ConfigError(f"claim {self.claim!r}: regimes must be a mapping of Regimes thresholds or false")

    def regime_rule(self) -> sr.Regimes | None:
        """The collapse / take-off thresholds of this claim, or None when none are counted."""
        if self.regimes is False or (self.regimes is None and "pass@" not in self.metric):
            return None
        try:
            return sr.Regimes(**(self.regimes or {}))
        except TypeError as exc:
            raise ConfigError(f"claim {self.claim!r}: regimes: {exc}") from None


def differences(claim: Claim, arm: Mapping[int, float], ref: Mapping[int, float]) -> tuple[tuple[int, ...], np.ndarray]:
    """``(seeds, d)``: the per-seed differences ``d`` (``[n]``) of ``claim``, positive when it holds (module
    docstring); for ``band`` the arm's own values.

    Raises:
        UnpairedSeedsError: the two arms' seeds differ (or lack one of ``claim.seeds``).
    """
    if claim.seeds is not None:
        want = set(claim.seeds)
        arm, ref = ({s: v for s, v in x.items() if s in want} for x in (arm, ref))
        for side, x in (("arm", arm), ("reference", ref)):
            if claim.direction != "band" or side == "arm":
                if set(x) != want:
                    raise sr.UnpairedSeedsError(f"claim {claim.claim!r}: the {side} lacks seeds "
                                                f"{sorted(want - set(x))} of the claim's seeds {sorted(want)}")
    if claim.direction == "band":
        seeds = tuple(sorted(arm))
        return seeds, np.array([arm[s] for s in seeds])
    p = sr.pair_by_seed(arm, ref, name=f"claim {claim.claim!r} ({claim.arm} vs {claim.ref})")
    d = {"higher": p.arm - claim.times * p.ref, "lower": p.ref - p.arm, "faster": p.ref / claim.factor - p.arm,
         "match": p.arm - p.ref}[claim.direction]
    return p.seeds, d


def _one_sided_pair(d, lo_mu: float, hi_mu: float, test: str) -> float:
    """p of "``lo_mu`` < mean d < ``hi_mu``" as two one-sided tests (TOST; ``test`` t or wilcoxon)."""
    if test == "t":
        return max(sr.paired_t(d, alternative="greater", mu=lo_mu)[1], sr.paired_t(d, alternative="less", mu=hi_mu)[1])
    return max(sr.wilcoxon_signed_rank(d - lo_mu, alternative="greater")[1],
               sr.wilcoxon_signed_rank(d - hi_mu, alternative="less")[1])


def _side(values: Sequence[float], start: float | None, rule: sr.Regimes | None) -> dict[str, Any]:
    x = np.asarray(values, dtype=float)
    out: dict[str, Any] = {"values": [float(v) for v in x], "mean": float(x.mean()) if x.size else math.nan,
                           "sd": float(x.std(ddof=1)) if x.size > 1 else math.nan}
    if rule is not None:
        out["regimes"] = sr.regime_counts(x, start, rule)
    return out


def analyse(claim: Claim, arm: Mapping[int, float], ref: Mapping[int, float], *,
            start: float | None = None) -> dict[str, Any]:
    """The statistics of ``claim`` from per-seed values (no verdict yet: that needs the Holm family).

    Returns a JSON-ready dict: ``n``, ``seeds``, ``arm_stats`` / ``ref_stats`` (values, mean, sd, regime counts),
    ``d`` (mean, sd, BCa bootstrap interval), ``p_t``, ``p_wilcoxon``, ``p`` (of the primary test,
    unadjusted), the one-sided bounds used to refute, ``power`` at ``effect`` and ``mde80`` (the effect
    the test detects with 80 % power; for ``match`` the margin TOST shows with 80 % power); or
    ``untestable`` with the reason.

    Raises:
        UnpairedSeedsError: see :func:`differences`.
    """
    rule = claim.regime_rule()
    start = claim.start if claim.start is not None else start
    out: dict[str, Any] = {"arm_stats": _side(list(arm.values()), start, rule),
                           "ref_stats": _side(list(ref.values()), start, rule), "start": start}
    if claim.untestable:
        return {**out, "n": 0, "untestable": claim.untestable}
    seeds, d = differences(claim, arm, ref)
    out.update(n=len(seeds), seeds=list(seeds))
    if len(seeds) < 2:
        where = claim.compare if claim.direction == "band" or not claim.ref_compare else \
            f"{claim.compare} / {claim.ref_compare}"
        return {**out, "untestable": f"{len(seeds)} paired seed(s) with `{claim.metric}` in {where}; a test needs 2"}
    a = 1 - claim.alpha
    lo_b, hi_b, how = sr.bootstrap_mean_ci(d, level=a)
    sd = float(d.std(ddof=1))
    out["d"] = {"mean": float(d.mean()), "sd": sd, "boot_ci": [lo_b, hi_b], "boot_method": how}
    if claim.direction == "band":
        out["p_t"] = _one_sided_pair(d, claim.lo, claim.hi, "t")
        out["p_wilcoxon"] = _one_sided_pair(d, claim.lo, claim.hi, "wilcoxon")
    elif claim.direction == "match":
        out["p_t"] = _one_sided_pair(d, -claim.margin, claim.margin, "t")
        out["p_wilcoxon"] = _one_sided_pair(d, -claim.margin, claim.margin, "wilcoxon")
    else:
        out["p_t"] = sr.paired_t(d)[1]
        out["p_wilcoxon"] = sr.wilcoxon_signed_rank(d)[1]
    out["p"] = out["p_t"] if claim.test == "t" else out["p_wilcoxon"]
    if claim.rule_version == "v4":
        lo, hi = (-claim.margin, claim.margin) if claim.direction == "match" else (claim.lo or 0.0, claim.hi or 0.0)
        out.update(v4_stats(claim.direction, d, effect=claim.effect, lo=lo, hi=hi, alpha=claim.alpha,
                            test=claim.test))
    two = 1 - claim.alpha / 2
    out["bounds"] = {"upper": sr.t_bound(d, level=a), "two_sided": [sr.t_bound(d, level=two, side="lower"),
                                                                     sr.t_bound(d, level=two)]}
    if sd > 0 and claim.direction not in ("band",):
        # match: the margin TOST shows at a true difference of 0 with power >= 2 * 0.9 - 1 = 0.8
        out["mde80"] = sr.min_detectable_effect(sd, len(seeds), alpha=claim.alpha,
                                                power=0.9 if claim.direction == "match" else 0.8)
        size = claim.margin if claim.direction == "match" else claim.effect
        if size is not None:
            pw = sr.paired_t_power(size, sd, len(seeds), alpha=claim.alpha)
            # TOST at a true difference of 0: P(both one-sided tests reject) >= 2 * power_one_sided - 1
            out["power"] = max(0.0, 2 * pw - 1) if claim.direction == "match" else pw
    return out


def decide(claim: Claim, stats: dict[str, Any], p_used: float | None) -> tuple[str, str]:
    """``(verdict, rule text)`` of ``claim`` from :func:`analyse`'s ``stats`` and the p-value it is judged
    on (``p_used``: Holm-adjusted for a primary claim, the raw ``p`` otherwise). A ``rule: v4`` claim is
    judged by :func:`rlvr.compare.verdict_v4.decide_v4` on the ``p_holm_<side>`` / ``p_<side>`` values in
    ``stats`` instead (``p_used`` unused)."""
    if claim.rule_version == "v4":
        lo, hi = (-claim.margin, claim.margin) if claim.direction == "match" else (claim.lo or 0.0, claim.hi or 0.0)
        return decide_v4(claim.direction, stats, primary=claim.primary and "p_holm_reproduce" in stats,
                         alpha=claim.alpha, effect=claim.effect, lo=lo, hi=hi)
    if "untestable" in stats:
        return "untestable here", str(stats["untestable"])
    p = float(p_used if p_used is not None else stats["p"])
    alpha, test = claim.alpha, {"t": "paired t", "wilcoxon": "Wilcoxon"}[claim.test]
    which = "Holm-adjusted " if claim.primary else ""
    mde = stats.get("mde80")
    mde_txt = "" if mde is None else (f"; TOST shows ± {mde:.3g} with 80 % power" if claim.direction == "match"
                                      else f"; the design detects {mde:.3g} with 80 % power")
    d = claim.direction
    if d in ("match", "band"):
        lo, hi = (-claim.margin, claim.margin) if d == "match" else (claim.lo, claim.hi)
        ci = stats["bounds"]["two_sided"]
        what = f"mean difference within ± {claim.margin:g}" if d == "match" else f"arm mean in [{lo:g}, {hi:g}]"
        if p < alpha:
            return "reproduced", f"TOST ({test}) {which}p = {p:.3g} < {alpha:g}: {what}"
        if ci[0] > hi or ci[1] < lo:
            return "refuted", f"{100 * (1 - alpha):g} % t-interval [{ci[0]:.3g}, {ci[1]:.3g}] outside [{lo:g}, {hi:g}]"
        return "inconclusive", f"TOST ({test}) {which}p = {p:.3g} ≥ {alpha:g}, interval [{ci[0]:.3g}, {ci[1]:.3g}]{mde_txt}"
    if p < alpha:
        return "reproduced", f"one-sided {test} {which}p = {p:.3g} < {alpha:g}"
    bound, eff = stats["bounds"]["upper"], claim.effect if claim.effect is not None else 0.0
    if bound < eff:
        return "refuted", (f"{100 * (1 - alpha):g} % upper bound of the paired difference {bound:.3g} < "
                           f"{eff:g}{mde_txt}")
    return "inconclusive", f"one-sided {test} {which}p = {p:.3g} ≥ {alpha:g}{mde_txt}"


def _start_value(source: str, metric: str) -> float | None:
    """Mean of ``metric`` over the comparison's ``initial`` (untrained policy) row, if it has one."""
    vals = list(seed_values(source, "initial", metric).values())
    return sum(vals) / len(vals) if vals else None


def evaluate(claims: Sequence[Claim]) -> list[dict[str, Any]]:
    """Analyse every claim, Holm-adjust the primary claims' p-values per ``family`` (default: one family) and
    decide each.

    Returns one dict per claim: the claim's fields, :func:`analyse`'s statistics, ``p_holm`` (primary
    claims) and ``verdict`` / ``rule``.

    Raises:
        UnpairedSeedsError: a claim's arm and reference ran on different seeds.
    """
    rows = []
    for c in claims:
        arm = seed_values(c.compare, c.arm, c.metric)
        ref = {} if c.direction == "band" else seed_values(c.ref_compare or c.compare, c.ref, c.metric)
        st = analyse(c, arm, ref, start=_start_value(c.compare, c.metric) if c.regime_rule() else None)
        if c.requires is not None and "untestable" not in st:
            req = list(seed_values(c.compare, c.arm, str(c.requires["metric"])).values())
            mean = sum(req) / len(req) if req else math.nan
            if not mean >= float(c.requires["min"]):
                st["untestable"] = (f"precondition `{c.requires['metric']}` ≥ {c.requires['min']:g} not met "
                                    f"(arm mean {mean:.3g})")
        rows.append(st)
    tested = [i for i, (c, st) in enumerate(zip(claims, rows)) if c.primary and "p" in st and "untestable" not in st]
    for name in dict.fromkeys(claims[i].family for i in tested):
        fam = [i for i in tested if claims[i].family == name]
        v3 = [i for i in fam if claims[i].rule_version == "v3"]
        for i, p in zip(v3, sr.holm([rows[i]["p"] for i in v3])):
            rows[i]["p_holm"] = p
        holm_sides(rows, [i for i in fam if claims[i].rule_version == "v4"])
    out = []
    for c, st in zip(claims, rows):
        v, rule = decide(c, st, st.get("p_holm"))
        out.append({**c.__dict__, **st, "verdict": v, "rule": rule})
    return out


@dataclass
class ClaimsFile:
    """A parsed claims file: ``title``, ``claims`` and ``figures`` (dicts: paper, compare, arms, path,
    optional metrics as ``[[metric, x], ...]``)."""

    title: str
    claims: list[Claim]
    figures: list[dict[str, Any]] = field(default_factory=list)

    @staticmethod
    def load(path: str | Path) -> "ClaimsFile":
        """Read a claims YAML.

        Raises:
            ConfigError: unknown keys, a claim missing a field, a bad direction (names the claim).
        """
        import yaml

        d = yaml.safe_load(Path(path).read_text()) or {}
        bad = set(d) - {"title", "claims", "figures", "rule"}
        if bad:
            raise ConfigError(f"{path}: unknown keys {sorted(bad)}; valid: title, claims, figures, rule")
        rule = str(d.get("rule", "v4"))
        if rule not in RULES:
            raise ConfigError(f"{path}: rule must be one of {', '.join(RULES)} (the verdict rule), got {rule!r}")
        claims = []
        for i, c in enumerate(d.get("claims") or []):
            try:
                claims.append(Claim(**{"rule_version": rule, **c}))
            except TypeError as exc:
                raise ConfigError(f"{path}: claim {i} ({c.get('claim', '?')!r}): {exc}") from None
        return ClaimsFile(str(d.get("title", "Claims")), claims, list(d.get("figures") or []))


def _g(x: Any, nd: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{nd}f}"


def _side_cell(name: str, side: dict[str, Any], nd: int) -> str:
    if not side["values"]:
        return f"{name}: –"
    sd = f" ± {_g(side['sd'], nd)}" if math.isfinite(side["sd"]) else ""
    reg = f"; {side['regimes']['text']}" if "regimes" in side else ""
    return f"{name}: {_g(side['mean'], nd)}{sd} (n={len(side['values'])}{reg})"


def claim_row(r: dict[str, Any]) -> str:
    """One Markdown table row of an :func:`evaluate` result (columns of :data:`TABLE_HEAD`)."""
    nd = 1 if r["metric"] in ("wall_s", "tokens", "rollouts") else 3
    claim = ("**[primary]** " if r["primary"] else "") + r["claim"]
    ref = "–" if r["direction"] == "band" else _side_cell(r["ref"], r["ref_stats"], nd)
    d = r.get("d")
    diff = "–" if d is None else f"{_g(d['mean'], nd)} [{_g(d['boot_ci'][0], nd)}, {_g(d['boot_ci'][1], nd)}]"
    holm_txt = (f"; Holm {_g(r['p_holm'])}" if "p_holm" in r else
                f"; Holm >e {_g(r['p_holm_reproduce'])}, <e {_g(r['p_holm_refute'])}" if "p_holm_reproduce" in r else "")
    ps = "–" if "p_t" not in r else f"{_g(r['p_t'])} / {_g(r['p_wilcoxon'])}{holm_txt}"
    pw = ("–" if "mde80" not in r else
          (f"{_g(r['power'], 2)} at {_g(r['margin'] if r['direction'] == 'match' else r['effect'], nd)}; "
           if "power" in r else "") + f"MDE {_g(r['mde80'], nd)}")
    word = (f"**{r['verdict']}**" if r["verdict"] in ("reproduced", "refuted", "positive, below effect of interest")
            else r["verdict"])
    return (f"| {r['paper']} | {claim} | `{r['metric']}` | {_side_cell(r['arm'], r['arm_stats'], nd)} | {ref} "
            f"| {diff} | {ps} | {pw} | {word} ({r['rule']}) |")


TABLE_HEAD = ["| paper | claim | metric | arm: mean ± sd (seeds; regimes) | reference: mean ± sd | paired difference: "
              "mean [95 % BCa] | p: paired t / Wilcoxon (one-sided; TOST for match/band) | power at effect; MDE (80 %; "
              "match: margin TOST shows) "
              "| verdict |", "|---|---|---|---|---|---|---|---|---|"]
"""Header of the claims table (:func:`claim_row` fills the rows)."""

DEFAULT_FIGURE_METRICS = [("eval/pass@1", "rollouts"), ("eval/pass@1", "step"), ("eval/pass@1", "wall_s"),
                          ("actor/entropy", "step"), ("actor/grad_norm", "step"), ("reward/mean", "rollouts")]


def _figures(cf: ClaimsFile) -> list[str]:
    from rlvr.compare.report import plot_curves

    lines = []
    for f in cf.figures:
        metrics = [tuple(m) for m in f.get("metrics", DEFAULT_FIGURE_METRICS)]
        seeds = sorted({int(d.name[4:]) for a in f["arms"] for d in (Path(f["compare"]) / a).glob("seed*")
                        if d.name[4:].isdigit()})
        p = plot_curves(Path(f["compare"]), f["arms"], seeds, metrics=metrics, path=Path(f["path"]),
                        title=f"{f['paper']}: mean over seeds, band = min–max", window=int(f.get("window", 1)))
        if p is not None:
            lines += [f"![{f['paper']}]({Path(f['path']).name})", ""]
    return lines


def write_claims(cf: ClaimsFile, out_md: str | Path) -> Path:
    """Evaluate every claim (:func:`evaluate`), write the Markdown table to ``out_md`` and JSON next to
    it (same stem), and draw the figures (:func:`rlvr.compare.report.plot_curves`). Returns ``out_md``.

    Raises:
        UnpairedSeedsError: a claim's arm and reference ran on different seeds (nothing is written).
    """
    out_md = Path(out_md)
    results = evaluate(cf.claims)
    lines = [f"### {cf.title}", "", *TABLE_HEAD, *(claim_row(r) for r in results), "", *_figures(cf)]
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text("\n".join(lines))
    out_md.with_suffix(".json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    return out_md


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m rlvr.compare.claims CLAIMS.yaml --out docs/results/replication_claims.md``.

    A bad claims file or unpaired seeds print the error and exit with code 2 (nothing is written)."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("claims")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        print(f"wrote {write_claims(ClaimsFile.load(args.claims), args.out)}")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None


if __name__ == "__main__":
    main()

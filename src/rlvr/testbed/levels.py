"""The level table of a testbed policy before RL (issue 17 §2): pass@1 / pass@k per level and the
feedback rescue rate.

For each level, ``prompts`` held-out problems get ``samples`` completions at each temperature;
pass@k is the unbiased estimator (:func:`rlvr.core.pass_at_k.pass_at_k`) from those samples. With
``fap=True`` the *rescue rate* is measured too: for every prompt whose first ``group`` samples at
T = 1 all fail (an all-fail GRPO group), one failed attempt and its verifier feedback are put into
the feedback-augmented prompt :data:`rlvr.testbed.mixture.FAP_TEMPLATE` (what FBOS-RL samples from
with ``fbos.fap_template`` set to it), ``rescue_samples`` completions are drawn at T = 1, and the
fraction that is correct is the rescue rate (``rescue/any``: fraction of those prompts with ≥ 1
correct rescue sample). On those all-fail prompts, ``all_fail/pass@k@T`` is pass@k at each temperature
from the samples after the first ``group`` (the selecting samples are left out, so the first
temperature's value is not biased down by the selection; :func:`all_fail_pass_at_k`).

``python -m rlvr.testbed.levels --model testbed:v2l --steps 2 --levels 7 --temperatures 1.0,1.1 --k 1,20
--samples 28 --no-fap`` is UEC-RL's pre-check (pass@20 at t′ = 1.0 vs 1.1 on all-fail prompts).

``python -m rlvr.testbed.levels --model testbed:v2 --steps 2 --out docs`` writes
``testbed_v2_levels.json`` and ``testbed_v2_levels.png``.

Source: interpretation of issue 17 §2 ("document each level's pass@1 / pass@k before RL (a table
and a plot)"; "a feedback-augmented prompt can rescue an all-fail prompt with a measurable, tunable
probability").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence


def level_table(model: Any, tok: Any, levels: Sequence[int], *, steps: int = 1, ops: str = "RC", prompts: int = 32,
                samples: int = 64, temperatures: Sequence[float] = (1.0, 1.2), ks: Sequence[int] = (1, 8, 64),
                fap: bool = False, group: int = 8, rescue_samples: int = 8, seed: int = 0) -> list[dict[str, float]]:
    """Pass rates of ``model`` per level (see the module docstring).

    Returns:
        one dict per level: ``level``, ``steps``, ``pass@k@T`` for each k ≤ ``samples`` and temperature
        (e.g. ``pass@64@T1.2``), ``all_fail@G`` (fraction of prompts whose first ``group`` T = 1 samples
        all fail) and, with ``fap``, ``rescue/rate``, ``rescue/any`` and ``rescue/prompts`` (NaN
        when no prompt was all-fail).

    Raises:
        ValueError: a k larger than ``samples`` or ``group`` larger than ``samples``.
    """
    from rlvr.core.pass_at_k import pass_at_k
    from rlvr.engines.hf import HFEngine
    from rlvr.variants.fbos_rl.fap import build_fap_text
    from rlvr.samplers.group import PromptEncoder
    from rlvr.tasks.prompts import render_prompt
    from rlvr.testbed.mixture import FAP_TEMPLATE
    from rlvr.testbed.task import TestbedTask
    from rlvr.types import GenerationRequest, SamplingParams

    if not temperatures or any(not t > 0 for t in temperatures):
        raise ValueError(f"level_table: temperatures must be > 0 (at least one), got {list(temperatures)}")
    if any(k > samples for k in ks) or group > samples:
        raise ValueError(f"level_table: every k ({list(ks)}) and group={group} must be ≤ samples={samples}")
    engine = HFEngine(model, tok)
    enc = PromptEncoder(tok, "", 256)
    out = []
    for lv in levels:
        task = TestbedTask(min_level=lv, max_level=lv, ops=ops, steps=steps, train_size=1, eval_size=prompts, seed=seed,
                           eval_seed=seed + 10_000, feedback="position")
        probs = task.problems("eval")
        cap = (lv + 1) * steps + 2
        row: dict[str, float] = {"level": lv, "steps": steps}
        first: list[list[tuple[str, bool, str | None]]] = []
        correct_at: list[list[list[bool]]] = []  # [temperature][prompt][sample]
        for T in temperatures:
            gens = engine.generate([GenerationRequest(enc(p), n=samples) for p in probs],
                                   SamplingParams(temperature=T, max_new_tokens=cap, seed=seed + lv))
            verdicts = []
            for p, gs in zip(probs, gens):
                texts = [tok.decode(g.token_ids, skip_special_tokens=True) for g in gs]
                vs = [task.verify(p, t) for t in texts]
                verdicts.append([(t, v.correct, v.feedback) for t, v in zip(texts, vs)])
            for k in ks:
                row[f"pass@{k}@T{T:g}"] = sum(pass_at_k(samples, sum(c for _, c, _ in v), k) for v in verdicts) / len(probs)
            if T == temperatures[0]:
                first = verdicts
            correct_at.append([[c for _, c, _ in v] for v in verdicts])
        all_fail = [i for i, v in enumerate(first) if not any(c for _, c, _ in v[:group])]
        row[f"all_fail@{group}"] = len(all_fail) / len(probs)
        row.update(all_fail_pass_at_k(correct_at, temperatures, group, ks))
        if fap:
            reqs = []
            for i in all_fail:
                text, _, fb = first[i][0]
                fap_text = build_fap_text(probs[i].question, text, fb, FAP_TEMPLATE)
                ids = tok(render_prompt(tok, [{"role": "user", "content": fap_text}]), add_special_tokens=False)["input_ids"]
                reqs.append(GenerationRequest(ids, n=rescue_samples))
            if reqs:
                gens = engine.generate(reqs, SamplingParams(temperature=1.0, max_new_tokens=cap, seed=seed + 7 * lv))
                ok = [[task.verify(probs[i], tok.decode(g.token_ids, skip_special_tokens=True)).correct for g in gs]
                      for i, gs in zip(all_fail, gens)]
                row["rescue/rate"] = sum(map(sum, ok)) / (len(ok) * rescue_samples)
                row["rescue/any"] = sum(any(o) for o in ok) / len(ok)
            else:
                row["rescue/rate"] = row["rescue/any"] = float("nan")
            row["rescue/prompts"] = len(all_fail)
        out.append(row)
    return out


def all_fail_pass_at_k(correct: Sequence[Sequence[Sequence[bool]]], temperatures: Sequence[float], group: int,
                       ks: Sequence[int]) -> dict[str, float]:
    """pass@k at each temperature on the all-fail prompts, from the samples after the first ``group``.

    Args:
        correct: ``[len(temperatures)][prompts][samples]`` verdicts; a prompt is all-fail when its first
            ``group`` samples at ``temperatures[0]`` are all wrong.
        temperatures: the temperatures of ``correct``'s first axis. group: the selecting sample count.
        ks: the k's; only those ``≤ samples − group`` are reported.

    Returns:
        ``{"all_fail/pass@k@T<T>": mean unbiased pass@k over the all-fail prompts, from their
        ``samples − group`` later samples}`` (NaN when no prompt is all-fail), plus
        ``all_fail/prompts``; ``{}`` when ``samples ≤ group``.

    Source: interpretation of the issue-29 pre-registration (UEC-RL pre-check): the first ``group``
    samples choose the prompts, so they are left out of the rate they would bias.
    """
    from rlvr.core.pass_at_k import pass_at_k

    n = len(correct[0][0]) - group if correct and correct[0] else 0
    if n <= 0:
        return {}
    idx = [i for i, v in enumerate(correct[0]) if not any(v[:group])]
    out: dict[str, float] = {"all_fail/prompts": float(len(idx))}
    for T, per_prompt in zip(temperatures, correct):
        for k in (k for k in ks if k <= n):
            vals = [pass_at_k(n, sum(per_prompt[i][group:]), k) for i in idx]
            out[f"all_fail/pass@{k}@T{T:g}"] = sum(vals) / len(vals) if vals else float("nan")
    return out


def plot_level_table(rows: list[dict[str, float]], path: str | Path, *, title: str = "") -> Path:
    """One PNG: pass@k curves per level (one line per k and temperature) and the rescue rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in rows[0] if k.startswith("pass@")]
    by_steps = sorted({int(r["steps"]) for r in rows})
    fig, axes = plt.subplots(1, len(by_steps), figsize=(5.2 * len(by_steps), 3.6), squeeze=False)
    for ax, st in zip(axes.flat, by_steps):
        rs = [r for r in rows if int(r["steps"]) == st]
        lv = [r["level"] for r in rs]
        for j, k in enumerate(keys):
            ax.plot(lv, [r[k] for r in rs], "o-" if k.endswith("@T1") else "s--", color=f"C{j % 10}", label=k, lw=1.4)
        if "rescue/rate" in rs[0]:
            ax.plot(lv, [r["rescue/rate"] for r in rs], "k^:", label="FAP rescue rate (all-fail prompts)")
        ax.set_xlabel("level (string length)")
        ax.set_title(f"{st}-step answers", fontsize=10)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def markdown_table(rows: list[dict[str, float]]) -> str:
    """The rows as a Markdown table (3 decimals; rescue columns when present)."""
    keys = [k for k in rows[0] if k not in ("level", "steps")]
    lines = ["| steps | level | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 2)]
    for r in rows:
        cells = [f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k]) for k in keys]
        lines.append(f"| {int(r['steps'])} | {int(r['level'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m rlvr.testbed.levels --model testbed:v2 --steps 1,2,3 --levels 2,4,6,8,9,10 --out docs``."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--model", default="testbed:v2")
    ap.add_argument("--steps", default="1,2")
    ap.add_argument("--levels", default="2,4,6,7,8,9,10")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--temperatures", default="1.0,1.2", help="comma-separated sampling temperatures (> 0)")
    ap.add_argument("--k", default="1,8,64", help="comma-separated k's of pass@k (each ≤ --samples)")
    ap.add_argument("--group", type=int, default=8, help="samples at the first temperature that decide all-fail")
    ap.add_argument("--no-fap", action="store_true")
    ap.add_argument("--out", default="docs")
    ap.add_argument("--name", default="testbed_v2_levels")
    args = ap.parse_args(argv)
    try:
        temps = [float(x) for x in args.temperatures.split(",")]
        ks = [int(x) for x in args.k.split(",")]
    except ValueError:
        ap.error(f"--temperatures and --k must be comma-separated numbers, got {args.temperatures!r}, {args.k!r}")
    if any(not t > 0 for t in temps) or any(k < 1 or k > args.samples for k in ks) or not 1 <= args.group <= args.samples:
        ap.error(f"need temperatures > 0, 1 ≤ k ≤ --samples={args.samples} and 1 ≤ --group ≤ --samples "
                 f"(got {temps}, {ks}, {args.group})")
    import torch

    import rlvr.testbed  # noqa: F401 (registers the testbed model source)
    from rlvr.config import ModelConfig
    from rlvr.models import load_policy

    torch.manual_seed(0)
    model, tok = load_policy(ModelConfig(name_or_path=args.model))
    rows = []
    for st in (int(x) for x in args.steps.split(",")):
        rows += level_table(model, tok, [int(x) for x in args.levels.split(",")], steps=st, prompts=args.prompts,
                            samples=args.samples, temperatures=temps, ks=ks, group=args.group, fap=not args.no_fap)
        print(markdown_table(rows), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {plot_level_table(rows, out / f'{args.name}.png', title=f'{args.model} before RL')}")


if __name__ == "__main__":
    main()

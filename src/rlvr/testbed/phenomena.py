"""Measurements that show the testbed exhibits what the variants target (``docs/testbed.md``).

* :func:`level_sweep`: pass rate and zero-pass-group fraction of a policy per difficulty level
  (levels above the pre-training range give all-zero groups: GRPO gets no signal there).
* :func:`plot_phenomena`: PNGs from a level sweep and from ``rlvr compare`` runs (entropy, reward
  and ratio curves of fresh vs very stale rollouts, zero-std groups at a hard level).

Source: interpretation of issue 8 ("it must exhibit the phenomena the variants target: prompts
that stall GRPO (zero-pass groups), entropy collapse, and instability under very stale rollouts").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence


def level_sweep(model: Any, tok: Any, levels: Sequence[int], *, prompts: int = 32, num_generations: int = 8,
                ops: str = "RC", temperature: float = 1.0, seed: int = 0) -> list[dict[str, float]]:
    """Sample ``num_generations`` completions for ``prompts`` held-out problems at each level.

    Returns:
        one dict per level: ``level``, ``pass_rate`` (fraction of correct completions),
        ``zero_pass_groups`` (fraction of prompts with no correct completion), ``pass@G``.
    """
    from rlvr.rewards import Scorer
    from rlvr.samplers.group import GroupSampler, PromptEncoder
    from rlvr.engines.hf import HFEngine
    from rlvr.testbed.task import TestbedTask
    from rlvr.types import SamplingParams

    engine = HFEngine(model, tok)
    out = []
    for lv in levels:
        task = TestbedTask(min_level=lv, max_level=lv, ops=ops, train_size=1, eval_size=prompts, seed=seed,
                           eval_seed=seed + 10_000)
        probs = task.problems("eval")
        sampler = GroupSampler(engine, PromptEncoder(tok, "", 64), tok.pad_token_id)
        batch = sampler.sample(probs, num_generations, SamplingParams(temperature=temperature, max_new_tokens=lv + 3,
                                                                      seed=seed + lv), first_group_id=0)
        Scorer(task, tok).score(batch)
        c = batch.correct.view(len(probs), num_generations).float()
        out.append({"level": lv, "pass_rate": float(c.mean()), "zero_pass_groups": float((c.sum(1) == 0).float().mean()),
                    f"pass@{num_generations}": float((c.sum(1) > 0).float().mean())})
    return out


def _curve(run_dir: Path) -> list[dict[str, Any]]:
    """Rows of a run's ``curve.jsonl`` (as written by ``rlvr compare``)."""
    from rlvr.eval.plot import read_jsonl_rows

    return read_jsonl_rows(Path(run_dir) / "curve.jsonl")


def plot_phenomena(sweep: list[dict[str, float]] | None, compare_dir: str | Path | None, out_dir: str | Path,
                   *, pretrain_max_level: int = 8) -> list[Path]:
    """Write ``testbed_levels.png`` (from ``sweep``) and, from runs under ``compare_dir``,
    ``testbed_entropy.png``, ``testbed_stale.png`` and ``testbed_zero_pass.png``. Runs are found by
    arm name: ``fresh`` (μ = 1), names starting ``stale`` (very stale rollouts) and ``hard``
    (levels above pre-training). Returns the PNGs written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlvr.eval.plot import smooth

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    if sweep:
        fig, ax = plt.subplots(figsize=(6, 3.4))
        lv = [r["level"] for r in sweep]
        ax.plot(lv, [r["pass_rate"] for r in sweep], "o-", label="pass rate (T = 1)")
        ax.plot(lv, [r["zero_pass_groups"] for r in sweep], "s--", label="zero-pass groups (G = 8)")
        ax.axvline(pretrain_max_level + 0.5, color="gray", ls=":", label="longest pre-training level")
        ax.set_xlabel("level (string length)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("pre-trained testbed policy: difficulty levels")
        fig.tight_layout()
        p = out_dir / "testbed_levels.png"
        fig.savefig(p, dpi=100)
        plt.close(fig)
        written.append(p)
    if compare_dir is None:
        return written
    root = Path(compare_dir)
    runs = {d.parent.name + ("" if d.name == "seed0" else f"/{d.name}"): _curve(d) for d in sorted(root.glob("*/seed*"))}
    runs = {k: v for k, v in runs.items() if v}

    def panel(ax, names, key, title, window=5):
        for n in names:
            pts = [(r["step"], r[key]) for r in runs[n] if key in r]
            if pts:
                ax.plot([p[0] for p in pts], smooth([p[1] for p in pts], window), label=n, lw=1.6)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)

    groups = [
        ("testbed_entropy.png", [n for n in runs if not n.startswith("hard")],
         [("actor/entropy", "policy entropy (nats/token)"), ("reward/mean", "training reward")]),
        ("testbed_stale.png", [n for n in runs if n.startswith(("fresh", "stale"))],
         [("reward/mean", "training reward"), ("actor/clip_ratio/region", "fraction of tokens clipped"),
          ("actor/grad_norm", "gradient norm")]),
        ("testbed_zero_pass.png", [n for n in runs if n.startswith(("hard", "fresh"))],
         [("reward/frac_zero_std_groups", "groups with zero reward variance"), ("reward/mean", "training reward")]),
    ]
    for name, names, panels in groups:
        if not names:
            continue
        fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.4), squeeze=False)
        for ax, (key, title) in zip(axes.flat, panels):
            panel(ax, names, key, title)
        fig.tight_layout()
        p = out_dir / name
        fig.savefig(p, dpi=100)
        plt.close(fig)
        written.append(p)
    return written


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m rlvr.testbed.phenomena --compare RUNS --out docs [--model testbed]``: level sweep + plots."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--model", default="testbed")
    ap.add_argument("--compare", help="an rlvr compare folder with fresh/stale*/hard* arms")
    ap.add_argument("--out", default="docs")
    ap.add_argument("--levels", default="2,3,4,5,6,7,8,9,10,11")
    ap.add_argument("--prompts", type=int, default=32)
    args = ap.parse_args(argv)
    from rlvr.config import ModelConfig
    from rlvr.models import load_policy

    model, tok = load_policy(ModelConfig(name_or_path=args.model))
    sweep = level_sweep(model, tok, [int(x) for x in args.levels.split(",")], prompts=args.prompts)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "testbed_levels.json").write_text(json.dumps(sweep, indent=2))
    for p in plot_phenomena(sweep, args.compare, args.out):
        print(f"wrote {p}")


if __name__ == "__main__":
    main()

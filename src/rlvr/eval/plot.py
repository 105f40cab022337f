"""``rlvr plot RUN_DIR``: PNG curves of a run's ``metrics.jsonl``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

DEFAULT_PANELS: tuple[str, ...] = (
    "reward/mean",
    "reward/pass_rate",
    "actor/entropy",
    "actor/grad_norm",
    "completions/mean_length",
    "reward/frac_zero_std_groups",
    "actor/clip_ratio/region",
    "timing/step_s",
)


def read_metrics(run_dir: str | Path) -> list[dict]:
    """Rows of ``RUN_DIR/metrics.jsonl`` (a torn last line from a killed run is skipped).

    Raises:
        FileNotFoundError: the run has no ``metrics.jsonl``.
    """
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run_dir} an rlvr run directory?")
    return read_jsonl_rows(path)


def read_jsonl_rows(path: str | Path) -> list[dict]:
    """JSON objects of a JSONL file written line by line; unparsable lines (a torn last line of a
    killed run) are skipped; a missing file gives ``[]``."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def smooth(ys: Sequence[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` points (``[n] -> [n]``), ignoring None and non-finite
    values (NaN where a window has none)."""
    out, acc = [], []
    for y in ys:
        acc.append(y)
        if len(acc) > window:
            acc.pop(0)
        vals = [a for a in acc if a is not None and math.isfinite(a)]
        out.append(sum(vals) / len(vals) if vals else math.nan)
    return out


def plot_run(run_dir: str | Path, out: str | Path | None = None, panels: Sequence[str] = DEFAULT_PANELS,
             smooth_window: int = 5) -> Path:
    """Plot the chosen metrics against step (raw and a ``smooth_window``-step moving average) into one PNG.

    Returns:
        the PNG path (default ``RUN_DIR/curves.png``).

    Raises:
        FileNotFoundError: no ``metrics.jsonl`` (see :func:`read_metrics`).
        DataError: it holds no step, or none of ``panels`` (exit 2 in the CLI).
    """
    panels_asked = list(panels)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlvr.errors import DataError

    rows = [r for r in read_metrics(run_dir) if isinstance(r, dict)]
    if not rows:  # a run stopped before its first step, or a file that is not rlvr's
        raise DataError(f"rlvr plot {run_dir}: metrics.jsonl holds no step yet (the run logged nothing to plot)")
    panels = [p for p in panels if any(p in r and r[p] is not None for r in rows)]
    if not panels:
        raise DataError(f"rlvr plot {run_dir}: metrics.jsonl has none of the metrics to plot ({', '.join(panels_asked)})")
    cols = 2
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(11, 2.8 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, panels):
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        xs, ys = [p[0] for p in pts], [float(p[1]) for p in pts]
        ax.plot(xs, ys, alpha=0.35, lw=1, label="raw")
        if len(ys) >= smooth_window:
            ax.plot(xs, smooth(ys, smooth_window), lw=2, label=f"mean of {smooth_window}")
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(str(Path(run_dir).name))
    fig.tight_layout()
    path = Path(out) if out else Path(run_dir) / "curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

"""Paired A/B of the training update (forward + backward of every micro-batch) against an earlier revision.

Loads ``rlvr/trainer/forward.py`` and ``rlvr/core/logprobs.py`` of ``--baseline`` (a git revision, default
``ab66cf0``) next to the working tree's, then runs the same saved batch (``profile_step.py --part gen``
writes one) through both, micro-batch by micro-batch, alternating which goes first, in one process: on a
machine shared with other jobs a paired comparison is the only fair one (both arms see the same load). Reports
seconds per arm, the ratio, the largest log-prob difference and the relative gradient difference
(:func:`rel_diff`; 0 for a micro-batch whose advantages are all 0 — one zero-variance group at G = 8 —
where both gradients are exactly zero, which an earlier version printed as NaN from 0/0).

    flock /tmp/rlvr-heavy.lock env PYTHONPATH=$PWD/src .venv/bin/python benchmarks/bench_update_ab.py \\
        --batch /tmp/speed/batch.pt --out benchmarks/results/bench_update_ab.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
ROOT = Path(__file__).resolve().parent.parent


def _baseline_forward(rev: str):
    """The baseline's ``forward`` module, importing the baseline's ``logprobs`` (both from ``git show``)."""
    tmp = Path(tempfile.mkdtemp(prefix="rlvr_ab_"))
    for src, name in (("src/rlvr/core/logprobs.py", "ab_logprobs"), ("src/rlvr/trainer/forward.py", "ab_forward")):
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{src}"], check=True, capture_output=True,
                              text=True).stdout
        text = text.replace("from rlvr.core.logprobs import", "from ab_logprobs import")
        (tmp / f"{name}.py").write_text(text)
    sys.path.insert(0, str(tmp))
    spec = importlib.util.spec_from_file_location("ab_forward", tmp / "ab_forward.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rel_diff(ref: torch.Tensor, other: torch.Tensor) -> float:
    """``‖ref − other‖ / ‖ref‖`` of two flat tensors (float64).

    Both exactly equal (in particular both zero: the gradient of a micro-batch whose advantages are all
    0) gives 0.0, not the 0/0 = NaN of the bare quotient; ``ref`` zero and ``other`` not gives ``inf``.
    """
    ref, other = ref.double(), other.double()
    num, den = float((ref - other).norm()), float(ref.norm())
    if num == 0.0:
        return 0.0
    return num / den if den > 0 else float("inf")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", default="/tmp/rlvr_profile_batch.pt")
    p.add_argument("--baseline", default="ab66cf0")
    p.add_argument("--model", default="default")
    p.add_argument("--micro", type=int, default=0, help="first N micro-batches only (0: all)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    from profile_step import _load_batch

    from rlvr.config import ModelConfig
    from rlvr.models import load_policy
    from rlvr.trainer import forward as new

    old = _baseline_forward(a.baseline)
    batch = _load_batch(a.batch)
    model, tok = load_policy(ModelConfig(name_or_path=a.model))
    model.train()
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    groups = new.micro_batches(batch, 8)[: a.micro or None]
    res = {"baseline": a.baseline, "loadavg_start": os.getloadavg(), "pairs": []}
    print(f"{time.strftime('%H:%M:%S', time.gmtime())} UTC loadavg {os.getloadavg()}", flush=True)

    def run(mod, micro):
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        lp, _ = mod.completion_logprobs(model, micro, pad_token_id=pad, with_entropy=True)
        t1 = time.perf_counter()
        (-(lp * micro.advantages[:, None]).sum()).backward()
        t2 = time.perf_counter()
        g = torch.cat([q.grad.flatten() for q in model.parameters() if q.grad is not None])
        return t1 - t, t2 - t1, lp.detach(), g

    tot = {"old": 0.0, "new": 0.0}
    for j, rows in enumerate(groups):
        micro = batch.select(rows)
        order = [("old", old), ("new", new)] if j % 2 == 0 else [("new", new), ("old", old)]
        r = {}
        for name, mod in order:
            r[name] = run(mod, micro)
        dlp = float((r["old"][2] - r["new"][2]).abs().max())
        go, gn = r["old"][3].double(), r["new"][3].double()
        finite = {k: bool(torch.isfinite(r[k][3]).all()) for k in r}
        dg = rel_diff(go, gn) if all(finite.values()) else float("nan")
        pair = {k: {"forward_s": r[k][0], "backward_s": r[k][1]} for k in r}
        pair.update(max_abs_logp_diff=dlp, rel_grad_diff=dg, grad_norm=float(go.norm()), grads_finite=finite,
                    completion_tokens=int(micro.completion_mask.sum()), loadavg=os.getloadavg())
        res["pairs"].append(pair)
        for k in tot:
            tot[k] += r[k][0] + r[k][1]
        print(json.dumps(pair), flush=True)
        res.update(total_s=dict(tot), new_over_old=tot["new"] / tot["old"])
        if a.out:
            Path(a.out).write_text(json.dumps(res, indent=2))
    res["loadavg_end"] = os.getloadavg()
    print(f"update (fwd+bwd over {len(groups)} micro-batches): baseline {tot['old']:.1f} s, this tree "
          f"{tot['new']:.1f} s, ratio {tot['new'] / tot['old']:.3f}; loadavg {os.getloadavg()}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Why μ-GRPO's veto never fires on the testbed: the token ratios split by the sign of the advantage.

The veto (``docs/mu_grpo.md`` §2.3) acts only on tokens of *negative-advantage* responses whose ratio
``ρ = π_θ / π_behav`` fell below ``δ = 1e-4``. The logged ``actor/ratio/min`` is over every loss token,
including the zero-advantage rows of zero-variance groups (no gradient of their own, free to drift).
This probe reruns one μ-GRPO configuration of ``docs/results/replication/diag_mu_ib.yaml`` (same
config, same seed, so the same run up to thread-count nondeterminism) with an extra, passive mask
hook that records, per optimizer update, ``min ρ`` and ``max ρ`` over tokens with ``A < 0``, ``A = 0``
and ``A > 0``, and how many ``A < 0`` tokens are below ``δ`` (= veto triggers).

Run (~15 s of CPU per run; heavy lock)::

    flock /tmp/rlvr-heavy.lock env PYTHONPATH=src HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/veto_probe.py \\
        --seeds 0,1,2 --out benchmarks/results/veto_probe.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


class RatioBySign:
    """Passive mask hook (always all ones, ``denominator="keep"``) that records ratio extremes by advantage sign.

    ``records[-1]`` after each update's micro-batches: ``{"neg_min", "neg_max", "zero_min", "zero_max",
    "pos_min", "pos_max", "neg_below_delta", "neg_tokens", "zero_tokens", "pos_tokens"}``.
    """

    denominator = "keep"

    def __init__(self, delta: float = 1e-4) -> None:
        self.delta = delta
        self.records: list[dict[str, float]] = []
        self.current: dict[str, float] | None = None

    def new_update(self) -> None:
        self.current = {"neg_min": math.inf, "neg_max": -math.inf, "zero_min": math.inf, "zero_max": -math.inf,
                        "pos_min": math.inf, "pos_max": -math.inf, "neg_below_delta": 0, "neg_tokens": 0,
                        "zero_tokens": 0, "pos_tokens": 0}
        self.records.append(self.current)

    def __call__(self, micro, logp, old_logp):
        if self.current is None:
            self.new_update()
        M = micro.completion_mask > 0
        lr = torch.zeros_like(logp) if old_logp is None else (logp.detach() - old_logp.detach())
        A = micro.advantages
        A = A[:, None].expand_as(lr) if A.dim() == 1 else A
        c = self.current
        for name, sel in (("neg", M & (A < 0)), ("zero", M & (A == 0)), ("pos", M & (A > 0))):
            if sel.any():
                c[f"{name}_min"] = min(c[f"{name}_min"], float(lr[sel].exp().min()))
                c[f"{name}_max"] = max(c[f"{name}_max"], float(lr[sel].exp().max()))
            c[f"{name}_tokens"] += int(sel.sum())
        c["neg_below_delta"] += int((M & (A < 0) & (lr < math.log(self.delta))).sum())
        return torch.ones_like(logp), {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--lr", default="3e-4")
    ap.add_argument("--max-steps", type=int, default=64)
    ap.add_argument("--out", default="benchmarks/results/veto_probe.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    import rlvr.testbed  # noqa: F401
    from rlvr.config import build_config
    from rlvr.models import load_policy
    from rlvr.tasks import build_task
    from rlvr.trainer.components import validate_components
    from rlvr.trainer.trainer import Trainer

    result: dict[str, list] = {}
    for seed in [int(s) for s in args.seeds.split(",")]:
        tmp = tempfile.mkdtemp(prefix="veto_probe_")
        cfg = build_config(["mu_grpo_small", "testbed"], [
            "generation_batch_size=256", f"learning_rate={args.lr}", "logging.progress=false",
            f"logging.output_dir={tmp}", f"seed={seed}", f"max_steps={args.max_steps}"])
        validate_components(cfg)
        model, tok = load_policy(cfg.model)
        probe = RatioBySign(cfg.mu_grpo.veto_ratio_threshold)
        tr = Trainer(cfg, model, tok, build_task(cfg.task), extra_mask_fns=[probe])
        tr.callbacks.append(lambda t, m: probe.new_update())
        probe.new_update()
        tr.train()
        tr.close()
        recs = [r for r in probe.records if r["neg_tokens"] + r["zero_tokens"] + r["pos_tokens"] > 0]
        result[str(seed)] = recs
        agg = lambda k, f: f(r[k] for r in recs)  # noqa: E731
        print(f"seed {seed}: {len(recs)} updates; min ratio A<0 {agg('neg_min', min):.2e}, A=0 {agg('zero_min', min):.2e}, "
              f"A>0 {agg('pos_min', min):.2e}; max ratio A<0 {agg('neg_max', max):.2f}, A=0 {agg('zero_max', max):.2f}, "
              f"A>0 {agg('pos_max', max):.2f}; A<0 tokens below δ: {agg('neg_below_delta', sum)} of {agg('neg_tokens', sum)}; "
              f"token share A=0: {agg('zero_tokens', sum) / max(1, sum(r['neg_tokens'] + r['zero_tokens'] + r['pos_tokens'] for r in recs)):.2f}",
              file=sys.stderr)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"lr": args.lr, "load_avg": os.getloadavg(), "runs": result}, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

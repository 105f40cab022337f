"""Golden-metric runs: every built-in recipe, seeded, 3 optimizer steps on the tiny in-process model.

The fixture ``golden_metrics.json`` next to this file records, per case, the fully resolved config the
run used and every scalar it logged (``timing/*`` and ``perf/*`` left out: they measure the machine).
``test_golden_metrics.py`` rebuilds each run **from the recorded config** (so a default changed on
another branch cannot move the numbers) and compares to float tolerance.

Regenerate (only when a behaviour change is intended; say why in the commit and in the test)::

    PYTHONPATH=src HF_HUB_OFFLINE=1 python tests/golden/golden_cases.py            # all cases
    PYTHONPATH=src HF_HUB_OFFLINE=1 python tests/golden/golden_cases.py dapo ib_tpo  # some

Besides the eight recipes, three cases turn on reward shaping (overlong penalty, KL in the reward) for
the samplers that used to compute their own advantages (tree, feedback), where the shaping was a
silent no-op before the seam redesign (issue 13).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).with_name("golden_metrics.json")
SKIP_PREFIXES = ("timing/", "perf/")
MAX_STEPS = 3
EOS_BIAS = 4.5  # logit bias of the end-of-sequence token: the random tiny model then stops ~15% per token,
# so completions differ in length (the tree sampler gives truncated leaves reward 0; overlong shaping varies)

TINY = [
    "num_generations=4", "generation_batch_size=8", "per_device_train_batch_size=4",
    "max_completion_length=8", "max_prompt_length=64", f"max_steps={MAX_STEPS}", "learning_rate=1e-3",
    "logging.progress=false", "logging.tensorboard=false", "logging.log_completions_steps=0",
    "reward_timeout_s=0", "seed=0",
]
TREE = [
    "num_generations=8", "generation_batch_size=16",
    "max_completion_length=12", "steps_per_generation=2", "ib_tpo.step_split=fixed",
    "ib_tpo.fixed_step_tokens=3", "ib_tpo.min_remaining_tokens=3", "ib_tpo.token_budget=half_max",
]
FBOS = ["fbos.initial_rollouts=2"]

# case name -> (recipe, extra overrides, task kind)
CASES: dict[str, tuple[str, list[str], str]] = {
    "grpo": ("grpo", [], "toy"),
    "dr_grpo": ("dr_grpo", [], "toy"),
    "dapo": ("dapo", ["overlong_buffer_len=4", "dynamic_sampling.metric=acc",
                      "dynamic_sampling.max_num_gen_batches=4"], "toy"),
    "gspo": ("gspo", ["steps_per_generation=2"], "toy"),
    "mu_grpo_small": ("mu_grpo_small", ["steps_per_generation=2", "max_completion_length=8",
                                        "per_device_train_batch_size=4"], "toy"),
    "uec_rl": ("uec_rl", ["max_completion_length=6", "uec.explore_num_generations=6", "uec.update_size=4",
                          "uec.replay_every=2", "uec.replay_adv_threshold=0.5",
                          "uec.drop_truncated_positive=false", "uec.replay_min_size=1"], "half_hard"),
    "ib_tpo": ("ib_tpo", TREE, "byte_parity"),
    "fbos_rl": ("fbos_rl", FBOS, "toy"),
    # reward shaping on samplers that used to set advantages themselves (issue 13 item 2)
    "ib_tpo_overlong": ("ib_tpo", TREE + ["overlong_buffer_len=6"], "byte_parity"),
    "ib_tpo_kl_in_reward": ("ib_tpo", TREE + ["beta=0.05", "kl_in_reward=true"], "byte_parity"),
    "fbos_rl_kl_in_reward": ("fbos_rl", FBOS + ["beta=0.05", "kl_in_reward=true"], "toy"),
}


def make_task(kind: str) -> Any:
    """The task of a case: ``toy`` (:class:`rlvr.testing.ToyTask`), ``byte_parity`` (passes on an even
    byte sum: leaves of the same length still differ, so tree advantages are not all zero) or
    ``half_hard`` (odd problems never pass, so UEC-RL's exploration path runs)."""
    from rlvr.tasks.base import Verdict
    from rlvr.testing import ToyTask

    if kind == "toy":
        return ToyTask()

    class ByteParity(ToyTask):
        def verify(self, problem, completion):  # noqa: D102
            ok = sum(completion.encode()) % 2 == 0
            return Verdict(score=float(ok), correct=ok, feedback=None if ok else "odd byte sum")

    if kind == "byte_parity":
        return ByteParity()

    class HalfHard(ToyTask):
        def verify(self, problem, completion):  # noqa: D102
            i = int(problem.uid.split("-")[1])
            ok = False if i % 2 else len(completion) % 2 == 0
            return Verdict(score=float(ok), correct=ok)

    return HalfHard()


def resolved_config(name: str) -> dict[str, Any]:
    """The full config of case ``name`` built from its recipe (used when (re)generating)."""
    from rlvr.config import build_config, config_to_dict

    recipe, extra, _ = CASES[name]
    cfg = build_config([recipe], TINY + extra + ["logging.output_dir=unused"])
    d = config_to_dict(cfg)
    d["logging"].pop("output_dir", None)
    return d


def run_config(config: dict[str, Any], task_kind: str, out_dir: Path) -> list[dict[str, float]]:
    """Train the tiny model with ``config`` (a resolved config dict) and return the logged scalars per step."""
    import torch

    from rlvr.config import build_config
    from rlvr.models.tiny import build_tiny_model
    from rlvr.trainer.trainer import Trainer

    cfg = build_config(base=json.loads(json.dumps(config)), overrides=[f"logging.output_dir={out_dir}"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, tok = build_tiny_model(0)
        head = model.get_output_embeddings()
        bias = torch.zeros(head.weight.shape[0])
        bias[tok.eos_token_id] = EOS_BIAS
        head.bias = torch.nn.Parameter(bias)
        tr = Trainer(cfg, model, tok, make_task(task_kind))
        rows: list[dict[str, float]] = []
        tr.callbacks.append(lambda t, m: rows.append(
            {"step": float(t.global_step), **{k: float(v) for k, v in m.items() if not k.startswith(SKIP_PREFIXES)}}
        ))
        tr.train()
    finally:
        torch.set_num_threads(threads)
    return rows


def main(argv: list[str]) -> None:
    """Regenerate the fixture for the named cases (all when none)."""
    import tempfile

    names = argv or list(CASES)
    data = json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {}
    for name in names:
        config = resolved_config(name)
        with tempfile.TemporaryDirectory() as d:
            rows = run_config(config, CASES[name][2], Path(d))
        data[name] = {"task": CASES[name][2], "config": config, "steps": rows}
        print(f"{name}: {len(rows)} steps, {len(rows[0]) if rows else 0} scalars in step 1")
    FIXTURE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])

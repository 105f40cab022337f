"""torchrun worker: a 3-step run of each built-in recipe family on the tiny model, in one process group.

argv: MODEL_DIR OUT_ROOT. Prints ``RESULT {recipe: [logged steps]}`` on rank 0.
"""

import json
import sys
from pathlib import Path

from rlvr.cli import _load_config, _train, build_parser
from rlvr.distributed import init_distributed, shutdown
from rlvr.distributed.setup import local_config
from rlvr.tasks import build_task

from tests.distributed.conftest import metric_rows, tiny_run_args

RECIPES = {
    "grpo": [],
    "dapo": ["dynamic_sampling.max_num_gen_batches=3", "overlong_buffer_len=4", "num_generations=2"],  # ranks redraw unequally
    "mu_grpo_small": ["steps_per_generation=2", "generation_batch_size=16"],
    "uec_rl": ["uec.explore_num_generations=4", "uec.update_size=8", "uec.replay_every=2", "uec.replay_min_size=1"],
    "ib_tpo": ["steps_per_generation=1", "ib_tpo.min_remaining_tokens=2", "ib_tpo.max_rounds=2"],
    "fbos_rl": ["fbos.initial_rollouts=2", "fbos.prev_attempt_max_tokens=16"],
    # not recipes: GRPO with the job's reward std and a sharded reference model; replicated, mu = 2
    "grpo+batch_std+kl": ["scale_rewards=batch", "beta=0.04"],
    "grpo+replicated+mu2": ["distributed.fsdp=false", "steps_per_generation=2"],
    "grpo+gathered": ["distributed.generation_weights=gathered"],
}


def _record_trainers(seen):
    from rlvr.trainer.trainer import Trainer

    original = Trainer.train

    def train(self):
        seen.append(self)
        return original(self)

    Trainer.train = train


def main():
    model_dir, root = Path(sys.argv[1]), Path(sys.argv[2])
    only = sys.argv[3].split(",") if len(sys.argv) > 3 else list(RECIPES)
    env = init_distributed("cpu")
    logged = {}
    trainers = []
    _record_trainers(trainers)
    try:
        for name in only:
            out = root / name
            recipe = name.split("+")[0]
            args = build_parser().parse_args(["train", "--config", recipe, *tiny_run_args(model_dir, out), *RECIPES[name]])
            cfg = _load_config(args)
            _train(cfg, local_config(cfg, env.world_size), None, env, build_task(cfg.task))
            tr = trainers[-1]  # every rank's prompt loader is at the same place (also after dynamic sampling)
            states = tr.dp.gather(tr.loader.state_dict())
            assert all(st == states[0] for st in states), (name, states)
            if env.rank == 0:
                rows = metric_rows(out)
                logged[name] = [r["step"] for r in rows]
                if "beta=0.04" in RECIPES[name]:
                    assert all(r["timing/ref_logprob_s"] >= 0 and "actor/kl" in r for r in rows), rows[0].keys()
        if env.rank == 0 and {"grpo", "grpo+gathered"} <= set(logged):  # both weight paths: same rollouts
            stable = [{k: v for k, v in r.items() if not k.startswith(("timing/", "perf/", "time"))}
                      for name in ("grpo", "grpo+gathered") for r in metric_rows(root / name)]
            logged["gathered_equals_copy"] = all(  # same tokens and rewards; log-probs to float tolerance
                a.keys() == b.keys() and all(a[k] == b[k] or abs(a[k] - b[k]) <= 1e-5 * max(1.0, abs(a[k])) for k in a)
                for a, b in zip(stable[:3], stable[3:]))
    finally:
        if env.rank == 0:
            print("RESULT " + json.dumps(logged), flush=True)
        shutdown()


if __name__ == "__main__":
    main()

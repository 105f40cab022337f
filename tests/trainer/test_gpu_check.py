"""benchmarks/gpu_check.py runs on the CPU (``--device cpu --tiny``) so it is never untested before a GPU is
lent: FSDP2 at world size 1 (gloo) in bf16, the JSON it writes, and its correctness leg."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_on_cpu_tiny_with_fsdp2_and_its_correctness_leg_passes(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--tiny", "--steps", "2",
         "--max-new", "4", "--run-dir", str(tmp_path / "run"), "--out", str(out)],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    c = r["correctness"]
    assert c["passed"] and c["fp32"]["grad_rel_diff"] <= 1e-4 and c["bf16"]["passed"]
    assert c["bf16"]["logp_max_abs_diff"] > 0  # bf16 really ran: its log-probs are not fp32's bit for bit
    t = r["train"]
    assert t["fsdp"] is True and t["backend"] == "gloo" and t["precision"]["mode"] == "bf16"
    assert len(t["steps"]) == 2
    for s in t["steps"]:
        assert s["generated_tokens"] > 0 and s["trained_tokens"] > s["generated_tokens"]
        assert s["step_s"] > 0 and 0 < s["train_mfu"] < 1 and s["generated_tokens_per_s"] > 0
    med = t["median_after_first"]
    for key in ("step_s", "generate_s", "update_s", "generated_tokens_per_s", "trained_tokens_per_s", "train_mfu",
                "step_mfu"):
        assert med[key] > 0
    assert t["peak_memory_gib"] > 0 and r["torch"] and r["transformers"]

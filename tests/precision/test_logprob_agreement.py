"""benchmarks/logprob_agreement.py on the tiny model at tiny sizes: the JSON it writes, and what it measures.

Properties checked (each can fail): the fp32 engine and trainer agree to float noise; bf16 really differs; the
decomposition adds up token by token (Δ_bf16 = Δ_decode + Δ_weights); TIS's changed share is a share; and
decoding under the trainer's autocast (``generation_autocast``) narrows the bf16 gap.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARMS = ("fp32", "bf16", "decode_vs_full", "weights_vs_autocast", "bf16+generation_autocast",
        "bf16+cast_lm_head_to_fp32", "bf16+both")
SAMPLED = ("fp32", "bf16", "bf16+generation_autocast", "bf16+cast_lm_head_to_fp32", "bf16+both")


def test_logprob_agreement_tiny_json_and_properties(tmp_path):
    out = tmp_path / "agreement.json"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "logprob_agreement.py"), "--model", "tiny", "--prompts", "2",
         "--gens", "4", "--max-new", "12", "--out", str(out)],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| bf16 |" in proc.stdout and "CPU:" in proc.stdout  # the table and the machine line
    r = json.loads(out.read_text())
    assert set(r["arms"]) == set(ARMS)
    assert r["tis"]["mode"] == "token_truncate" and r["machine"]["cpu"]["model"]
    for name, st in r["arms"].items():
        assert st["tokens"] > 0, name
        assert 0 <= st["median"] <= st["p99"] <= st["max"], name
        if name in SAMPLED or name == "decode_vs_full":
            assert 0 <= st["rollout_is_changed"] <= 1, name
    a = r["arms"]
    assert a["fp32"]["median"] < 1e-4 and a["fp32"]["max"] < 1e-3  # fp32: float noise only
    assert a["fp32"]["rollout_is_changed"] == 0
    assert a["bf16"]["median"] > 10 * a["fp32"]["median"]  # bf16 really ran on both sides
    assert r["decomposition_residual_max"] < 1e-5  # the two parts add up to the bf16 gap
    # the engine decoding under the trainer's own autocast removes the bf16-weights part of the gap
    assert a["bf16+generation_autocast"]["median"] < 0.5 * a["bf16"]["median"]

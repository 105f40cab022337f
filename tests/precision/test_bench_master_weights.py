"""benchmarks/bench_master_weights.py on the tiny model: every piece is timed and the estimate adds up."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_master_weights  # noqa: E402


def test_master_weight_pieces_and_estimate_on_the_tiny_model(tmp_path):
    upd = {"machine": {"cpu": {"model": "some CPU", "bf16_flags": ["avx512_bf16"]}}, "micro_batches": 4,
           "arms": {"fp32": {"update_s": 10.0}, "bf16": {"speedup_vs_fp32": 1.5}, "bf16-pure": {"update_s": 4.0}}}
    (tmp_path / "u.json").write_text(json.dumps(upd))
    out = tmp_path / "m.json"
    assert bench_master_weights.main(["--model", "tiny", "--reps", "2", "--update-json", str(tmp_path / "u.json"),
                                      "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["optimizer_step_s"]) == {"fp32", "bf16-pure", "bf16-master"}
    assert all(t > 0 for t in res["optimizer_step_s"].values())
    assert res["hook_first_micro_batch_s"] > 0 and res["hook_later_micro_batch_s"] > 0
    est = res["estimate"]
    hooks = res["hook_first_micro_batch_s"] + 3 * res["hook_later_micro_batch_s"]
    assert abs(est["hooks_s"] - hooks) < 1e-12 and abs(est["bf16_master_update_s"] - (4.0 + hooks)) < 1e-12
    assert abs(est["bf16_master_speedup_vs_fp32"] - 10.0 / (4.0 + hooks)) < 1e-9

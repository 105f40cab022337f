"""benchmarks/bench_update_dtype.py on the tiny model: every arm times every micro-batch and the bf16 arms
really compute in bf16 (their log-probs differ from fp32's by bf16 rounding, not by 0 and not by a wrong model)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_update_dtype  # noqa: E402


def test_paired_update_bench_on_the_tiny_model(tmp_path):
    out = tmp_path / "u.json"
    assert bench_update_dtype.main(["--model", "tiny", "--prompts", "2", "--gens", "4", "--max-new", "12",
                                    "--rows-per-micro", "4", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["micro_batches"] == 2 and set(res["arms"]) == {"fp32", "bf16", "bf16-pure", "bf16-master",
                                                                  "bf16-master+attn32"}
    assert res["trained_tokens"] > 2 * 64  # two prompts once each + completions of ≥ 3 tokens
    for arm, r in res["arms"].items():
        assert r["forward_s"] > 0 and r["backward_s"] > 0 and r["optimizer_step_s"] > 0
        assert abs(r["training_gflops"] - 6 * res["params"] * res["trained_tokens"] / r["update_s"] / 1e9) < 1e-6
    assert res["arms"]["fp32"]["max_abs_logp_diff_vs_fp32"] == 0.0
    for arm in ("bf16", "bf16-pure", "bf16-master", "bf16-master+attn32"):
        assert 0.0 < res["arms"][arm]["max_abs_logp_diff_vs_fp32"] < 0.5, arm
    # the same bf16 weights and no step between micro-batches: bf16-master's forward is bf16-pure's exactly
    assert res["arms"]["bf16-master"]["max_abs_logp_diff_vs_fp32"] == res["arms"]["bf16-pure"]["max_abs_logp_diff_vs_fp32"]


def test_synthetic_batch_shares_each_groups_prompt():
    b = bench_update_dtype.synthetic_batch(vocab=50, prompts=3, gens=2, prompt_len=5, max_new=8, seed=1)
    assert len(b.context_ids) == 6 and b.context_ids[0] == b.context_ids[1] != b.context_ids[2]
    lens = b.completion_mask.sum(1)
    assert int(lens.min()) >= 2 and int(lens.max()) <= 8
    assert bench_update_dtype.trained_tokens(b) == 3 * 5 + int(lens.sum())

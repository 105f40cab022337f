"""benchmarks/bench_envs.py on the tiny model with tiny sizes: the table's JSON has every arm, the arms generate
equal tokens, every tools episode has exactly `turns` turns, and the later turns reuse the kept KV cache
(the tools_recompute arm does not). Timings are never asserted."""

import importlib.util
import json
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "bench_envs", Path(__file__).resolve().parents[2] / "benchmarks" / "bench_envs.py")
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def test_bench_envs_runs_on_the_tiny_model(tmp_path, capsys):
    out = tmp_path / "bench_envs.json"
    P, G, turns, T = 2, 2, 3, 3
    assert bench.main(["--model", "tiny", "--prompts", str(P), "--generations", str(G), "--turns", str(turns),
                       "--turn-tokens", str(T), "--repeats", "2", "--out", str(out),
                       "--arms", "single,single_tools_prompt,tools,tools_recompute"]) == 0
    printed = capsys.readouterr().out
    assert "CPU:" in printed and "| tools |" in printed and "tools/single_tools_prompt" in printed
    res = json.loads(out.read_text())
    arms = res["arms"]
    assert set(arms) == {"single", "single_tools_prompt", "tools", "tools_recompute"}
    # the same-prompt arm opens with the tools episodes' prompt (the schemas make it longer)
    assert res["rounds"]["single_tools_prompt"][0]["prompt_tokens"] > res["rounds"]["single"][0]["prompt_tokens"]
    assert all(a["rounds"] == 2 for a in arms.values())
    assert {a["tokens"] for a in arms.values()} == {P * G * turns * T}  # equal generated tokens (EOS off)
    for name in ("tools", "tools_recompute"):
        t = arms[name]
        assert t["turns_mean"] == turns and t["tool_calls"] == turns - 1 and t["env_tokens"] > 0
        shares = [t[k] for k in ("engine_share", "tools_share", "template_share", "reset_share")]
        assert all(0 <= s <= 1 for s in shares) and abs(sum(shares) + t["other_share"] - 1) < 1e-9
        assert 0 < t["prefill_share"] < t["engine_share"] and len(res["rounds"][name][0]["engine_calls_s"]) == turns
    assert arms["tools"]["kv_hits"] == P * G * (turns - 1)  # every later turn of every episode reused its cache
    assert arms["tools"]["kv_reused_tokens"] > 0
    assert arms["tools_recompute"]["kv_hits"] == 0
    assert res["ratio"] == arms["tools"]["tok_per_s_median"] / arms["single"]["tok_per_s_median"]
    assert set(res["cpu_ratios"]) == {"tools/single", "tools/single_tools_prompt"}
    assert all(a["tok_per_cpu_s_median"] > 0 for a in arms.values())
    assert set(res["ratios"]) == {"tools/single", "tools/single_tools_prompt", "tools_recompute/single",
                                  "tools_recompute/single_tools_prompt"}
    assert "matmul_gflop_per_s" in res["machine"]

#!/usr/bin/env bash
# Issue 39's bf16 measurements in one command, for a CPU with native bf16 (`avx512_bf16` or `amx_bf16`).
# Runs, one at a time under the shared lock, on the default model:
#   1. bench_update_dtype.py  (fp32, bf16, bf16-pure, bf16-master, bf16-master+attn32; paired per micro-batch)
#   2. update_op_account.py   (op-kind account of fp32, bf16-master, bf16-master+attn32)
#   3. bench_step.py with TRL, both orders (rlvr first, then TRL first), at `auto` (bf16-master there)
#   4. the same pair with model.attention_fp32=true, only if step 1 shows the +attn32 arm faster
# Each writes a JSON under benchmarks/results/ with a _native suffix; paste the tables into docs/benchmark.md.
# Needs TRL importable for step 3 (TRL_SITE=<site-packages of a venv with trl 1.16>, see docs/benchmark.md).
# Refuses on a CPU without native bf16: there bf16 is emulated and its timings say nothing about the targets.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
    echo "native_bf16.sh: this CPU has no avx512_bf16/amx_bf16 flag; bf16 is emulated here, nothing to measure" >&2
    exit 2
fi
PY=${PY:-.venv/bin/python}
LOCK=${LOCK:-/tmp/rlvr-heavy.lock}
R=benchmarks/results
export HF_HUB_OFFLINE=1 PYTHONPATH="$PWD/src${TRL_SITE:+:$TRL_SITE}"
run() { echo "== $(date -u +%T) $*"; flock "$LOCK" "$PY" "$@"; }

run benchmarks/bench_update_dtype.py --model default --out $R/bench_update_dtype_native_attn32.json
run benchmarks/update_op_account.py --model default --arms fp32,bf16-master,bf16-master+attn32 \
    --out $R/update_op_account_native_attn32.json
run benchmarks/bench_step.py --dtype auto --steps 2 --trl --trl-steps 1 --out $R/bench_step_native_rlvr_first.json
run benchmarks/bench_step.py --dtype auto --steps 2 --trl --trl-steps 1 --trl-first --out $R/bench_step_native_trl_first.json
faster=$("$PY" - "$R/bench_update_dtype_native_attn32.json" <<'EOF'
import json, sys
arms = json.load(open(sys.argv[1]))["arms"]
print(int(arms["bf16-master+attn32"]["update_s"] < arms["bf16-master"]["update_s"]))
EOF
)
if [ "$faster" = 1 ]; then
    run benchmarks/bench_step.py --dtype auto --steps 2 --trl --trl-steps 1 \
        --out $R/bench_step_native_attn32_rlvr_first.json model.attention_fp32=true
    run benchmarks/bench_step.py --dtype auto --steps 2 --trl --trl-steps 1 --trl-first \
        --out $R/bench_step_native_attn32_trl_first.json model.attention_fp32=true
else
    echo "== bf16-master+attn32 was not faster than bf16-master in the update: no attention_fp32 step pair"
fi

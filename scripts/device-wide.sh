#!/bin/sh
# device-wide.sh - one device call for the wide linears (linear_wide.cu, RKV_CUDA_LIN_WIDE): the
# tensor-copy form's cases, the model under every alternative, an a/b at batch 64 against
# cuBLAS, one traced step, then both forms' cases; a short summary on stdout, the rest in OUT.
#   here:  scripts/bench-system.sh --pack .benchpack build/bs   (carry .benchpack.tgz)
#   there: sh scripts/device-wide.sh .benchpack $OUT            (~5 minutes)
# The output files' names are plain (the device tool does not bring back names with '=').
set -u
PACK=${1:?usage: scripts/device-wide.sh PACK OUT}
OUT=${2:?usage: scripts/device-wide.sh PACK OUT}
HERE=$(dirname "$0")
# shellcheck source=scripts/pack-lib.sh
. "$HERE/pack-lib.sh"
pack_env "$PACK" "$OUT" 8 >/dev/null || {
    echo "device-wide: cannot run from $PACK" >&2
    exit 1
}
B=$PACK/bin
step() { echo "== $* ($(date +%T))"; }
fails() { grep -E "FAIL|gpu-test:" "$1" | sort | uniq -c | sort -rn | head -"${2:-12}"; }

step "gpu_ops_test --wide-tma-only"
timeout 100 "$B/gpu_ops_test" --wide-tma-only >"$OUT/ops_tma.txt" 2>&1
echo "rc=$?"
fails "$OUT/ops_tma.txt"

step "gpu_ops_test --model-only (the tensor-copy form among its alternatives)"
timeout 90 "$B/gpu_ops_test" --model-only >"$OUT/model.txt" 2>&1
echo "rc=$?"
fails "$OUT/model.txt"

step "a/b at batch 64 (RKV_BENCH_B1=0: the batched cases alone)"
RKV_BENCH_B1=0 AB_TIMEOUT=60 sh "$HERE/device-ab.sh" "$PACK" "$OUT/ab" default \
    RKV_CUDA_LIN_WIDE=64,RKV_CUDA_LIN_WIDE_TMA=1 \
    RKV_CUDA_LIN_WIDE=64,RKV_CUDA_LIN_WIDE_TMA=1,RKV_CUDA_LIN_WIDE_STAGES=4 \
    RKV_CUDA_LIN_WIDE=64 default >/dev/null 2>&1
grep -E "^==|b=64 ctx=4096 \(|b=16 " "$OUT/ab/ab.txt" | sed 's/  */ /g'
rm -f "$OUT"/ab/*.json

step "one traced step of each batched case, tensor copies"
mkdir -p "$OUT/tr"
RKV_BENCH_B1=0 RKV_PROFILE_TRACE=$OUT/tr RKV_CUDA_LIN_WIDE=64 RKV_CUDA_LIN_WIDE_TMA=1 \
    timeout 70 "$B/gpu_bench" --suite decode --quick >"$OUT/tr/bench.txt" 2>&1
echo "rc=$?"
python3 "$HERE/trace-phases.py" "$OUT/tr/trace.csv" "b=64 ctx=4096" >"$OUT/tr/phases.txt" 2>&1
cat "$OUT/tr/phases.txt"
rm -f "$OUT/tr/trace.csv"

step "gpu_ops_test --wide-only (both forms)"
timeout 180 "$B/gpu_ops_test" --wide-only >"$OUT/ops_wide.txt" 2>&1
echo "rc=$?"
fails "$OUT/ops_wide.txt"
step "done"

#!/bin/sh
# device-session.sh - one call on the gpu machine that checks and measures what changed since
# the last device session, in the order that matters when time runs out: the op tests, the
# linear and decode benchmarks, then the load ramp (the cuda switches at their defaults; set
# RKV_CUDA_* in the environment for an a/b run: the worker inherits them).
#   here:  scripts/bench-system.sh --pack .benchpack build/bs
#   there: sh scripts/device-session.sh .benchpack $OUT     (carry .benchpack)
# everything lands in OUT, and OUT/all.tgz holds it all (the device tool returns few files).
set -u
PACK=${1:?usage: scripts/device-session.sh PACK OUT}
OUT=${2:?usage: scripts/device-session.sh PACK OUT}
mkdir -p "$OUT"
. "$(dirname "$0")/pack-lib.sh"
pack_env "$PACK" "$OUT" 56 >/dev/null || { echo "device-session: cannot run from $PACK" >&2; exit 1; }
B=$PACK/bin
step() { echo "== $* ($(date +%T))"; }

step "gpu_ops_test"
timeout 200 "$B/gpu_ops_test" >"$OUT/ops.txt" 2>&1
echo "rc=$?" >>"$OUT/ops.txt"
grep -E "FAIL|passes|passed|failed|rc=" "$OUT/ops.txt" | tail -8

step "gpu_bench linear + decode (quick)"
timeout 150 "$B/gpu_bench" --suite linear --json "$OUT/linear.json" >"$OUT/linear.txt" 2>&1
timeout 150 "$B/gpu_bench" --suite decode --quick --json "$OUT/decode.json" >"$OUT/decode.txt" 2>&1
grep -E "linear|b=1 ctx=4096 host=0|b=1 ctx=32768 host=0|b=64" "$OUT/linear.txt" "$OUT/decode.txt" |
    sed 's/  */ /g'

step "load ramp"
mkdir -p "$OUT/ramp"
DEADLINE=${RAMP_DEADLINE:-300} WORK=${WORK:-/tmp/rkv-device-session} \
    timeout $((${RAMP_DEADLINE:-300} + 40)) sh "$(dirname "$0")/bench-system.sh" "$PACK" \
    "$OUT/ramp" --parts ramp --no-hf --up 1,16,24,40,64 --down 16,1 --window 2 \
    >"$OUT/ramp/log.txt" 2>&1
grep -E "ramp (ramp|resident)|PASS|FAIL" "$OUT/ramp/log.txt" | tail -14
grep -E "host kv layers" "$OUT/ramp/rkvd-server.log" 2>/dev/null | tail -4 | cut -c1-400

tar -czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz . 2>/dev/null
echo "device-session: results in $OUT (all.tgz)"

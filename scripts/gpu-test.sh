#!/bin/sh
# gpu-test.sh - the gpu tests (make gpu-test): every cuda op against the cpu backend,
# whole-model logits for each weight type and kv placement, then compute-sanitizer
# memcheck on the op tests. exits 0 with a note on a machine without a gpu.
#   scripts/gpu-test.sh [BUILD]
set -u
BUILD=${1:-build}
# make gpu-test builds the programs first; run alone, this builds them
[ -n "${MAKELEVEL:-}" ] || make --no-print-directory BUILD="$BUILD" -j"$(nproc)" gpu || exit 1
B=$BUILD/gpu
"$B/gpu_ops_test"
rc=$?
if [ $rc = 77 ]; then
    echo "gpu-test: no CUDA device here; skipped (run it on a gpu machine)"
    exit 0
fi
[ $rc = 0 ] || exit $rc
if command -v compute-sanitizer >/dev/null 2>&1; then
    log=$B/memcheck.log
    compute-sanitizer --tool memcheck --leak-check full --error-exitcode 3 \
        "$B/gpu_ops_test" --ops-only >"$log" 2>&1
    rc=$?
    tail -2 "$log"
    [ $rc = 0 ] || { echo "gpu-test: memcheck found errors, see $log"; exit $rc; }
fi
echo "gpu-test: passed"

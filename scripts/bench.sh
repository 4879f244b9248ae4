#!/bin/sh
# bench.sh - the gpu benchmarks (make bench): ceilings (hbm read, pinned h2d,
# zero-copy), gemv, attention (resident, host tail, overlapped split), decode
# and prefill on a llama3-8b-shaped bf16 model, each as a ratio to its bound.
#   scripts/bench.sh [BUILD] [gpu_bench args: --quick --suite S --preset small]
# writes BUILD/bench/bench.json, then prints every target as PASS / FAIL and, where matplotlib
# imports, plots BUILD/bench/spill.png and attention.png (scripts/bench-plot.py)
set -u
BUILD=${1:-build}
[ $# -gt 0 ] && shift
# make bench builds the programs first; run alone, this builds them
[ -n "${MAKELEVEL:-}" ] || make --no-print-directory BUILD="$BUILD" -j"$(nproc)" gpu || exit 1
mkdir -p "$BUILD/bench"
"$BUILD/gpu/gpu_bench" --json "$BUILD/bench/bench.json" "$@"
rc=$?
if [ $rc = 77 ]; then
    echo "bench: no CUDA device here; skipped"
    exit 0
fi
if [ $rc = 0 ]; then
    echo "bench: results in $BUILD/bench/bench.json"
    if command -v python3 >/dev/null; then
        python3 "$(dirname "$0")/bench-plot.py" "$BUILD/bench/bench.json" "$BUILD/bench" || rc=$?
    else
        echo "bench: no python3 here, so the targets are not judged: scripts/bench-plot.py FILE"
    fi
fi
exit $rc

#!/bin/sh
# gpu-demo.sh - the whole system on the gpu: rkvd --backend cuda serving HTTP with kvmgr's VRAM
# slab shared by CUDA IPC; streams, the VRAM budget (nvidia-smi), a worker SIGKILL mid-stream.
#   scripts/gpu-demo.sh --pack DIR [BUILD]   here: build, then put the binaries and the shared
#                                            libraries they need (not glibc, not cuda) in DIR
#   scripts/gpu-demo.sh DIR [OUT]            on the gpu machine (no Debian packages there):
#                                            runs tests/gpu/gpu_demo.py, results under OUT
# env PRESETS (default small,llama3-8b), DEADLINE (seconds, default 300).
set -u
. "$(dirname "$0")/pack-lib.sh"
if [ "${1:-}" = "--pack" ]; then
    DIR=${2:?usage: scripts/gpu-demo.sh --pack DIR [BUILD]}
    B=${3:-build/gpu-demo}
    make BUILD="$B" -j"$(nproc)" "$B/bin/rkvd" "$B/bin/rkv-kvmgr" "$B/bin/rkv-worker" \
        "$B/bin/rkv-mkmodel" "$B/test/gpu_test" >/dev/null || exit 1
    pack_bins "$DIR" "$B/bin/rkvd" "$B/bin/rkv-kvmgr" "$B/bin/rkv-worker" "$B/bin/rkv-mkmodel" \
        "$B/test/gpu_test" || exit 1
    exit 0
fi
DIR=${1:?usage: scripts/gpu-demo.sh DIR [OUT]}
OUT=${2:-${OUT:-/tmp/rkv-gpu-demo-out}}
pack_env "$DIR" "$OUT" 16 || { echo "gpu-demo: cannot run from $DIR" >&2; exit 1; }
"$DIR/bin/gpu_test" >"$OUT/gpu_test.txt" 2>&1
echo "gpu_test: exit $? ($(grep -c '\[       OK' "$OUT/gpu_test.txt") ok, $(grep -c SKIPPED "$OUT/gpu_test.txt") skipped lines)"
python3 tests/gpu/gpu_demo.py --bin "$DIR/bin" --out "$OUT" --presets "${PRESETS:-small,llama3-8b}" \
    --deadline "${DEADLINE:-300}"

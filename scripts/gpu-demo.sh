#!/bin/sh
# gpu-demo.sh - the whole system on the gpu: rkvd --backend cuda serving HTTP with kvmgr's VRAM
# slab shared by CUDA IPC; streams, the VRAM budget (nvidia-smi), a worker SIGKILL mid-stream.
#   scripts/gpu-demo.sh --pack DIR [BUILD]   here: build, then put the binaries and the shared
#                                            libraries they need (not glibc, not cuda) in DIR
#   scripts/gpu-demo.sh DIR [OUT]            on the gpu machine (no Debian packages there):
#                                            runs tests/gpu/gpu_demo.py, results under OUT
# env PRESETS (default small,llama3-8b), DEADLINE (seconds, default 300).
set -u
if [ "${1:-}" = "--pack" ]; then
    DIR=${2:?usage: scripts/gpu-demo.sh --pack DIR [BUILD]}
    B=${3:-build/gpu-demo}
    make BUILD="$B" -j"$(nproc)" "$B/bin/rkvd" "$B/bin/rkv-kvmgr" "$B/bin/rkv-worker" \
        "$B/bin/rkv-mkmodel" "$B/test/gpu_test" >/dev/null || exit 1
    rm -rf "$DIR" && mkdir -p "$DIR/bin" "$DIR/lib" || exit 1
    for f in rkvd rkv-kvmgr rkv-worker rkv-mkmodel; do cp "$B/bin/$f" "$DIR/bin/"; done
    cp "$B/test/gpu_test" "$DIR/bin/"
    strip "$DIR"/bin/*
    # every shared library outside glibc, the compiler runtime and cuda travels
    ldd "$DIR"/bin/* | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
        grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libcublas[A-Za-z]*)\.so' |
        while read -r lib; do cp -L "$lib" "$DIR/lib/"; done
    du -sh "$DIR"
    exit 0
fi
DIR=${1:?usage: scripts/gpu-demo.sh DIR [OUT]}
OUT=${2:-${OUT:-/tmp/rkv-gpu-demo-out}}
mkdir -p "$OUT"
CUDA_LIB=$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")/../lib64
export LD_LIBRARY_PATH="$DIR/lib:$CUDA_LIB:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
    nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
    uname -r; ldd --version | head -1; df -h /dev/shm; ulimit -l
    echo "debian packages the build uses, present here:"
    ldconfig -p | grep -E 'libuv|libnng|libcjson|libsqlite3|libsystemd|libpcre2-8|libhttp_parser' || echo none
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
if ldd "$DIR"/bin/* | grep -q "not found"; then
    ldd "$DIR"/bin/* | grep "not found"
    echo "gpu-demo: a library is missing (above); pack again with the missing one" >&2
    exit 1
fi
# the host pool is shared memory: room for its budget
shm_kb=$(df -k /dev/shm | awk 'NR == 2 {print $2}')
[ "${shm_kb:-0}" -ge 16777216 ] || mount -o remount,size=24g /dev/shm 2>/dev/null || true
"$DIR/bin/gpu_test" >"$OUT/gpu_test.txt" 2>&1
echo "gpu_test: exit $? ($(grep -c '\[       OK' "$OUT/gpu_test.txt") ok, $(grep -c SKIPPED "$OUT/gpu_test.txt") skipped lines)"
python3 tests/gpu/gpu_demo.py --bin "$DIR/bin" --out "$OUT" --presets "${PRESETS:-small,llama3-8b}" \
    --deadline "${DEADLINE:-300}"

#!/bin/sh
# bench-system.sh - the system benchmarks (make bench-system): load ramp, spill curve (and
# transformers' offloaded KV cache beside it), HTTP overhead, budget change under load, against
# rkvd --backend cuda; JSON + PNG plots under OUT, each figure printed as a ratio to its bound.
#   scripts/bench-system.sh --pack DIR [BUILD]    here: build, then the binaries (gpu_bench and
#                                                 gpu_ops_test too when nvcc is here) and the
#                                                 shared libraries they need into DIR (as
#                                                 gpu-demo.sh)
#   scripts/bench-system.sh DIR [OUT] [ARGS...]   on the gpu machine: tests/gpu/bench_system.py
#                                                 with ARGS (--quick, --ctx N, --parts ..., -h)
# without a CUDA device the second form runs the cpu smoke test (--backend cpu --quick).
# env DEADLINE (seconds for the python part; default 480, quick 55), WORK (models, state).
set -u
. "$(dirname "$0")/pack-lib.sh"
if [ "${1:-}" = "--pack" ]; then
    DIR=${2:?usage: scripts/bench-system.sh --pack DIR [BUILD]}
    B=${3:-build/bench-system}
    # the pack's programs: built here, then packed with their libraries
    bins=""
    for p in rkvd rkv-kvmgr rkv-worker rkv-mkmodel rkvctl rkv-gen rkv-bench; do
        bins="$bins $B/bin/$p"
    done
    # shellcheck disable=SC2086 # bins: a list of paths without spaces
    make BUILD="$B" -j"$(nproc)" $bins >/dev/null || exit 1
    extra=""
    if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
        if make BUILD="$B" -j"$(nproc)" gpu >/dev/null; then
            extra="$B/gpu/gpu_bench $B/gpu/gpu_ops_test"
        else
            echo "bench-system: gpu_bench did not build; the pack has no ceilings" >&2
        fi
    else
        echo "bench-system: no nvcc here: the pack has no gpu_bench (bounds read 'no ceiling')" >&2
    fi
    # gpu_bench's RKV_PROFILE_TRACE opens CUPTI at run time
    cuda_home=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")
    PACK_EXTRA_LIBS=$(ls "$cuda_home"/lib64/libcupti.so.* "$cuda_home"/extras/CUPTI/lib64/libcupti.so.* 2>/dev/null | head -1) \
    pack_bins "$DIR" $bins $extra || exit 1
    exit 0
fi
DIR=${1:?usage: scripts/bench-system.sh DIR [OUT] [bench_system.py args]}
OUT=${2:-${OUT:-/tmp/rkv-bench-system-out}}
[ $# -ge 2 ] && shift 2 || shift $#
# the ramp's host pool: 64 sessions of 4k + a turn, f16 kv of llama3-8b (~40 GiB)
mode="--backend cuda" shm=56
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "bench-system: no CUDA device here (nvidia-smi -L fails): the cpu smoke test instead"
    mode="--backend cpu --quick" shm=0
fi
pack_env "$DIR" "$OUT" $shm || { echo "bench-system: cannot run from $DIR" >&2; exit 1; }
# shellcheck disable=SC2086 # mode is two or three words
exec python3 "$(dirname "$0")/../tests/gpu/bench_system.py" --bin "$DIR/bin" --out "$OUT" \
    --work "${WORK:-/tmp/rkv-bench-system}" ${DEADLINE:+--deadline "$DEADLINE"} $mode "$@"

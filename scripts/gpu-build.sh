#!/bin/sh
# gpu-build.sh - builds the gpu test and benchmark programs with nvcc and cc alone
# (no libnng/libuv/cmocka needed), so they build on a bare gpu machine.
#   scripts/gpu-build.sh [BUILD]   -> BUILD/gpu/gpu_ops_test, BUILD/gpu/gpu_bench
set -eu
BUILD=${1:-build}
OUT=$BUILD/gpu
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
CC=${CC:-cc}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT/obj"
ARCH=$(grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && echo -march=x86-64-v3 || true)
CFLAGS="-O2 -g -std=c11 -pthread -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers $ARCH -fno-strict-aliasing -I. -I$CUDA_HOME/include -D_GNU_SOURCE -DRKV_CUDA=1"
NVFLAGS="-O3 -g -std=c++17 -I. -Xcompiler -fPIC,-Wall -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 -DRKV_CUDA=1"
# the engine without its process shell: backend selection and ops, kv, model, forward, cpu
LIB_C="common/err.c common/log.c common/util.c $(ls worker/backend*.c) worker/kv.c worker/model.c worker/forward.c worker/pool.c worker/sample.c worker/rates.c
       $(ls worker/cpu/*.c | grep -v _test.c) tests/gpu/gpu_util.c tests/gpu/gpu_model.c"
CU=$(ls worker/cuda/*.cu)

# one object per source, rebuilt when the source or any header is newer
compile() {
    src=$1
    obj=$OUT/obj/$(echo "$src" | tr / _).o
    if [ -f "$obj" ] && [ "$obj" -nt "$src" ] &&
        [ -z "$(find worker common tests/gpu \( -name '*.h' -o -name '*.cuh' \) -newer "$obj" | head -1)" ]; then
        return 0
    fi
    case $src in
    *.cu) $NVCC $NVFLAGS -c "$src" -o "$obj" ;;
    *) $CC $CFLAGS -c "$src" -o "$obj" ;;
    esac
}
ALL="$LIB_C $CU tests/gpu/gpu_ops_test.c tests/gpu/gpu_model_test.c tests/gpu/gpu_bench.c tests/gpu/gpu_trace.c"
fail=0
pids=""
n=0
for s in $ALL; do
    [ -f "$s" ] || continue
    compile "$s" &
    pids="$pids $!"
    n=$((n + 1))
    if [ $n -ge "$JOBS" ]; then
        for p in $pids; do wait "$p" || fail=1; done
        pids=""
        n=0
    fi
done
for p in $pids; do wait "$p" || fail=1; done
[ $fail = 0 ] || { echo "gpu-build: compile failed" >&2; exit 1; }

objs() { for s in "$@"; do echo "$OUT/obj/$(echo "$s" | tr / _).o"; done; }
LIBOBJ=$(objs $LIB_C $CU)
LDLIBS="-L$CUDA_HOME/lib64 -Wl,-rpath,$CUDA_HOME/lib64 -lcublasLt -lcublas -lcudart_static -lstdc++ -lm -lpthread -ldl -lrt"
$CC -pthread -o "$OUT/gpu_ops_test" $(objs tests/gpu/gpu_ops_test.c tests/gpu/gpu_model_test.c) $LIBOBJ $LDLIBS
if [ -f tests/gpu/gpu_bench.c ]; then
    $CC -pthread -o "$OUT/gpu_bench" $(objs tests/gpu/gpu_bench.c tests/gpu/gpu_trace.c) $LIBOBJ $LDLIBS
fi
echo "gpu-build: built in $OUT"

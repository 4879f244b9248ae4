#!/bin/sh
# device-session.sh - the runs on a gpu machine that check and measure a build, each within
# 600 s, in the order that matters when time runs out (the cuda switches at their defaults; set
# RKV_CUDA_* in the environment for an a/b run: the worker inherits them):
#   check   the op tests, compute-sanitizer memcheck of the op tests, every gpu_bench suite,
#           rkv-bench cpu --quick on avx-512 and avx2, rkv-bench migrate (kvmgr's block copies
#           each way and a turnover on the two copy lanes) (~5 min)
#   system  tests/gpu/bench_system.py with its defaults: http, ramp, spill, budget (on a server
#           of its own, --deterministic), the hf offloaded cache (DEADLINE, default 520 s); each
#           http run's JSON holds the step lines of its steady window (bench_system.py sets
#           RKV_STEP_REPORT_MS=500) (~9 min)
#   models  the model families and block types: gpu_ops_test --model-only (logits against the
#           cpu, qdot=int and qdot=exact apart), gpu_bench's quant suite for q4_k_m (--quick), the
#           gemv suite, the gemm suite (every prefill linear and weight type against the dense
#           bf16 gemm, judged by bench-plot.py), and the qwen3-8b and gemma3-4b presets' decode
#           (--quick) (~6 min)
#   trace   gpu_bench's decode suite (--quick) with one step of each resident case traced by
#           CUPTI (RKV_PROFILE_TRACE): the kernels as the step runs them, per kernel and gap;
#           OUT/trace.txt, every kernel in OUT/trace.csv, a layer's phases of each case in
#           OUT/phases.txt (scripts/trace-phases.py); then the gemm suite (--quick) with one
#           4096-token product of each linear traced (a block type's dequantization beside its
#           gemms) in OUT/trace_gemm.txt (~2 min)
#   sample  the device sampler alone: gpu_ops_test --sample-only, compute-sanitizer memcheck of
#           it, each phase of a batch-64 row (RKV_CUDA_SAMPLE_STAMPS=1, the last step's first
#           row), then gpu_bench's quick decode suite for the sampled rows' tok/s (~2 min)
#   profile ncu of the streamed o linear alone (gpu_bench's linear suite, one launch after ten):
#           speed of light, occupancy, warp states, scheduler, memory sections in
#           OUT/ncu_o.txt, the report in OUT/ncu_o.ncu-rep and the stall samples of each SASS
#           instruction in OUT/ncu_o_sass.csv (o: 16.5 us for 7.3 us of bytes in a b=1 step)
#   swa     tests/gpu/swa_check.py: a Gemma 3 4B-shaped model (q4_k_m, made there), one session
#           of 32768 positions through rkvd with swa_kv = window and then full: the window's
#           KV bytes over the full layout's, the same tokens, decode tok/s of each (~5 min)
#   profile-q  ncu of the integer-dot decode kernel over Q4_K weights (gpu_bench's gemv suite,
#           4096 x 4096, one token and eight, a warm launch of each): the same sections and
#           files as profile, as OUT/ncu_q4k_n1* and OUT/ncu_q4k_n8*
#   here:  scripts/bench-system.sh --pack .benchpack build/bs
#   there: sh scripts/device-session.sh .benchpack $OUT check   (carry .benchpack.tgz: it unpacks there), then system
# everything lands in OUT, and OUT/all.tgz holds it all (one file to carry back).
set -u
PACK=${1:?usage: scripts/device-session.sh PACK OUT [check|system|models|trace|sample|swa|profile|profile-q]}
OUT=${2:?usage: scripts/device-session.sh PACK OUT [check|system|models|trace|sample|swa|profile|profile-q]}
WHAT=${3:-check}
mkdir -p "$OUT"
# shellcheck source=scripts/pack-lib.sh
. "$(dirname "$0")/pack-lib.sh"
pack_env "$PACK" "$OUT" 56 >/dev/null || { echo "device-session: cannot run from $PACK" >&2; exit 1; }
B=$PACK/bin
step() { echo "== $* ($(date +%T))"; }
# ncu_kernel NAME NAMEBASE REGEX SKIP SUITE LINES: ncu's sections of one launch of the kernels
# REGEX names (after SKIP of them) in gpu_bench --suite SUITE, in OUT/NAME.txt with its details,
# the report in OUT/NAME.ncu-rep and the stall samples of each SASS instruction (which warp
# role waits where) in OUT/NAME_sass.csv; prints LINES lines of the headline figures
ncu_kernel() {
    timeout 280 ncu --clock-control none --kernel-name-base "$2" \
        --kernel-name regex:"$3" --launch-skip "$4" --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters \
        --export "$OUT/$1" --force-overwrite \
        "$B/gpu_bench" --suite "$5" >"$OUT/$1.txt" 2>&1
    echo "rc=$?" >>"$OUT/$1.txt"
    ncu --import "$OUT/$1.ncu-rep" --print-details all >>"$OUT/$1.txt" 2>&1
    ncu --import "$OUT/$1.ncu-rep" --page source --csv --print-source sass \
        >"$OUT/$1_sass.csv" 2>&1
    grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Stall|rc=" \
        "$OUT/$1.txt" | head -"$6"
}

case $WHAT in
check)
    step "gpu_ops_test"
    timeout 200 "$B/gpu_ops_test" >"$OUT/ops.txt" 2>&1
    echo "rc=$?" >>"$OUT/ops.txt"
    grep -E "FAIL|passes|passed|failed|rc=" "$OUT/ops.txt" | tail -8
    step "compute-sanitizer memcheck of the op tests"
    timeout 200 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 3 \
        "$B/gpu_ops_test" --ops-only >"$OUT/memcheck.txt" 2>&1
    echo "rc=$?" >>"$OUT/memcheck.txt"
    tail -3 "$OUT/memcheck.txt"
    step "gpu_bench, every suite"
    timeout 300 "$B/gpu_bench" --json "$OUT/gpu_bench.json" >"$OUT/gpu_bench.txt" 2>&1
    echo "rc=$?" >>"$OUT/gpu_bench.txt"
    grep -E "ceiling|decode|split|rc=" "$OUT/gpu_bench.txt" | sed 's/  */ /g'
    # the targets as PASS / FAIL, and the spill and attention plots where matplotlib imports
    python3 "$(dirname "$0")/bench-plot.py" "$OUT/gpu_bench.json" "$OUT" 2>&1 | tee "$OUT/targets.txt"
    # the host's cpu attention (the split host read's and CPU_TAIL's work) on each kernel form
    if [ -x "$B/rkv-bench" ]; then
        step "rkv-bench cpu --quick, avx-512 (where the host has it) and avx2"
        for isa in 1 0; do
            RKV_CPU_AVX512=$isa timeout 120 "$B/rkv-bench" cpu --quick \
                --models-dir "${TMPDIR:-/tmp}/rkv-bench-models" \
                --json "$OUT/cpu_isa$isa.json" >"$OUT/cpu_isa$isa.txt" 2>&1
            grep -E "kernels|host-tail" "$OUT/cpu_isa$isa.txt"
        done
        step "rkv-bench migrate: kvmgr's block copies, and a turnover on the copy lanes"
        timeout 120 "$B/rkv-bench" migrate --json "$OUT/migrate.json" >"$OUT/migrate.txt" 2>&1
        echo "rc=$?" >>"$OUT/migrate.txt"
        sed -n '/^gpu:/,$p' "$OUT/migrate.txt"
    fi
    ;;
system)
    step "bench_system.py, every part"
    mkdir -p "$OUT/system"
    deadline=${DEADLINE:-520}
    DEADLINE=$deadline WORK=${WORK:-/tmp/rkv-device-session} timeout $((deadline + 60)) \
        sh "$(dirname "$0")/bench-system.sh" "$PACK" "$OUT/system" >"$OUT/system/log.txt" 2>&1
    grep -E "PASS|FAIL|SKIP" "$OUT/system/log.txt" | tail -24
    grep -E "steps in" "$OUT/system/rkvd-server.log" 2>/dev/null | tail -6 | cut -c1-300
    ;;
models)
    step "gpu_ops_test --model-only"
    timeout 150 "$B/gpu_ops_test" --model-only >"$OUT/model.txt" 2>&1
    echo "rc=$?" >>"$OUT/model.txt"
    grep -E "FAIL|passed|failed|rc=" "$OUT/model.txt" | cut -c1-160 | tail -12
    step "gpu_bench quant (q4_k_m), gemv, the qwen3-8b and gemma3-4b presets"
    timeout 120 "$B/gpu_bench" --suite quant --quick --quant-types bf16,q4_k_m \
        --json "$OUT/quant.json" >"$OUT/quant.txt" 2>&1
    timeout 60 "$B/gpu_bench" --suite gemv --json "$OUT/gemv.json" >"$OUT/gemv.txt" 2>&1
    timeout 120 "$B/gpu_bench" --suite gemm --json "$OUT/gemm.json" >"$OUT/gemm.txt" 2>&1
    python3 "$(dirname "$0")/bench-plot.py" "$OUT/gemm.json" "$OUT" >"$OUT/gemm_targets.txt" 2>&1
    grep -E "targets:|FAIL" "$OUT/gemm_targets.txt" | head -20
    for p in qwen3-8b gemma3-4b; do
        timeout 90 "$B/gpu_bench" --preset $p --suite decode --quick \
            --json "$OUT/decode_$p.json" >"$OUT/decode_$p.txt" 2>&1
    done
    grep -hE "decode b|prefill|gemv Q4_K|rc=" "$OUT"/quant.txt "$OUT"/gemv.txt \
        "$OUT"/decode_*.txt | sed 's/  */ /g'
    ;;
trace)
    step "gpu_bench decode, one traced step a resident case"
    RKV_PROFILE_TRACE=$OUT timeout 200 "$B/gpu_bench" --suite decode --quick \
        --json "$OUT/trace_bench.json" >"$OUT/trace.txt" 2>&1
    echo "rc=$?" >>"$OUT/trace.txt"
    grep -E "decode b=|trace |rc=" "$OUT/trace.txt" | sed 's/  */ /g'
    # batch 1 at 4k in full: its kernels by time and the middle of its step in order
    sed -n '/trace b=1 ctx=4096:/,/decode /p' "$OUT/trace.txt"
    # one layer's phases (medians over the layers) of every traced case
    python3 "$(dirname "$0")/trace-phases.py" "$OUT/trace.csv" >"$OUT/phases.txt" 2>&1
    cat "$OUT/phases.txt"
    step "gpu_bench gemm (quick), one traced product a linear and type"
    mkdir -p "$OUT/tg"
    RKV_PROFILE_TRACE=$OUT/tg timeout 200 "$B/gpu_bench" --suite gemm --quick \
        --json "$OUT/trace_gemm.json" >"$OUT/trace_gemm.txt" 2>&1
    echo "rc=$?" >>"$OUT/trace_gemm.txt"
    grep -E "^  gemm|trace gemm|rc=" "$OUT/trace_gemm.txt" | sed 's/  */ /g' | head -40
    ;;
sample)
    step "gpu_ops_test --sample-only"
    timeout 120 "$B/gpu_ops_test" --sample-only >"$OUT/sample_ops.txt" 2>&1
    echo "rc=$?" >>"$OUT/sample_ops.txt"
    grep -E "FAIL|passed|failed|rc=" "$OUT/sample_ops.txt" | tail -8
    step "compute-sanitizer memcheck of the sampling tests"
    timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 "$B/gpu_ops_test" \
        --sample-only >"$OUT/sample_memcheck.txt" 2>&1
    echo "rc=$?" >>"$OUT/sample_memcheck.txt"
    tail -2 "$OUT/sample_memcheck.txt"
    step "the sampler's phases, batch 64 (us from the kernel's start)"
    RKV_CUDA_SAMPLE_STAMPS=1 RKV_BENCH_B1=0 timeout 120 "$B/gpu_bench" --suite decode --quick \
        >"$OUT/sample_stamps.txt" 2>&1
    grep "stamps row 0 " "$OUT/sample_stamps.txt" | tail -1
    step "gpu_bench decode (quick): greedy against sampled rows"
    timeout 200 "$B/gpu_bench" --suite decode --quick --json "$OUT/sample_decode.json" \
        >"$OUT/sample_decode.txt" 2>&1
    echo "rc=$?" >>"$OUT/sample_decode.txt"
    grep -E "ceiling  hbm|ctx=4096 \(tok|ctx=4096 host=0|sampled|rc=" "$OUT/sample_decode.txt" |
        sed 's/  */ /g'
    ;;
profile)
    step "ncu: the streamed o linear (bf16, add, 4096 wide) of gpu_bench's linear suite"
    # the o instantiation of ls_kernel (mode add, no norm, one 16-byte vector a lane)
    ncu_kernel ncu_o mangled 'ls_kernel.*Li1ELi1ELb0ELi1E' 10 linear 30
    ;;
swa)
    step "swa_check.py: gemma3-4b at 32k, swa_kv window against full"
    mkdir -p "$OUT/swa"
    timeout 570 python3 "$(dirname "$0")/../tests/gpu/swa_check.py" --bin "$B" --out "$OUT/swa" \
        --work "${WORK:-/tmp/rkv-swa-check}" >"$OUT/swa/log.txt" 2>&1
    echo "rc=$?" >>"$OUT/swa/log.txt"
    tail -8 "$OUT/swa/log.txt"
    ;;
profile-q)
    # the gemv suite's first quant_dot launches: Q4_K 4096 x 4096 at n=1 (51 of them), then
    # n=8 (51): one warm launch of each
    for n_skip in "1 10" "8 61"; do
        set -- $n_skip
        step "ncu: the integer-dot decode kernel over Q4_K weights, 4096 x 4096, n=$1"
        ncu_kernel "ncu_q4k_n$1" function quant_dot_kernel "$2" gemv 20
    done
    ;;
*)
    echo "device-session: say check, system, models, trace, sample, swa, profile or profile-q, not $WHAT" >&2
    exit 2
    ;;
esac
tar -czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz --exclude p . 2>/dev/null
echo "device-session: results in $OUT (all.tgz)"

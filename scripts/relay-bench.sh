#!/usr/bin/env bash
# relay-bench.sh - what a step's block tables cost on their way kvmgr -> rkvd -> worker
# (docs/runtime.md, "Block tables through rkvd"): rkvd on the CPU backend decodes BATCH
# streams at once, with prep_ahead off (every step waits for its KV_PREP) and on, and the
# step report's "kvmgr kv_prep" (rkvd's round trip to kvmgr, per step) is read from the
# steady part of each run; then rkv-bench ipc times one nng round trip alone.
#   scripts/relay-bench.sh [BUILD] [BATCH...]      (default: build, batches 1 and 64)
# writes BUILD/relay-bench/summary.txt and each run's rkvd log beside it.
set -euo pipefail
build=${1:-build}
[ $# -gt 0 ] && shift
batches=("$@")
[ ${#batches[@]} -gt 0 ] || batches=(1 64)
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
bin=$build/bin
for p in rkvd rkv-mkmodel rkv-bench; do
  [ -x "$bin/$p" ] || { echo "relay-bench: $bin/$p is not built (make BUILD=$build)" >&2; exit 1; }
done
out=$build/relay-bench
mkdir -p "$out" "$build/models"
model=$build/models/tiny-f32.gguf
name=tiny-f32
[ -f "$model" ] || "$bin/rkv-mkmodel" --preset tiny --dtype f32 --seed 1 --out "$model" >/dev/null
# the runtime dir holds unix sockets: a short path
work=$(mktemp -d /tmp/rkv-relay.XXXXXX)
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# one run: BATCH clients stream requests of 1000 tokens each against a fresh rkvd for
# RELAY_SECONDS (10); prints the medians of the step reports' kv_prep and worker step (a
# report every 0.5 s; the first and last, partly idle, left out)
run() {
  local batch=$1 ahead=$2 log=$out/rkvd-b$1-ahead-$2.log
  rm -rf "$work/state" "$work/run"
  # one cpu thread computes; kvmgr and rkvd's loop have the rest of the machine
  RKV_STEP_REPORT_MS=500 "$bin/rkvd" --model "$model" --listen 127.0.0.1:0 --backend cpu \
    --state-dir "$work/state" --runtime-dir "$work/run" --threads 1 --max-running 64 \
    --prep-ahead "$ahead" --decode-steps 1 >"$log" 2>&1 &
  pid=$!
  local port="" i
  for i in $(seq 300); do
    port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    port=""
    sleep 0.1
  done
  [ -n "$port" ] || { echo "relay-bench: rkvd did not come up, see $log" >&2; exit 1; }
  local end=$((SECONDS + ${RELAY_SECONDS:-10})) cpids=()
  for i in $(seq "$batch"); do
    while [ $SECONDS -lt $end ]; do
      curl -s "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"model\":\"$name\",\"prompt\":\"stream $i\",\"max_tokens\":1000,\"temperature\":0,\"ignore_eos\":true}" \
        >/dev/null
    done &
    cpids+=($!)
  done
  wait "${cpids[@]}"
  kill "$pid"
  wait "$pid" || true
  pid=""
  local reports
  reports=$(sed -n 's/.*worker 0: \([0-9]*\) steps in [0-9.]* s: kvmgr kv_prep \([0-9.]*\) ms.*worker step \([0-9.]*\) ms.*/\1 \2 \3/p' "$log" |
    sed '1d;$d')
  [ -n "$reports" ] || { echo "no steady reports"; return; }
  # the medians of the reports' kv_prep and worker step
  local prep step steps n
  n=$(echo "$reports" | wc -l)
  steps=$(echo "$reports" | awk '{ s += $1 } END { print s }')
  prep=$(echo "$reports" | awk '{ print $2 }' | sort -g | sed -n "$(((n + 1) / 2))p")
  step=$(echo "$reports" | awk '{ print $3 }' | sort -g | sed -n "$(((n + 1) / 2))p")
  echo "$prep ms, worker step $step ms (medians of $n reports, $steps steps)"
}

{
  echo "rkvd --backend cpu --threads 1 --decode-steps 1, model tiny f32, $(nproc) cpus"
  for b in "${batches[@]}"; do
    for ahead in false true; do
      echo "batch $b, prep_ahead $ahead: kvmgr kv_prep $(run "$b" "$ahead")"
    done
  done
  echo
  "$bin/rkv-bench" ipc
} | tee "$out/summary.txt"

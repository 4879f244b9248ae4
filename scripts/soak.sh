#!/bin/sh
# soak.sh - load and soak run (make soak): rkvd on the cpu backend with the tiny model, 256
# concurrent named chat sessions of several streamed turns for MINUTES (default 5); checks no
# errors, flat memory and fds of rkvd/kvmgr/worker, kvmgr's pools back to baseline at the end,
# and reports p50/p99 TTFT, inter-token latency and tokens/s (tests/soak/soak.py).
#   scripts/soak.sh [MINUTES] [soak.py args: --sessions N --turns T ...]
#   env RKV_BUILD (default build): the build tree whose binaries run
# writes $RKV_BUILD/soak/soak.json; exit 0 when every check passed
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
minutes=${1:-5}
[ $# -gt 0 ] && shift
build=${RKV_BUILD:-build}
py=$build/venv/bin/python
[ -x "$py" ] || py=build/venv/bin/python
if [ ! -x "$py" ]; then
    echo "soak: no python venv at $build/venv or build/venv (make venv)" >&2
    exit 1
fi
for b in rkvd rkv-kvmgr rkv-worker rkvctl rkv-mkmodel; do
    if [ ! -x "$build/bin/$b" ]; then
        echo "soak: $build/bin/$b is not built (make BUILD=$build)" >&2
        exit 1
    fi
done
seconds=$(awk "BEGIN { print $minutes * 60 }")
mkdir -p "$build/soak"
RKV_TOP=$top RKV_BUILD=$build exec "$py" tests/soak/soak.py --seconds "$seconds" \
    --out "$build/soak/soak.json" "$@"

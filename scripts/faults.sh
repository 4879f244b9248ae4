#!/bin/sh
# faults.sh - the fault campaign (make faults): rkvd on the cpu backend with the tiny model under
# load from many threads (streamed and non-streamed chat turns in named sessions, completions),
# while worker and kvmgr are SIGKILLed and rkvd is SIGTERMed and restarted on the same state dir,
# for FAULT_MINUTES (default 5). Checks every request completes or ends in a clean error, none
# hangs or is dropped, sqlite integrity after every stop, rkvd's fds and RSS flat, kvmgr's pools
# back to baseline, a reference session afterwards (tests/faults/faults.py).
#   scripts/faults.sh [MINUTES] [faults.py args: --threads N --kills-per-round K ...]
#   env RKV_BUILD (default build): the build tree whose binaries run
# writes $RKV_BUILD/faults/faults.json; exit 0 when every check passed
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
minutes=${1:-${FAULT_MINUTES:-5}}
[ $# -gt 0 ] && shift
build=${RKV_BUILD:-build}
py=$build/venv/bin/python
[ -x "$py" ] || py=build/venv/bin/python
if [ ! -x "$py" ]; then
    echo "faults: no python venv at $build/venv or build/venv (make venv)" >&2
    exit 1
fi
for b in rkvd rkv-kvmgr rkv-worker rkvctl rkv-mkmodel rkv-gen rkv-tok; do
    if [ ! -x "$build/bin/$b" ]; then
        echo "faults: $build/bin/$b is not built (make BUILD=$build)" >&2
        exit 1
    fi
done
seconds=$(awk "BEGIN { print $minutes * 60 }")
mkdir -p "$build/faults"
RKV_TOP=$top RKV_BUILD=$build exec "$py" tests/faults/faults.py --seconds "$seconds" \
    --out "$build/faults/faults.json" --workdir "$build/faults/work" "$@"

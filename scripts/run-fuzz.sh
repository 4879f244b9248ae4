#!/usr/bin/env bash
# runs every libFuzzer binary in DIR for SECONDS each, seeded from
# tests/fuzz/corpus/<target>/ (copied: the committed corpus is not written).
set -u
dir=$1; secs=${2:-20}
top=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$top/build/fuzz"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
fail=0; n=0
for f in "$dir"/fuzz_*; do
  [ -x "$f" ] || continue
  name=$(basename "$f"); n=$((n + 1))
  mkdir -p "$work/$name"
  seed="$top/tests/fuzz/corpus/${name#fuzz_}"
  [ -d "$seed" ] && cp -r "$seed"/. "$work/$name"/ 2>/dev/null
  dict="$top/tests/fuzz/${name#fuzz_}.dict"
  extra=(); [ -f "$dict" ] && extra+=(-dict="$dict")
  echo "fuzz: $name for ${secs}s"
  if ! "$f" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=0 \
       -artifact_prefix="$top/build/fuzz/crash-$name-" "${extra[@]}" "$work/$name" \
       >"$work/$name.log" 2>&1; then
    echo "fuzz: $name FOUND A CRASH (artifact under build/fuzz/):"; tail -n 40 "$work/$name.log"
    fail=1
  else
    grep -E '^#[0-9]+.*(DONE|pulse)' "$work/$name.log" | tail -n 1
  fi
done
echo "fuzz: $n targets, $([ $fail = 0 ] && echo 'no crashes' || echo 'CRASHES FOUND')"
exit $fail

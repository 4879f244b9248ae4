#!/usr/bin/env bash
# runs cmocka unit test binaries and the python tests; prints one closing line
# "N passed, N failed" (CI reads it) and exits non-zero on any failure.
#   run-tests.sh --unit BIN... [--py DIR]
# env: RKV_VALGRIND=1 runs unit tests under valgrind memcheck;
#      RKV_TEST_FILTER=expr passes -k expr to pytest.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
units=(); pydir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --unit) shift; while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do units+=("$1"); shift; done ;;
    --py) pydir="$2"; shift 2 ;;
    *) echo "run-tests.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

# asan builds (make asan): leaks inside nng that rkv cannot free (scripts/lsan.supp)
export LSAN_OPTIONS="suppressions=$top/scripts/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
passed=0; failed=0; failures=()
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
for t in "${units[@]}"; do
  name=$(basename "$t")
  if [ "${RKV_VALGRIND:-0}" = 1 ]; then
    run=(valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect
         --suppressions="$(dirname "$0")/valgrind.supp" "$t")
  else
    run=("$t")
  fi
  "${run[@]}" >"$log/$name.out" 2>&1; rc=$?
  p=$(grep -E '^\[  PASSED  \] [0-9]+ test' "$log/$name.out" | awk '{s+=$4} END {print s+0}')
  f=$(grep -E '^\[  FAILED  \] [0-9]+ test' "$log/$name.out" | awk '{s+=$4} END {print s+0}')
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi  # crashed or valgrind error
  passed=$((passed + p)); failed=$((failed + f))
  if [ "$rc" -ne 0 ]; then
    failures+=("$name")
    echo "--- $name FAILED (exit $rc) ---"; tail -n 60 "$log/$name.out"
  else
    echo "ok   $name ($p tests)"
  fi
done

if [ -n "$pydir" ]; then
  venv="$top/build/venv/bin/python"
  args=(-q -p no:cacheprovider -rfE "$pydir")
  [ -n "${RKV_TEST_FILTER:-}" ] && args+=(-k "$RKV_TEST_FILTER")
  RKV_TOP="$top" "$venv" -m pytest "${args[@]}" 2>&1 | tee "$log/pytest.out"
  rc=${PIPESTATUS[0]}
  last=$(grep -E '(passed|failed|error|no tests ran)' "$log/pytest.out" | tail -n 1)
  p=$(echo "$last" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || true)
  f=$(echo "$last" | grep -oE '[0-9]+ (failed|error|errors)' | grep -oE '[0-9]+' | awk '{s+=$1} END {print s+0}')
  p=${p:-0}; f=${f:-0}
  # 5 = no tests collected, which is fine while a suite is empty
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ] && [ "$f" -eq 0 ]; then f=1; fi
  passed=$((passed + p)); failed=$((failed + f))
  [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ] && failures+=("pytest")
fi

[ ${#failures[@]} -gt 0 ] && echo "failing: ${failures[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ ${#failures[@]} -eq 0 ]

#!/usr/bin/env bash
# Runs every test: the cmocka unit/integration binaries in $BUILD/tests, then the Python
# end-to-end tests (pytest) in tests/py. Ends with the plain line "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export STEPSCOPE_BIN="$PWD/$BUILD/stepscope"
passed=0; failed=0; failed_names=()
for bin in "$BUILD"/tests/test_*; do
    [ -x "$bin" ] || continue
    case "$bin" in *.o|*.d) continue;; esac
    log=$(mktemp)
    "$bin" >"$log" 2>&1; rc=$?
    cat "$log"
    p=$(grep -E '^\[  PASSED  \] [0-9]+ test' "$log" | grep -oE '[0-9]+' | head -1)
    f=$(grep -E '^\[  FAILED  \] [0-9]+ test' "$log" | grep -oE '[0-9]+' | head -1)
    p=${p:-0}; f=${f:-0}
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed or exited badly
    passed=$((passed + p)); failed=$((failed + f))
    [ "$f" -gt 0 ] && failed_names+=("$(basename "$bin")")
    rm -f "$log"
done
if [ -d tests/py ] && [ -z "${SKIP_PY:-}" ]; then
    log=$(mktemp)
    python3 -m pytest -q -p no:cacheprovider tests/py 2>&1 | tee "$log"
    p=$(tail -1 "$log" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+'); p=${p:-0}
    f=$(tail -1 "$log" | grep -oE '[0-9]+ (failed|error)' | grep -oE '[0-9]+' | paste -sd+ | bc); f=${f:-0}
    passed=$((passed + p)); failed=$((failed + f))
    [ "$f" -gt 0 ] && failed_names+=("pytest")
    rm -f "$log"
fi
[ ${#failed_names[@]} -gt 0 ] && echo "failing: ${failed_names[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

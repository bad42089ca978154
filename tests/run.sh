#!/usr/bin/env bash
# Runs every test: the cmocka binaries of each build in $BUILDS (default "build"; CI adds the
# ASan+UBSan build "build-san"), then the Python end-to-end tests (pytest) against the first
# build, and against build-san when it is in $BUILDS. Ends with the plain line "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
BUILDS=${BUILDS:-build}
first_build=${BUILDS%% *}
export STEPSCOPE_BIN="$PWD/$first_build/stepscope" STEPSCOPE_BUILD="$first_build"
# oneDNN and libgomp keep process-lifetime caches that LeakSanitizer would report.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
passed=0; failed=0; failed_names=()
for build in $BUILDS; do
    for bin in "$build"/tests/test_*; do
        [ -x "$bin" ] || continue
        case "$bin" in *.o|*.d) continue;; esac
        echo "== $bin"
        log=$(mktemp)
        "$bin" >"$log" 2>&1; rc=$?
        cat "$log"
        p=$(grep -E '^\[  PASSED  \] [0-9]+ test' "$log" | grep -oE '[0-9]+' | head -1)
        f=$(grep -E '^\[  FAILED  \] [0-9]+ test' "$log" | grep -oE '[0-9]+' | head -1)
        p=${p:-0}; f=${f:-0}
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed or exited badly
        passed=$((passed + p)); failed=$((failed + f))
        [ "$f" -gt 0 ] && failed_names+=("$bin")
        rm -f "$log"
    done
done
# pytest_pass NAME [pytest args...]: one pytest run, its counts added to the totals.
pytest_pass() {
    local name=$1; shift
    echo "== $name"
    log=$(mktemp)
    "$PY" -m pytest -q -p no:cacheprovider "$@" 2>&1 | tee "$log"
    last=$(grep -E '(passed|failed|error|skipped)' "$log" | tail -1)
    p=$(echo "$last" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+'); p=${p:-0}
    f=$(echo "$last" | grep -oE '[0-9]+ (failed|error|errors)' | grep -oE '[0-9]+' | paste -sd+ | bc); f=${f:-0}
    [ "$p" -eq 0 ] && [ "$f" -eq 0 ] && f=1   # pytest could not run at all
    passed=$((passed + p)); failed=$((failed + f))
    [ "$f" -gt 0 ] && failed_names+=("$name")
    rm -f "$log"
}
if [ -d tests/py ] && [ -z "${SKIP_PY:-}" ]; then
    pytest_pass "pytest tests/py" tests/py
    # The end-to-end tests again on the ASan+UBSan binary, less valgrind's (its own build),
    # the data-prefetch timing tests (they assume a step faster than ASan's) and the
    # real-width determinism check (minutes under ASan; its subject is the libraries' threading).
    case " $BUILDS " in *" build-san "*)
        STEPSCOPE_BIN="$PWD/build-san/stepscope" pytest_pass "pytest tests/py (build-san)" tests/py \
            -k "not valgrind and not slow_data_wait and not fast_data_is_prefetched and not at_real_width";;
    esac
fi
[ ${#failed_names[@]} -gt 0 ] && echo "failing: ${failed_names[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

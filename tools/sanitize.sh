#!/usr/bin/env bash
# The process tests with sanitized programs (docs/testing.md, "Sanitizers"):
# builds the programs that the integration and chaos tests start (the
# coordinator, the worker, cohortctl, cohort-sim and the test ranks) under a
# sanitizer in their own build tree, then runs the release build's tests
# with COHORT_TEST_PROGRAMS_DIR pointing there (tests/testing/paths.h), so
# every process a test starts is instrumented.
#
#   tools/sanitize.sh address [CTEST ARGS...]   ASan + UBSan, build/asan
#   tools/sanitize.sh thread  [CTEST ARGS...]   TSan, build/tsan
#
# CTEST ARGS default to every integration and chaos test (the multi-host
# ones and the Python client's included) but the GPU ones and the deploy/
# scrape check. Every report a sanitizer writes goes to a
# file of its own (its options' log_path); the run fails if any was written,
# whatever the tests said, and prints them. tools/dev test --sanitize=KIND
# builds the release tree first and runs this.
#
# Environment: COHORT_BUILD_DIR (the release tree whose tests run, default
# build/release), COHORT_SANITIZE_BUILD_DIR (default build/asan or
# build/tsan), COHORT_JOBS (build parallelism, default nproc),
# COHORT_SANITIZE_REPORTS (where reports go, default a new directory under
# /tmp, kept when a report was written).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RELEASE_DIR="${COHORT_BUILD_DIR:-$ROOT/build/release}"
JOBS="${COHORT_JOBS:-$(nproc)}"
# The programs the process tests start (tests/testing/paths.h names them).
PROGRAMS=(cohort-coordinator cohort-worker cohortctl cohort-sample cohort-sim cohort-comm-test-rank
          cohort-train-test-rank)

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'tools/sanitize.sh: %s\n' "$*" >&2; exit 1; }

kind=${1:-}
shift || true
case "$kind" in
  address) short=asan ;;
  thread) short=tsan ;;
  *) die "usage: tools/sanitize.sh address|thread [CTEST ARGS...] (got '${kind}')" ;;
esac
SAN_DIR="${COHORT_SANITIZE_BUILD_DIR:-$ROOT/build/$short}"
[[ -f "$RELEASE_DIR/CTestTestfile.cmake" ]] ||
  die "no release build with tests in $RELEASE_DIR: run tools/dev build first"

export CCACHE_BASEDIR="$ROOT"
if [[ ! -f "$SAN_DIR/build.ninja" ]]; then
  log "configuring $SAN_DIR ($kind sanitizer, no CUDA)"
  cmake -S "$ROOT" -B "$SAN_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCOHORT_SANITIZE="$kind" -DCOHORT_ENABLE_CUDA=OFF >/dev/null
fi
log "building ${PROGRAMS[*]} under the $kind sanitizer with $JOBS jobs"
start=$SECONDS
cmake --build "$SAN_DIR" -j "$JOBS" --target "${PROGRAMS[@]}"
log "sanitized build took $((SECONDS - start)) s"

reports="${COHORT_SANITIZE_REPORTS:-$(mktemp -d "/tmp/cohort-$short-reports.XXXXXX")}"
mkdir -p "$reports"
# Reports go to files (one per process: log_path.PID) rather than stderr,
# which tests capture and throw away when they pass. A finding does not stop
# the suite; the check after it fails the run.
export ASAN_OPTIONS="log_path=$reports/asan:detect_leaks=1:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export LSAN_OPTIONS="suppressions=$ROOT/tools/sanitizers/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export UBSAN_OPTIONS="log_path=$reports/ubsan:print_stacktrace=1:suppressions=$ROOT/tools/sanitizers/ubsan.supp${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export TSAN_OPTIONS="log_path=$reports/tsan:second_deadlock_stack=1:history_size=4:suppressions=$ROOT/tools/sanitizers/tsan.supp${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
export COHORT_TEST_PROGRAMS_DIR="$SAN_DIR"

if (($# == 0)); then
  # deploy_prometheus_scrape checks deploy/ against the release programs.
  set -- -L 'integration|chaos' -LE gpu -E '^deploy_'
fi
log "running ctest $* with $kind-sanitized programs; reports in $reports"
start=$SECONDS
status=0
# Sanitized programs run 2-3x (ASan) to 5-15x (TSan) slower: a longer
# per-test limit than the plain run's.
(cd "$RELEASE_DIR" && ctest --output-on-failure --timeout 900 -j 2 "$@") || status=$?
log "tests finished in $((SECONDS - start)) s (exit $status)"

shopt -s nullglob
found=("$reports"/asan.* "$reports"/ubsan.* "$reports"/tsan.*)
if ((${#found[@]} > 0)); then
  log "${#found[@]} sanitizer report(s) in $reports:"
  for file in "${found[@]}"; do
    printf '\n----- %s -----\n' "$file"
    head -n 80 "$file"
  done
  exit 1
fi
log "no sanitizer report"
[[ -n "${COHORT_SANITIZE_REPORTS:-}" ]] || rmdir "$reports"
exit "$status"

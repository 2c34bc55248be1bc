#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, docs/fuzzing.md) with clang-19 and
# ASan + UBSan in build/fuzz, runs the fuzz regression tests under the same
# sanitizers, then runs each target for N seconds on a copy of its seed
# corpus and prints executions, exec/s, coverage and crashes per target.
#
#   tools/fuzz.sh [--seconds N] [TARGET...]   fuzz (default 30 s each, every target)
#   tools/fuzz.sh --replay [TARGET...]        run each corpus input once (a quick check)
#   tools/fuzz.sh --seeds                     rewrite fuzz/corpus/ and fuzz/dict/ from
#                                             make_fuzz_seeds (then commit them)
#   tools/fuzz.sh --build                     build only
#   --corpus-dir DIR                          fuzz in DIR/<target> (seeded from fuzz/corpus,
#                                             kept afterwards) instead of a temporary copy,
#                                             so that later runs start where this one ended
#
# Exits non-zero if a target crashes, leaks, hangs (> 10 s on one input) or
# runs out of memory; the input is saved under build/fuzz/crashes/ and the
# command to replay it is printed. The committed corpus is never modified.
#
# Environment: COHORT_FUZZ_BUILD_DIR (default build/fuzz), COHORT_JOBS (build
# parallelism, default nproc).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${COHORT_FUZZ_BUILD_DIR:-$ROOT/build/fuzz}"
JOBS="${COHORT_JOBS:-$(nproc)}"
ALL_TARGETS=(job_spec_fuzzer coordinator_rpc_fuzzer checkpoint_manifest_fuzzer token_shard_fuzzer
             peer_input_fuzzer weights_file_fuzzer)

PACKAGES=(
  cmake ninja-build ccache pkg-config
  clang-19 libfuzzer-19-dev libclang-rt-19-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev prometheus-cpp-dev libyaml-cpp-dev libssl-dev libgtest-dev libgmock-dev
  libicu-dev
)

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'tools/fuzz.sh: %s\n' "$*" >&2; exit 1; }

deps() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  log "installing ${missing[*]}"
  local sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

build() {
  deps
  export CCACHE_BASEDIR="$ROOT"
  if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
    log "configuring $BUILD_DIR (clang-19, ASan + UBSan + libFuzzer)"
    cmake -S "$ROOT/fuzz" -B "$BUILD_DIR" -G Ninja \
      -DCMAKE_CXX_COMPILER=clang++-19 -DCMAKE_C_COMPILER=clang-19
  fi
  log "building the fuzz targets with $JOBS jobs"
  cmake --build "$BUILD_DIR" -j "$JOBS"
}

# The sanitizer settings of every run: reports abort (so libFuzzer saves the
# input), with stack traces; leaks are findings.
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
if [[ -z "${ASAN_SYMBOLIZER_PATH:-}" && -x /usr/lib/llvm-19/bin/llvm-symbolizer ]]; then
  export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-19/bin/llvm-symbolizer
fi

regression_tests() {
  local test failed=0
  shopt -s nullglob
  for test in "$BUILD_DIR"/*_fuzz_regression_test; do
    log "$(basename "$test") (sanitized)"
    "$test" --gtest_brief=1 || failed=1
  done
  shopt -u nullglob
  ((failed == 0)) || die "a fuzz regression test failed"
}

# The value of `stat::NAME:` in a libFuzzer log, or "?".
final_stat() { awk -v k="stat::$2:" '$1 == k { v = $2 } END { print (v == "" ? "?" : v) }' "$1"; }
# cov: and ft: of the last status line.
coverage() {
  awk '/ (cov|ft): / { for (i = 1; i < NF; ++i) { if ($i == "cov:") c = $(i+1); if ($i == "ft:") f = $(i+1) } }
       END { printf "%s %s", (c == "" ? "?" : c), (f == "" ? "?" : f) }' "$1"
}

SECONDS_PER_TARGET=30
MODE=fuzz
CORPUS_DIR=""
TARGETS=()
while (($#)); do
  case "$1" in
    --seconds) SECONDS_PER_TARGET="${2:?--seconds needs a number}"; shift 2 ;;
    --seconds=*) SECONDS_PER_TARGET="${1#*=}"; shift ;;
    --corpus-dir) CORPUS_DIR="${2:?--corpus-dir needs a directory}"; shift 2 ;;
    --corpus-dir=*) CORPUS_DIR="${1#*=}"; shift ;;
    --replay) MODE=replay; shift ;;
    --seeds) MODE=seeds; shift ;;
    --build) MODE=build; shift ;;
    -h|--help) sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
[[ "$SECONDS_PER_TARGET" =~ ^[0-9]+$ && "$SECONDS_PER_TARGET" -gt 0 ]] || die "--seconds must be a positive integer"
((${#TARGETS[@]})) || TARGETS=("${ALL_TARGETS[@]}")
for t in "${TARGETS[@]}"; do
  [[ " ${ALL_TARGETS[*]} " == *" $t "* ]] || die "unknown target $t (targets: ${ALL_TARGETS[*]})"
done

build
case "$MODE" in
  build) exit 0 ;;
  seeds)
    log "writing fuzz/corpus and fuzz/dict"
    "$BUILD_DIR/make_fuzz_seeds" "$ROOT/fuzz/corpus" "$ROOT/fuzz/dict"
    exit 0 ;;
esac
regression_tests

CRASH_DIR="$BUILD_DIR/crashes"
mkdir -p "$CRASH_DIR"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/cohort-fuzz.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

declare -a ROWS=()
failures=0
for t in "${TARGETS[@]}"; do
  corpus="${CORPUS_DIR:-$WORK}/$t"
  mkdir -p "$corpus"
  if [[ -d "$ROOT/fuzz/corpus/$t" ]]; then cp -n "$ROOT/fuzz/corpus/$t"/* "$corpus"/ 2>/dev/null || true; fi
  args=(-print_final_stats=1 -timeout=10 -rss_limit_mb=2560 "-artifact_prefix=$CRASH_DIR/$t-")
  [[ -f "$ROOT/fuzz/dict/$t.dict" ]] && args+=("-dict=$ROOT/fuzz/dict/$t.dict")
  if [[ $MODE == replay ]]; then
    args+=(-runs=0)
    log "$t: replaying its corpus"
  else
    args+=("-max_total_time=$SECONDS_PER_TARGET")
    log "$t: fuzzing for ${SECONDS_PER_TARGET}s"
  fi
  before="$(ls "$CRASH_DIR" | grep -c "^$t-" || true)"
  run_log="$WORK/$t.log"
  rc=0
  (cd "$WORK" && "$BUILD_DIR/$t" "${args[@]}" "$corpus") >"$run_log" 2>&1 || rc=$?
  after="$(ls "$CRASH_DIR" | grep -c "^$t-" || true)"
  crashes=$((after - before))
  if ((rc != 0 && crashes == 0)); then crashes=1; fi  # e.g. a crash while loading the corpus
  read -r cov ft <<<"$(coverage "$run_log")"
  ROWS+=("$(printf '%-28s %12s %8s %8s %8s %8s' "$t" "$(final_stat "$run_log" number_of_executed_units)" \
    "$(final_stat "$run_log" average_exec_per_sec)" "$cov" "$ft" "$crashes")")
  if ((crashes > 0)); then
    failures=$((failures + 1))
    cp "$run_log" "$CRASH_DIR/$t.log"
    printf '\n--- %s: finding (log: %s) ---\n' "$t" "$CRASH_DIR/$t.log" >&2
    grep -E -m 12 'ERROR: |runtime error|fuzz finding|Check failed|SUMMARY' "$run_log" >&2 || tail -20 "$run_log" >&2
    for input in $(ls -t "$CRASH_DIR" | grep "^$t-" | grep -v '\.log$' | head -n "$crashes"); do
      printf 'input: %s\nreplay: %s %s\n' "$CRASH_DIR/$input" "$BUILD_DIR/$t" "$CRASH_DIR/$input" >&2
    done
  fi
done

printf '\n%-28s %12s %8s %8s %8s %8s\n' TARGET EXECUTIONS EXEC/S COV FT CRASHES
printf '%s\n' "${ROWS[@]}"
((failures == 0)) || die "$failures target(s) found a crash; inputs in $CRASH_DIR"

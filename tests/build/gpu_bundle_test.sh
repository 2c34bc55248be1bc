#!/usr/bin/env bash
# Checks the GPU device check end to end where there is no GPU: `tools/dev
# gpu-bundle` packs this build, `gpu-check` unpacks and runs it, and
#   - the programs the GPU tests start are where the tests look for them;
#   - every program in the archive finds every library it loads in the
#     archive's lib/, the C and C++ runtimes or CUDA's own (which the GPU
#     machine provides); UCX's transport module is there;
#   - every binary of the gpu label ran and its tests passed or skipped;
#   - gpu-check left exactly summary.txt and gpu-check-logs.tar.gz in $OUT
#     (a device call brings back only a few files), and exited 0.
# A GPU machine gives one try of a few minutes: what breaks here would waste it.
#
#   gpu_bundle_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail

source_dir=$1
build_dir=$2
# $work, fail, $status; the bundle in $work/bundle.
# shellcheck source=tests/build/gpu_bundle_common.sh
source "$source_dir/tests/build/gpu_bundle_common.sh"
mkdir -p "$work/tree"
tar -C "$work/tree" -xzf "$work/bundle/cohort-gpu.tar.gz"
[[ -f $work/tree/lib/ucx/libuct_cma.so.0 ]] || fail "no UCX cma module in lib/ucx/"
# The programs gpu_training_test starts, where tests/testing/paths.h looks.
for helper in tests/cohort-train-test-rank coordinator/cohort-coordinator worker/cohort-worker; do
  [[ -x $work/tree/$helper ]] || fail "no $helper in the archive"
done
for program in "$work"/tree/{bin,tests,coordinator,worker}/* "$work/tree/bench/cohort-bench-gpu" \
  "$work"/tree/lib/ucx/*; do
  # Whatever resolves outside the archive must be a library the GPU machine has.
  while read -r lib path; do
    case "$lib" in
      libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libgcc_s.so* | \
        libstdc++.so* | libcudart.so* | libnccl.so* | libcublas*) ;;
      *) fail "$(basename "$program") loads $lib from $path, outside the bundle" ;;
    esac
  done < <(LD_LIBRARY_PATH="$work/tree/lib" ldd "$program" |
    awk -v lib="$work/tree/lib/" '$2 == "=>" && index($3, lib) != 1 {print $1, $3}')
done

expected=$(cd "$build_dir" && ctest -L gpu --show-only=json-v1 | python3 -c 'import json, sys
print("\n".join(sorted({t["command"][0].rsplit("/", 1)[1] for t in json.load(sys.stdin)["tests"]})))')
rc=0
OUT="$work/out" GPU_CHECK_DEADLINE=240 bash "$work/bundle/gpu-check" >"$work/stdout" 2>"$work/stderr" ||
  rc=$?
((rc == 0)) || fail "gpu-check exited $rc"
for binary in $expected; do
  row=$(grep -E "^\| $binary \|" "$work/stdout" || true)
  [[ -n $row ]] || { fail "$binary: no row in gpu-check's table"; continue; }
  # | name | tests | passed | failed | skipped | exit | s |
  read -r tests passed failed skipped code < <(awk -F'|' '{print $3, $4, $5, $6, $7}' <<<"$row")
  ((tests > 0 && failed == 0 && code == 0 && passed + skipped == tests)) ||
    fail "$binary: $row"
done
left=$(find "$work/out" -mindepth 1 -printf '%P\n' | sort | tr '\n' ' ')
[[ $left == "gpu-check-logs.tar.gz summary.txt " ]] ||
  fail "\$OUT holds ${left}not just summary.txt and gpu-check-logs.tar.gz"
cmp -s "$work/stdout" "$work/out/summary.txt" || fail "summary.txt is not what gpu-check printed"
if ((status != 0)); then
  cat "$work/stdout"
  exit 1
fi
echo "ok: $(wc -w <<<"$expected") gpu binaries ran from the bundle; $(du -sm "$work/bundle" | cut -f1) MiB"

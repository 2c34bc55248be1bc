#!/usr/bin/env bash
# The GPU device check cannot pass having run nothing on a GPU (issue 45):
# where `nvidia-smi -L` lists a GPU, tools/gpu-check sets
# COHORT_GPU_REQUIRED=1, and a GPU test that then finds no usable device
# fails instead of skipping. Here a fake nvidia-smi lists one GPU and
# CUDA_VISIBLE_DEVICES hides any real one, as a machine whose driver or
# libraries do not work would:
#   - gpu-check exits non-zero, says the GPU was required, and its summary
#     names the failing tests;
#   - a gpu binary that exits 0 having run no test fails the check too.
# Before the switch, the same run skipped every GPU case and exited 0.
# Restricted to the quick binaries (GPU_CHECK_BINARIES) and to the tests
# (GPU_CHECK_STEPS), within a short deadline.
#
#   gpu_check_required_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail

source_dir=$1
build_dir=$2
# $work, fail, $status; the bundle in $work/bundle.
# shellcheck source=tests/build/gpu_bundle_common.sh
source "$source_dir/tests/build/gpu_bundle_common.sh"
mkdir -p "$work/fake"
cat >"$work/fake/nvidia-smi" <<'EOF'
#!/bin/sh
# One GPU listed, none usable (gpu_check_required_test.sh).
case "$1" in
  -L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
  --query-gpu=*) echo "NVIDIA H100 80GB HBM3 (a fake nvidia-smi), 580.00, 81559 MiB" ;;
  *) echo "a fake nvidia-smi: one GPU listed" ;;
esac
EOF
chmod +x "$work/fake/nvidia-smi"
# check NAME ARGS...: runs gpu-check as the device run would, with the fake
# nvidia-smi first on PATH and no CUDA device visible; its output in
# $work/NAME.out, its exit status in $work/NAME.rc.
check() {
  local name=$1
  shift
  local rc=0
  env -u COHORT_GPU_REQUIRED PATH="$work/fake:$PATH" CUDA_VISIBLE_DEVICES= OUT="$work/$name" \
    GPU_CHECK_STEPS=tests GPU_CHECK_DEADLINE=60 "$@" >"$work/$name.out" 2>"$work/$name.err" || rc=$?
  echo "$rc" >"$work/$name.rc"
}

binaries="unit_worker_device_discovery_test unit_compute_cuda_backend_test unit_model_gpt_cuda_parity_test"
check listed GPU_CHECK_BINARIES="$binaries" bash "$work/bundle/gpu-check"
(($(cat "$work/listed.rc") != 0)) || fail "gpu-check exited 0 with a GPU listed and none usable"
grep -q "GPU required (COHORT_GPU_REQUIRED=1; nvidia-smi -L lists 1 GPU(s))" "$work/listed.out" ||
  fail "the summary does not say the GPU was required"
for binary in $binaries; do
  row=$(grep -E "^\| $binary \|" "$work/listed.out" || true)
  # | name | tests | passed | failed | skipped | exit | s | verdict |
  read -r failed code verdict < <(awk -F'|' '{print $5, $7, $9}' <<<"$row")
  [[ -n $row && ${failed:-0} -gt 0 && $code != 0 && $verdict == FAILED ]] ||
    fail "$binary: not a failing row: ${row:-none}"
done
for test in DeviceDiscoveryTest.GpuDiscoveryAndSelfTest \
  CudaDeviceTest.AnArenaLargerThanTheDeviceFailsAtCreation \
  GptCudaParityTest.OneStepMatchesTheCpuBackend; do
  grep -q -- "failed $test\$" "$work/listed.out" || fail "the summary does not name $test as failed"
done
grep -q "COHORT_GPU_REQUIRED=1 .*yet this test has none to run on: " "$work/listed.out" ||
  fail "the summary does not show why the tests failed"
# The inverse check, on the no-GPU error path, still runs and passes.
grep -q "failed CudaBackendTest.NoDeviceIsAFailedPreconditionNamingIt" "$work/listed.out" &&
  fail "the no-device test failed under COHORT_GPU_REQUIRED=1"

# A binary that exits 0 without running a test: the unpacked bundle with
# one more file in bin/, which writes gtest's XML of no test.
mkdir -p "$work/tree"
tar -C "$work/tree" -xzf "$work/bundle/cohort-gpu.tar.gz"
cp "$work/bundle/gpu-check" "$work/tree/"
cat >"$work/tree/bin/unit_empty_test" <<'EOF'
#!/bin/sh
xml=${1#--gtest_output=xml:}
echo '<?xml version="1.0" encoding="UTF-8"?><testsuites tests="0" failures="0"></testsuites>' >"$xml"
EOF
chmod +x "$work/tree/bin/unit_empty_test"
check empty GPU_CHECK_BINARIES=unit_empty_test bash "$work/tree/gpu-check"
(($(cat "$work/empty.rc") != 0)) || fail "gpu-check exited 0 for a binary that ran no test"
grep -qE '^\| unit_empty_test \| 0 \| 0 \| 0 \| 0 \| 0 \| [0-9]+ \| FAILED: ran no test \|$' \
  "$work/empty.out" || fail "no 'ran no test' row for unit_empty_test"

if ((status != 0)); then
  for name in listed empty; do
    echo "--- gpu-check ($name) exited $(cat "$work/$name.rc"):"
    cat "$work/$name.out" "$work/$name.err"
  done
  exit 1
fi
echo "ok: with a GPU listed and none usable, gpu-check fails and names the tests; a binary" \
  "that ran no test fails it too"

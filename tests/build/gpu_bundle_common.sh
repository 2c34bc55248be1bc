# Sourced by the checks of the GPU device check (gpu_bundle_test.sh,
# gpu_check_required_test.sh), with source_dir and build_dir set: makes
# $work (removed on exit), defines fail (prints, and sets status to 1), and
# packs the build as it is into $work/bundle with `tools/dev gpu-bundle`.
# shellcheck shell=bash disable=SC2034,SC2154
# (source_dir and build_dir come from, and status goes to, the sourcing script.)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
fail() {
  echo "FAIL $*"
  status=1
}

COHORT_BUILD_DIR=$build_dir COHORT_BUNDLE_PREBUILT=1 "$source_dir/tools/dev" gpu-bundle "$work/bundle" >"$work/pack.log" 2>&1 ||
  { cat "$work/pack.log"; echo "FAIL tools/dev gpu-bundle"; exit 1; }

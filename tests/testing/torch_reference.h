#pragma once
// Running a PyTorch reference (tests/reference/*.py) that a test compares
// against, and the comparison. Header-only: the script is found through COHORT_SOURCE_DIR,
// which every test binary defines.

#include <cmath>
#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "tests/testing/paths.h"
#include "tests/testing/subprocess.h"

namespace cohort::testing {

// Runs `PythonPath() tests/reference/<script> <dir>`; OK when it exits 0.
// Otherwise FailedPrecondition, saying how to install torch, when python3
// cannot run or the script cannot import torch (the scripts exit 3 then),
// or Internal with the script's output. The caller fails the test on
// either: a silently skipped comparison would hide regressions.
inline absl::Status RunTorchReference(absl::string_view script, const std::string& dir) {
  const std::string path = absl::StrCat(COHORT_SOURCE_DIR, "/tests/reference/", script);
  absl::StatusOr<CommandResult> run = RunCommand(PythonPath(), {path, dir}, absl::Seconds(45));
  if (!run.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(run.status().ToString(), "\nNeeds ", PythonPath(),
                     " with torch: run `tools/dev deps` (installs python3-torch)."));
  }
  if (run->exit_code == 3) {
    return absl::FailedPreconditionError(
        absl::StrCat("PyTorch is not importable by ", PythonPath(),
                     ": run `tools/dev deps` (installs python3-torch).\n", run->output));
  }
  if (run->exit_code != 0) {
    return absl::InternalError(
        absl::StrCat(script, " exited with ", run->exit_code, ":\n", run->output));
  }
  return absl::OkStatus();
}

// How a result compares with its reference: ||actual - expected|| /
// ||expected|| over n floats (Frobenius, in double), or the absolute norm
// of the difference where `expected` is zero.
inline double RelativeError(const float* actual, const float* expected, size_t n) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(actual[i]) - expected[i];
    diff += d * d;
    norm += static_cast<double>(expected[i]) * expected[i];
  }
  return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

}  // namespace cohort::testing

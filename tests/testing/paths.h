#pragma once
// Where the project's binaries and a test's scratch files live.

#include <string>
#include <string_view>

namespace cohort::testing {

// The build tree's root: $COHORT_BINARY_DIR if set, else derived from the
// running test binary (tests live in <build>/tests/, so the parent of the
// executable's directory).
std::string BinaryDir();

// Path of a project binary in the build tree: "cohort-coordinator",
// "cohort-worker", "cohortctl" or "cohort-sim" map to their folders
// (coordinator/, worker/, tools/); any other name is taken relative to
// BinaryDir(). The file need not exist.
std::string BinaryPath(std::string_view name);

// A fresh, empty directory under ::testing::TempDir() (which honours
// $TEST_TMPDIR / $TMPDIR) whose name starts with `prefix`. Removed with
// everything in it when the test binary exits after all its tests passed;
// kept (and listed on stderr) when one failed or COHORT_KEEP_TEST_DIRS is
// set. Aborts the test binary if it cannot be created (the test could not
// proceed).
std::string MakeTempDir(std::string_view prefix);

// The python3 that runs the PyTorch references (tests/reference/*.py):
// $COHORT_PYTHON if set, else Debian's /usr/bin/python3 (where
// python3-torch lives, which a pyenv or venv python3 earlier on $PATH
// would hide), else "python3".
std::string PythonPath();

}  // namespace cohort::testing

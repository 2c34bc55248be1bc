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
// BinaryDir(). The file need not exist. Where $COHORT_TEST_PROGRAMS_DIR names
// another build tree (a sanitizer build: tools/dev test --sanitize=...) that
// holds the program, its copy there is taken instead, so that the processes
// a test starts are the instrumented ones; programs that build lacks come
// from BinaryDir().
std::string BinaryPath(std::string_view name);

// Whether the coordinator and worker that tests start come from a sanitizer
// build ($COHORT_TEST_PROGRAMS_DIR, BinaryPath). Memory figures of such
// processes (RSS) say nothing of the release build's: ASan keeps freed
// memory in quarantine and maps shadow memory, so tests skip their RSS
// bounds then (and still run what they send).
bool ProgramsAreSanitized();

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

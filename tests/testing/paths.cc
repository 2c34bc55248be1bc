#include "tests/testing/paths.h"

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "gtest/gtest.h"

namespace cohort::testing {
namespace {

std::string ExecutableDir() {
  std::error_code error;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  CHECK(!error) << "cannot read /proc/self/exe: " << error.message();
  return exe.parent_path().string();
}

// Directories made by MakeTempDir in this process, removed when it exits
// after every test passed (kept, and named on stderr, when one failed or
// COHORT_KEEP_TEST_DIRS is set, for a look at the logs inside). Only the
// process that made them removes them: a forked child exiting must not.
struct TempDirs {
  std::mutex mu;
  std::vector<std::string> paths;
  pid_t owner = 0;
};

TempDirs& Made() {
  static TempDirs* dirs = new TempDirs;  // never destroyed: used at exit
  return *dirs;
}

void RemoveTempDirs() {
  TempDirs& dirs = Made();
  std::lock_guard<std::mutex> lock(dirs.mu);
  if (::getpid() != dirs.owner || dirs.paths.empty()) return;
  const char* keep = std::getenv("COHORT_KEEP_TEST_DIRS");
  const bool passed = ::testing::UnitTest::GetInstance()->Passed();
  if (!passed || (keep != nullptr && keep[0] != '\0')) {
    std::fprintf(stderr, "test directories kept (%s):\n", passed ? "COHORT_KEEP_TEST_DIRS" : "a test failed");
    for (const std::string& path : dirs.paths) std::fprintf(stderr, "  %s\n", path.c_str());
    return;
  }
  for (const std::string& path : dirs.paths) {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
}

}  // namespace

std::string BinaryDir() {
  const char* env = std::getenv("COHORT_BINARY_DIR");
  if (env != nullptr && env[0] != '\0') return env;
  return std::filesystem::path(ExecutableDir()).parent_path().string();
}

std::string BinaryPath(std::string_view name) {
  std::string subdir;
  if (name == "cohort-coordinator") {
    subdir = "coordinator/";
  } else if (name == "cohort-worker") {
    subdir = "worker/";
  } else if (name == "cohortctl" || name == "cohort-sim") {
    subdir = "tools/";
  }
  const std::string relative = subdir + std::string(name);
  const char* programs = std::getenv("COHORT_TEST_PROGRAMS_DIR");
  if (programs != nullptr && programs[0] != '\0') {
    std::string path = absl::StrCat(programs, "/", relative);
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return absl::StrCat(BinaryDir(), "/", relative);
}

bool ProgramsAreSanitized() {
  const char* programs = std::getenv("COHORT_TEST_PROGRAMS_DIR");
  if (programs == nullptr || programs[0] == '\0') return false;
  return BinaryPath("cohort-coordinator").rfind(programs, 0) == 0;
}

std::string MakeTempDir(std::string_view prefix) {
  std::string base = ::testing::TempDir();
  if (base.empty()) base = "/tmp/";
  if (base.back() != '/') base.push_back('/');
  std::string clean(prefix);
  for (char& c : clean) {
    if (c == '/') c = '_';
  }
  std::string pattern = absl::StrCat(base, clean, "_XXXXXX");
  CHECK(::mkdtemp(pattern.data()) != nullptr)
      << "mkdtemp(" << pattern << "): " << std::strerror(errno);
  TempDirs& dirs = Made();
  std::lock_guard<std::mutex> lock(dirs.mu);
  if (dirs.owner != ::getpid()) {
    dirs.owner = ::getpid();
    dirs.paths.clear();  // a forked child's own list
    std::atexit(RemoveTempDirs);
  }
  dirs.paths.push_back(pattern);
  return pattern;
}

std::string PythonPath() {
  if (const char* python = std::getenv("COHORT_PYTHON"); python != nullptr && python[0] != '\0') {
    return python;
  }
  if (access("/usr/bin/python3", X_OK) == 0) return "/usr/bin/python3";
  return "python3";
}

}  // namespace cohort::testing

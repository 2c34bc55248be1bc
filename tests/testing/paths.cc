#include "tests/testing/paths.h"

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

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
  return absl::StrCat(BinaryDir(), "/", subdir, std::string(name));
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
  return pattern;
}

}  // namespace cohort::testing

#include "worker/comm/file_kv_client.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace cohort::comm {
namespace {

absl::Status ErrnoStatus(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<FileKvClient>> FileKvClient::Create(const std::string& directory) {
  if (directory.empty()) return absl::InvalidArgumentError("kv directory: must not be empty");
  if (::mkdir(directory.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv directory ", directory, ": ", std::strerror(errno)));
  }
  struct stat info {};
  if (::stat(directory.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("kv directory ", directory, " is not a directory"));
  }
  return std::unique_ptr<FileKvClient>(new FileKvClient(directory));
}

absl::StatusOr<std::string> FileKvClient::PathFor(const std::string& key) const {
  if (key.empty()) return absl::InvalidArgumentError("key: must not be empty");
  std::string name;
  for (char c : key) {
    if (c == '/') {
      name += '_';
    } else if (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') {
      name += c;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("key \"", key, "\": only [A-Za-z0-9._-/] are allowed"));
    }
  }
  return absl::StrCat(directory_, "/", name);
}

absl::Status FileKvClient::Set(const std::string& key, const std::string& value) {
  absl::StatusOr<std::string> path = PathFor(key);
  if (!path.ok()) return path.status();
  // Unique per process and call, so concurrent writers never share a temp file.
  static std::atomic<uint64_t> counter{0};
  const std::string temp = absl::StrCat(*path, ".tmp.", ::getpid(), ".", counter++);
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out.write(value.data(), static_cast<std::streamsize>(value.size())) || !out.flush()) {
      return ErrnoStatus(absl::StrCat("write ", temp));
    }
  }
  if (::rename(temp.c_str(), path->c_str()) != 0) return ErrnoStatus(absl::StrCat("rename ", temp));
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileKvClient::WaitFor(const std::string& key, absl::Duration timeout) {
  absl::StatusOr<std::string> path = PathFor(key);
  if (!path.ok()) return path.status();
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration poll = absl::Microseconds(200);
  while (true) {
    std::ifstream in(*path, std::ios::binary);
    if (in) {
      std::ostringstream contents;
      contents << in.rdbuf();
      return contents.str();
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "key \"", key, "\" was not set within ", absl::FormatDuration(timeout)));
    }
    // Poll quickly at first (bootstrap is usually near-simultaneous), then back off.
    absl::SleepFor(std::min(poll, deadline - absl::Now()));
    poll = std::min(poll * 2, absl::Milliseconds(20));
  }
}

}  // namespace cohort::comm

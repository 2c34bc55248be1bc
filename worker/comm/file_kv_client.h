#pragma once
// FileKvClient: a KvClient over a directory shared by processes on one host,
// for local runs without a coordinator (benchmarks, single-host tests). A key
// is a file: Set writes a temporary file and renames it into place, so a
// reader never sees a partial value; WaitFor polls.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/comm/kv_client.h"

namespace cohort::comm {

// Thread-safe.
class FileKvClient : public KvClient {
 public:
  // Creates `directory` if missing. InvalidArgument if it is not usable.
  static absl::StatusOr<std::unique_ptr<FileKvClient>> Create(const std::string& directory);

  // Keys may contain '/', which maps to '_' in file names; other characters
  // outside [A-Za-z0-9._-] are InvalidArgument.
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> WaitFor(const std::string& key, absl::Duration timeout) override;

 private:
  explicit FileKvClient(std::string directory) : directory_(std::move(directory)) {}
  absl::StatusOr<std::string> PathFor(const std::string& key) const;
  std::string directory_;
};

}  // namespace cohort::comm

#pragma once
// Who a peer process is, so ranks on one host can watch each other directly.
//
// UCX 1.13's shared-memory transports have no peer-failure handler, so an
// endpoint over shared memory never reports a dead peer. Ranks therefore
// publish their process identity with their UCX address; a rank on the same
// host checks /proc for its shared-memory peers while it waits on them.

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace cohort::comm {

struct ProcessIdentity {
  // Equal for processes that share a kernel, a pid namespace and a network
  // namespace (hostname, boot id, pid- and network-namespace inodes): their
  // pids mean the same thing, and they count as one host.
  std::string host;
  int64_t pid = 0;
  // Start time in clock ticks since boot (/proc/<pid>/stat field 22): with
  // the pid it identifies the process even after the pid is reused.
  uint64_t start_ticks = 0;
};

ProcessIdentity SelfIdentity();

// Whether the process is gone: no such pid, a zombie, or a different process
// now holding the pid. Reads /proc; cheap enough for a few calls per ms.
bool ProcessGone(const ProcessIdentity& process);

// The KV value a rank publishes: identity plus the UCX worker address blob.
std::string EncodePeerAddress(const ProcessIdentity& identity, std::string_view ucx_address);
// InvalidArgument for a value not made by EncodePeerAddress.
absl::StatusOr<std::pair<ProcessIdentity, std::string>> DecodePeerAddress(std::string_view value);

}  // namespace cohort::comm

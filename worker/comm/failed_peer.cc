#include "worker/comm/failed_peer.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/types/optional.h"

namespace cohort::comm {
namespace {

constexpr char kFailedPeerUrl[] = "type.cohort.dev/failed_peer";

}  // namespace

absl::Status WithFailedPeer(absl::Status status, int context_rank) {
  if (status.ok() || context_rank < 0) return status;
  status.SetPayload(kFailedPeerUrl, absl::Cord(std::to_string(context_rank)));
  return status;
}

std::optional<int> FailedPeer(const absl::Status& status) {
  const absl::optional<absl::Cord> payload = status.GetPayload(kFailedPeerUrl);
  int rank = -1;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &rank) || rank < 0) {
    return std::nullopt;
  }
  return rank;
}

}  // namespace cohort::comm

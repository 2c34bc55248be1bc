#pragma once
// Which peer a communication error was about: a status payload carrying the
// peer's rank in its communication context (the generation's participant
// index), set where the failure is the peer's or the path's to it (a
// connection refused, a send or receive failed, UCX reported the endpoint
// failed, a pairwise warm-up timed out); not where a collective merely timed
// out waiting on a peer that may itself be waiting on another. The agent
// names the worker behind it to the coordinator, which keeps workers that
// cannot reach each other apart.

#include <optional>

#include "absl/status/status.h"

namespace cohort::comm {

// `status` with `context_rank` attached (an OK status is returned as is).
absl::Status WithFailedPeer(absl::Status status, int context_rank);
// The rank attached by WithFailedPeer, if any.
std::optional<int> FailedPeer(const absl::Status& status);

}  // namespace cohort::comm

#pragma once
// RunTransfers: one participant's side of a peer recovery's transfers
// (live_transfer.h): it sends the regions it serves from the source
// generation's state in its memory and receives the regions it needs into
// the new generation's buffers, round by round over a communicator that spans
// every participant (rank = participant index), local copies done in place
// (none where the source and destination buffers are the same: a training
// session kept across generations already holds its state).
//
// Thread-compatible: one call at a time, and the communicator is the
// caller's for the duration.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/checkpoint/checkpoint_loader.h"
#include "worker/checkpoint/live_transfer.h"
#include "worker/comm/communicator.h"

namespace cohort::checkpoint {

// A participant's state in the source generation, at the plan's step.
struct SourceState {
  const model::ParameterTable* table = nullptr;  // its source layout's
  int rank = 0;                                   // its source rank
  StateLayout layout;
  const float* params = nullptr;  // the whole shard
  const float* adam_m = nullptr;  // [optimizer.begin, optimizer.end) of the arena
  const float* adam_v = nullptr;
  ArenaRange optimizer;
  // Mirrors (ZeRO-1): copies of other data ranks' moments (their
  // DataShardRange), in copy order.
  struct Mirror {
    int owner = 0;  // the data rank whose moments these are
    const float* adam_m = nullptr;
    const float* adam_v = nullptr;
    ArenaRange range;
  };
  std::vector<Mirror> mirrors;
};

// Where a new rank's state goes (its new layout's table and buffers).
struct DestinationState {
  const model::ParameterTable* table = nullptr;
  StateBuffers buffers;
};

struct TransferStats {
  int64_t sent_bytes = 0;
  int64_t received_bytes = 0;
  int64_t copied_bytes = 0;  // local
  int rounds = 0;
  absl::Duration duration;
};

// Runs participant `self`'s part of `transfers` (rounds from ScheduleRounds).
// `source` is null for a participant without source state (a new worker),
// `destination` null for a donor. InvalidArgument when a transfer needs a
// buffer this participant does not have; the communicator's errors
// (Unavailable when a peer died, DeadlineExceeded after `timeout` per round).
absl::Status RunTransfers(comm::Communicator* world, int self,
                          const std::vector<Transfer>& transfers,
                          const std::vector<std::vector<int>>& rounds, const SourceState* source,
                          const DestinationState* destination, absl::Duration timeout,
                          TransferStats* stats);

}  // namespace cohort::checkpoint

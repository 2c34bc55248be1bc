#pragma once
// The job and generation a coordinator command names: what a worker checks a
// command's staleness against (WorkerAgent::IsStale and its simulated twin).

#include <cstdint>
#include <optional>
#include <string>

#include "cohort/v1/workers.pb.h"

namespace cohort {

struct CommandTarget {
  std::string job_id;
  uint64_t generation = 0;
};

// Set for Assign, Reconfigure, Suspend and Stop; nullopt for every other
// message (Welcome, HeartbeatAck, Drain).
inline std::optional<CommandTarget> CommandTargetOf(const v1::CoordinatorMessage& message) {
  switch (message.kind_case()) {
    case v1::CoordinatorMessage::kAssign:
      return CommandTarget{message.assign().job_id(), message.assign().generation()};
    case v1::CoordinatorMessage::kReconfigure:
      return CommandTarget{message.reconfigure().job_id(), message.reconfigure().generation()};
    case v1::CoordinatorMessage::kSuspend:
      return CommandTarget{message.suspend().job_id(), message.suspend().generation()};
    case v1::CoordinatorMessage::kStop:
      return CommandTarget{message.stop().job_id(), message.stop().generation()};
    default:
      return std::nullopt;
  }
}

}  // namespace cohort

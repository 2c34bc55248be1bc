#pragma once
// Effects: what a call into the job logic (JobManager and the classes it
// routes events to: JobTable, Scheduler, Replanner, WarmSpares) wants done,
// in order. The logic only appends here; the Coordinator turns the result
// into deliveries after releasing its lock (docs/architecture.md, "The
// facade"). A plain value: not thread-safe, owned by one call.

#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "cohort/v1/jobs.pb.h"
#include "cohort/v1/workers.pb.h"
#include "common/ids.h"
#include "coordinator/membership/membership_table.h"

namespace cohort::coordinator {

// What a JobManager call wants done, in order.
struct Effects {
  struct Message {
    Message(WorkerId worker, Incarnation incarnation, v1::CoordinatorMessage message,
            std::shared_ptr<const v1::CoordinatorMessage> base = nullptr)
        : worker(std::move(worker)),
          incarnation(incarnation),
          message(std::move(message)),
          base(std::move(base)) {}
    WorkerId worker;
    Incarnation incarnation;
    v1::CoordinatorMessage message;
    // When set, what the worker gets is *base with `message` merged into it:
    // a command to many workers shares its large common part (spec, mesh,
    // plan), and the per-worker copy is made only after the coordinator's
    // lock is released (a 1,000-worker Assign held the lock for a second).
    std::shared_ptr<const v1::CoordinatorMessage> base;
    v1::CoordinatorMessage Full() const { return base ? WithBase(*base, message) : message; }
    // `base` with `message` merged into it.
    static v1::CoordinatorMessage WithBase(const v1::CoordinatorMessage& base,
                                           const v1::CoordinatorMessage& message);
  };
  struct Event {
    v1::JobEventKind kind;
    v1::Job job;  // snapshot after the change
  };
  struct GenerationChange {
    JobId job;
    Generation generation;  // the new current generation
  };
  std::vector<Message> messages;
  std::vector<Event> events;
  std::vector<GenerationChange> generation_changes;
  // Jobs that reached a terminal state (their KV scopes can be dropped).
  std::vector<JobId> finished_jobs;
  // Members the manager itself declared lost (not back within the restart
  // grace, back as a different process, silent when suspended, stalled),
  // for failure metrics and logs.
  std::vector<LostWorker> lost;
  // Recoveries completed (a re-planned generation became RUNNING).
  struct Recovery {
    JobId job;
    v1::RecoveryKind kind = v1::RECOVERY_KIND_UNSPECIFIED;
    bool spare = false;
    int64_t lost_steps = 0;
    absl::Duration detect_to_running;
  };
  std::vector<Recovery> recoveries;
  // Phases of recoveries (RecoveryStats): "suspend", "prepare", "first_step".
  struct RecoveryPhase {
    JobId job;
    const char* phase;
    absl::Duration took;
  };
  std::vector<RecoveryPhase> recovery_phases;
};

}  // namespace cohort::coordinator

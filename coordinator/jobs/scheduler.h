#pragma once
// Scheduler: which waiting job gets which free workers (docs/architecture.md,
// "Scheduling policy"). First come, first served with backfill: Schedule
// walks the active jobs in submit order; a PENDING job is planned over the
// idle workers of its device kind and started (its first mesh, through the
// Replanner's ApplyMesh) or told what it waits for, without blocking later,
// smaller jobs; a job whose mesh lost members is re-planned as soon as an
// idle worker exists; a complete mesh below max_workers grows when a larger
// valid shape fits. Jobs with members still awaited for re-adoption are left
// alone. Every pass ends by refreshing the warm spares.
//
// Contract: the Scheduler decides only when to start or re-plan; how (the
// suspension, the plan, the commands) is the Replanner's. Pure logic: time
// comes in as `now`; no I/O besides the table's JobStore, no threads. Not
// thread-safe (the Coordinator serialises calls).

#include "absl/time/time.h"
#include "coordinator/jobs/effects.h"
#include "coordinator/jobs/job_table.h"
#include "coordinator/jobs/replanner.h"
#include "coordinator/jobs/warm_spares.h"
#include "coordinator/membership/membership_table.h"

namespace cohort::coordinator {

class Scheduler {
 public:
  // The pointees must outlive this.
  Scheduler(JobTable* table, const MembershipTable* membership, Replanner* replanner,
            WarmSpares* warm)
      : table_(table), membership_(membership), replanner_(replanner), warm_(warm) {}

  // Tries to start pending jobs and grow running ones. Runs after every
  // event that can free or add workers.
  void Schedule(absl::Time now, Effects* effects);

 private:
  JobTable* table_;
  const MembershipTable* membership_;
  Replanner* replanner_;
  WarmSpares* warm_;
};

}  // namespace cohort::coordinator

#pragma once
// WarmSpares: names idle workers warm spares of running jobs
// (docs/architecture.md, "Elasticity"). An idle worker left over once every
// job has what it can use is a spare; naming it a spare of a running job
// lets it prepare the session of the place it would most likely take, so
// that a recovery costs it only communicators and the state transfer.
//
// Contract: Update looks at the table's active jobs in submit order and
// names up to `per_job` idle workers of each job's device kind (spares keep
// their job while it needs them); it sends WarmUp to each spare whose target
// (job, generation, rank) changed and a release (a WarmUp without a job) to
// idle workers that are no longer spares. It changes no job and no worker's
// membership state. Pure logic; not thread-safe (the Coordinator serialises
// calls).

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "common/ids.h"
#include "coordinator/jobs/effects.h"
#include "coordinator/jobs/job_table.h"
#include "coordinator/membership/membership_table.h"

namespace cohort::coordinator {

class WarmSpares {
 public:
  struct Options {
    // Idle workers named warm spares of each running job. 0: none.
    int per_job = 1;
  };
  // `table` and `membership` must outlive this.
  WarmSpares(Options options, const JobTable* table, const MembershipTable* membership)
      : options_(options), table_(table), membership_(membership) {}

  // Cheap enough to run after every scheduling pass: jobs x spares, plus the
  // first idle workers it needs.
  void Update(Effects* effects);

 private:
  // What a warm spare was last told to prepare.
  struct Target {
    Incarnation incarnation;
    JobId job;
    Generation generation;
    int rank = 0;
    bool operator==(const Target&) const = default;
  };

  Options options_;
  const JobTable* table_;
  const MembershipTable* membership_;
  absl::flat_hash_map<WorkerId, Target> targets_;
  uint64_t sequence_ = 0;  // WarmUp.sequence of the last one sent
};

}  // namespace cohort::coordinator

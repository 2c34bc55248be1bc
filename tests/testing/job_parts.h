#pragma once
// The parts JobManager is made of (JobTable, WarmSpares, Replanner,
// Scheduler), wired as JobManager wires them, over an in-memory JobStore and
// a MembershipTable, for tests of one part at a time. Header-only: its users
// link the coordinator core.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "cohort/v1/job.pb.h"
#include "cohort/v1/workers.pb.h"
#include "common/job_spec/validator.h"
#include "common/proto_time.h"
#include "coordinator/jobs/effects.h"
#include "coordinator/jobs/job_store.h"
#include "coordinator/jobs/job_table.h"
#include "coordinator/jobs/replanner.h"
#include "coordinator/jobs/scheduler.h"
#include "coordinator/jobs/warm_spares.h"
#include "coordinator/membership/membership_table.h"
#include "tests/testing/job_specs.h"

namespace cohort::testing {

inline const absl::Time kJobPartsT0 = absl::FromUnixSeconds(1'700'000'000);

struct JobParts {
  explicit JobParts(int warm_spares_per_job = 1)
      : table(coordinator::JobTable::Options{}, &store),
        warm(coordinator::WarmSpares::Options{.per_job = warm_spares_per_job}, &table, &membership),
        replanner(ReplannerOptions(), &table, &membership, &warm),
        scheduler(&table, &membership, &replanner, &warm) {}

  static coordinator::Replanner::Options ReplannerOptions() {
    coordinator::Replanner::Options options;
    options.suspend_timeout = absl::Seconds(5);
    return options;
  }

  // Attaches an idle CPU worker.
  void Join(const std::string& id, const std::string& host, int index) {
    v1::Hello hello;
    hello.set_worker_id(id);
    hello.set_host(host);
    hello.set_device_kind(v1::DEVICE_KIND_CPU);
    hello.set_device_index(index);
    hello.set_incarnation(next_incarnation++);
    (void)membership.Join(hello, now);
  }

  // A PENDING job of SmallJobSpec's shape, stored and added to the table.
  coordinator::JobEntry& Add(int min_workers, int max_workers) {
    v1::Job job;
    *job.mutable_spec() =
        *NormalizeJobSpec(SmallJobSpec("train", /*tensor=*/1, min_workers, max_workers));
    const int64_t number = next_number++;
    job.set_job_id("train-" + std::to_string(number));
    job.set_state(v1::JOB_STATE_PENDING);
    *job.mutable_create_time() = ToProtoTime(now);
    (void)store.Put(job);
    return table.Add(std::move(job), number);
  }

  // Makes the entry's current generation its live state, as every member's
  // READY does.
  static void TakeEffect(coordinator::JobEntry& entry) {
    entry.job.mutable_live_state()->set_generation(entry.job.generation());
    *entry.job.mutable_live_state()->mutable_mesh() = entry.job.mesh();
    for (const auto& member : entry.job.mesh().members()) {
      entry.ready.insert(WorkerId(member.worker_id()));
    }
  }

  coordinator::InMemoryJobStore store;
  coordinator::MembershipTable membership{coordinator::MembershipTable::Options{}};
  coordinator::JobTable table;
  coordinator::WarmSpares warm;
  coordinator::Replanner replanner;
  coordinator::Scheduler scheduler;
  absl::Time now = kJobPartsT0;
  uint64_t next_incarnation = 100;
  int64_t next_number = 1;
};

// Messages of one kind sent to `worker` (their full text).
inline std::vector<v1::CoordinatorMessage> MessagesOfKind(const coordinator::Effects& effects,
                                                          const std::string& worker,
                                                          v1::CoordinatorMessage::KindCase kind) {
  std::vector<v1::CoordinatorMessage> out;
  for (const auto& m : effects.messages) {
    if (m.worker.value() == worker && m.message.kind_case() == kind) out.push_back(m.Full());
  }
  return out;
}

}  // namespace cohort::testing

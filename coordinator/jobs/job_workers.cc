#include "coordinator/jobs/job_workers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/enum_names.h"
#include "common/job_spec/defaults.h"
#include "common/job_spec/validator.h"
#include "coordinator/jobs/worker_commands.h"

namespace cohort::coordinator {

PlannerWorker ToPlannerWorker(const WorkerRecord& record) {
  return PlannerWorker{record.id, record.incarnation, record.host, record.device_index};
}

PlanRequest MakePlanRequest(const v1::JobSpec& spec) {
  PlanRequest request;
  request.tensor = spec.parallelism().tensor();
  request.pipeline = spec.parallelism().pipeline();
  request.min_workers = spec.elastic().min_workers();
  request.max_workers = spec.elastic().max_workers();
  request.micro_batches = MicroBatchesPerStep(spec);
  request.even_shares =
      spec.parallelism().reduction() == v1::ParallelismConfig::REDUCTION_TRANSPORT;
  return request;
}

void AppendIdleCandidates(const MembershipTable& membership, const v1::JobSpec& spec,
                          PlanRequest* request) {
  // Idle workers in (host, device) order, whole hosts at a time, until the
  // job's largest mesh could be filled from them alone: planning stays
  // proportional to the job, not to the cluster (a one-worker job among
  // 10,000 idle workers looked at all of them). The shape is the same as
  // with every idle worker, since it can never exceed max_workers.
  const size_t enough =
      request->candidates.size() + static_cast<size_t>(std::max({spec.elastic().max_workers(),
                                                                 spec.elastic().min_workers(), 1}));
  const std::string* host = nullptr;
  membership.ForEachIdle(spec.device_kind(), [&](const WorkerRecord& record) {
    if (request->candidates.size() >= enough && (host == nullptr || record.host != *host)) {
      return false;
    }
    request->candidates.push_back(ToPlannerWorker(record));
    host = &record.host;
    return true;
  });
}

std::string NoneAttached(const MembershipTable& membership, v1::DeviceKind kind) {
  if (membership.CountAttached(kind) > 0) return "";
  return absl::StrCat(" (no ", ShortEnumName(kind), " worker is attached)");
}

void SendStop(const MembershipTable& membership, const WorkerId& worker, const JobId& job,
              Generation generation, const std::string& reason, Effects* effects) {
  const WorkerRecord* record = membership.Find(worker);
  if (record == nullptr || record->state == WorkerState::kLost) return;
  effects->messages.push_back(
      Effects::Message{worker, record->incarnation, commands::Stop(job, generation, reason)});
}

}  // namespace cohort::coordinator

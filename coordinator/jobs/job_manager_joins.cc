// JobManager: a worker attached. It may be a member awaited after a
// coordinator restart (re-adopted into its place), a lost member coming back
// with the job's state (Replanner::Rejoin), or a worker holding an assignment
// this coordinator no longer gives it (told to stop).

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/job_workers.h"
#include "coordinator/jobs/worker_commands.h"

namespace cohort::coordinator {

void JobManager::OnWorkerJoined(const v1::Hello& hello, absl::Time now, Effects* effects) {
  const WorkerId id(hello.worker_id());
  const JobId held_job(hello.held().job_id());
  if (Readopt(hello, now, effects) || replanner_.Rejoin(hello, now, effects)) {
    scheduler_.Schedule(now, effects);
    return;
  }
  if (!held_job.value().empty()) {
    // The worker holds an assignment this coordinator no longer gives it.
    const JobEntry* entry = table_.Find(held_job);
    const bool member_now = entry != nullptr && IsMember(*entry, id) &&
                            entry->job.generation() == hello.held().generation();
    if (!member_now) {
      // At the job's current generation: the worker may have been sent a
      // command of a newer generation than the one it holds (a Suspend while
      // it rejoined), after which a Stop of its held generation is stale.
      const uint64_t generation = entry != nullptr
                                      ? std::max(entry->job.generation(), hello.held().generation())
                                      : hello.held().generation();
      SendStop(*membership_, id, held_job, Generation(generation),
               "the coordinator no longer has this worker in that job generation", effects);
    }
  }
  scheduler_.Schedule(now, effects);
}

bool JobManager::Readopt(const v1::Hello& hello, absl::Time now, Effects* effects) {
  const WorkerId id(hello.worker_id());
  const JobId held_job(hello.held().job_id());
  auto& awaiting = table_.awaiting();
  auto awaited = awaiting.find(id);
  if (awaited == awaiting.end()) return false;
  const JobId job_id = awaited->second.job;
  awaiting.erase(awaited);
  JobEntry* entry = table_.Find(job_id);
  if (entry == nullptr || IsTerminal(entry->job.state())) return false;
  const v1::MeshMember* member = nullptr;
  for (const auto& m : entry->job.mesh().members()) {
    if (m.worker_id() == id.value()) member = &m;
  }
  const bool same_process = member != nullptr && member->incarnation() == hello.incarnation();
  const bool same_place =
      held_job == job_id && hello.held().generation() == entry->job.generation() &&
      member != nullptr && hello.held().coordinates().rank() == member->coordinates().rank();
  if (same_process && same_place && membership_->AssignToJob(id, job_id).ok()) {
    LOG(INFO) << "worker " << id << " re-adopted into job " << job_id << " generation "
              << entry->job.generation();
    if (entry->suspension.has_value()) {
      // A re-plan began while it was away: it suspends like the others.
      replanner_.AskToSuspend(*entry, id, Incarnation(hello.incarnation()), now, effects);
    } else if (!entry->ready.contains(id)) {
      effects->messages.push_back(Effects::Message{
          id, Incarnation(hello.incarnation()),
          commands::MemberCoordinates(v1::CoordinatorMessage::kReconfigure, member->coordinates()),
          std::make_shared<const v1::CoordinatorMessage>(commands::Reconfigure(
              job_id, Generation(entry->job.generation()), entry->job.mesh(), entry->job.recovery(),
              entry->job.spec(), "re-adopted; confirm readiness"))});
    }
    return true;
  }
  // The same process, holding a generation of this job at least as new as
  // the live state, that missed the newest generation's command (the old
  // coordinator died first): its state counts. It suspends and reports what
  // it holds, and the job is re-planned with it.
  const uint64_t held_generation = held_job == job_id ? hello.held().generation() : 0;
  const bool holds_live = same_process && held_generation != 0 &&
                          held_generation >= entry->job.live_state().generation() &&
                          held_generation <= entry->job.generation();
  if (holds_live && membership_->AssignToJob(id, job_id).ok()) {
    LOG(INFO) << "worker " << id << " re-attached holding generation " << held_generation
              << " of job " << job_id << " (current " << entry->job.generation()
              << "); it is re-planned with its state";
    if (entry->suspension.has_value()) {
      replanner_.AskToSuspend(*entry, id, Incarnation(hello.incarnation()), now, effects);
    } else {
      replanner_.BeginSuspension(
          *entry,
          absl::StrCat("worker ", id.value(), " re-attached without generation ",
                       entry->job.generation(), "'s command"),
          /*growth=*/false, now, effects);
    }
    return true;
  }
  LOG(INFO) << "worker " << id << " came back without its place in job " << job_id
            << "; treating its old self as lost";
  LostWorker lost{id, Incarnation(member ? member->incarnation() : 0), job_id,
                  LossReason::kReplaced, absl::ZeroDuration()};
  // The same process (on a new stream) stays attached, as an idle worker
  // told to drop what it holds; a fenced old process's stream is cut
  // (Coordinator::Collect).
  if (!same_process) effects->lost.push_back(lost);
  OnWorkersLost({lost}, now, effects);
  return false;
}

}  // namespace cohort::coordinator

#include "coordinator/jobs/warm_spares.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/log.h"

namespace cohort::coordinator {
namespace {

// The member at `rank` (members are sorted by rank; searched otherwise).
const v1::MeshMember* MemberAt(const v1::Mesh& mesh, int rank) {
  if (rank < mesh.members_size() && mesh.members(rank).coordinates().rank() == rank) {
    return &mesh.members(rank);
  }
  for (const v1::MeshMember& member : mesh.members()) {
    if (member.coordinates().rank() == rank) return &member;
  }
  return nullptr;
}

}  // namespace

void WarmSpares::Update(Effects* effects) {
  // This runs on every scheduling pass, under the coordinator's lock, with
  // up to tens of thousands of idle workers: it looks at each job's own
  // spares (targets_ holds a few per job) and at the first idle workers
  // it needs, never at every idle worker per job.
  // Each job's current spares that are still idle, as they were named (the
  // same incarnation), in the idle order.
  absl::flat_hash_map<JobId, std::vector<const WorkerRecord*>> spares_of;
  for (const auto& [worker, target] : targets_) {
    const WorkerRecord* record = membership_->Find(worker);
    if (record != nullptr && record->state == WorkerState::kIdle &&
        record->incarnation == target.incarnation) {
      spares_of[target.job].push_back(record);
    }
  }
  for (auto& [job, records] : spares_of) {
    std::sort(records.begin(), records.end(), [](const WorkerRecord* a, const WorkerRecord* b) {
      return MembershipTable::IdleBefore(*a, *b);
    });
  }
  // What each spare should prepare, job by job in submit order.
  absl::flat_hash_map<WorkerId, Target> wanted;
  for (const auto& [number, id] : table_->active()) {  // finishes none
    if (options_.per_job <= 0) break;
    const JobEntry& entry = table_->At(id);
    const v1::Mesh& mesh = entry.job.mesh();
    const v1::JobState state = entry.job.state();
    const int world = mesh.members_size();
    if (state != v1::JOB_STATE_RUNNING && state != v1::JOB_STATE_RECONFIGURING) continue;
    const v1::DeviceKind kind = entry.job.spec().device_kind();
    auto own = spares_of.find(id);
    const std::vector<const WorkerRecord*> no_spares;
    const std::vector<const WorkerRecord*>& its_spares =
        own == spares_of.end() ? no_spares : own->second;
    if (entry.suspension.has_value() || world == 0 || MeshIncomplete(mesh)) {
      // Mid-recovery: its spares keep what they prepared (the plan is about
      // to take one), and none is added until it has a whole mesh again.
      for (const WorkerRecord* record : its_spares) {
        if (record->device_kind == kind) wanted[record->id] = targets_.at(record->id);
      }
      continue;
    }
    // Spares it already has first (their prepared sessions stay useful),
    // then any other idle worker, in the idle order.
    std::vector<const WorkerRecord*> chosen;
    const size_t count = static_cast<size_t>(options_.per_job);
    for (const WorkerRecord* record : its_spares) {
      if (chosen.size() == count) break;
      if (record->device_kind == kind && !wanted.contains(record->id)) chosen.push_back(record);
    }
    if (chosen.size() < count) {
      // Past its own spares (those chosen above among them).
      membership_->ForEachIdle(kind, [&](const WorkerRecord& record) {
        if (wanted.contains(record.id) ||
            std::find(its_spares.begin(), its_spares.end(), &record) != its_spares.end()) {
          return true;
        }
        chosen.push_back(&record);
        return chosen.size() < count;
      });
    }
    // The k-th spare prepares the k-th place from the end of the mesh: any
    // place may be lost, and spreading the spares covers different ones.
    for (size_t k = 0; k < chosen.size(); ++k) {
      const int rank = ((world - 1 - static_cast<int>(k)) % world + world) % world;
      wanted[chosen[k]->id] =
          Target{chosen[k]->incarnation, id, Generation(entry.job.generation()), rank};
    }
  }
  // Tell what changed.
  for (const auto& [worker, target] : wanted) {
    auto old = targets_.find(worker);
    if (old != targets_.end() && old->second == target) continue;
    const JobEntry& entry = table_->At(target.job);
    const v1::MeshMember* member = MemberAt(entry.job.mesh(), target.rank);
    if (member == nullptr) continue;
    v1::CoordinatorMessage message;
    v1::WarmUp* warm = message.mutable_warm_up();
    warm->set_sequence(++sequence_);
    warm->set_job_id(target.job.value());
    warm->set_generation(target.generation.value());
    *warm->mutable_spec() = entry.job.spec();
    *warm->mutable_mesh() = entry.job.mesh();
    *warm->mutable_coordinates() = member->coordinates();
    effects->messages.emplace_back(worker, target.incarnation, std::move(message));
    if (old == targets_.end() || old->second.job != target.job ||
        old->second.rank != target.rank) {
      LOG(INFO) << "worker " << worker << " is a warm spare of job " << target.job << " (rank "
                << target.rank << " of generation " << target.generation << ")";
    }
    targets_[worker] = target;
  }
  // Release idle spares no longer needed; forget the others (taken into a
  // job, lost, replaced: an Assign or the lost stream says it all).
  for (auto it = targets_.begin(); it != targets_.end();) {
    if (wanted.contains(it->first)) {
      ++it;
      continue;
    }
    const WorkerRecord* record = membership_->Find(it->first);
    if (record != nullptr && record->state == WorkerState::kIdle &&
        record->incarnation == it->second.incarnation) {
      v1::CoordinatorMessage message;
      message.mutable_warm_up()->set_sequence(++sequence_);  // no job: release
      effects->messages.emplace_back(it->first, it->second.incarnation, std::move(message));
      LOG(INFO) << "worker " << it->first << " is no longer a warm spare of job "
                << it->second.job;
    }
    targets_.erase(it++);
  }
}

}  // namespace cohort::coordinator

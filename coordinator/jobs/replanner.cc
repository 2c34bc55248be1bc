// Replanner: the two-phase suspend and plan of a job that lost, gained or
// drained members (replanner.h), the members that may come back with the live
// state, and the installation of the next generation.

#include "coordinator/jobs/replanner.h"

#include <algorithm>
#include <memory>
#include <set>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec/defaults.h"
#include "common/log.h"
#include "coordinator/jobs/job_workers.h"
#include "coordinator/jobs/recovery_planner.h"
#include "coordinator/jobs/worker_commands.h"

namespace cohort::coordinator {
namespace {

std::string MeshShapeString(const v1::Mesh& mesh) {
  return absl::StrCat("dp ", mesh.data_parallel(), " x tp ", mesh.tensor_parallel(), " x pp ",
                      mesh.pipeline_parallel());
}

}  // namespace

bool Replanner::AwaitEveryMember(JobEntry& entry, const std::string& reason, absl::Time now,
                                  Effects* effects) {
  // Only when the last member is gone, the job was running its live
  // generation, and every member of it may still be alive.
  const v1::LiveState& live = entry.job.live_state();
  if (entry.job.mesh().members_size() != 0 || live.generation() == 0 ||
      live.generation() != entry.job.generation() ||
      entry.returning.size() != static_cast<size_t>(live.mesh().members_size())) {
    return false;
  }
  for (const v1::MeshMember& member : live.mesh().members()) {
    auto it = entry.returning.find(member.worker_id());
    if (it == entry.returning.end() || it->second.incarnation.value() != member.incarnation()) {
      return false;
    }
  }
  // Back to the mesh as it was, every member awaited as after a coordinator
  // restart: one that re-attaches as the same process in the same place is
  // re-adopted into this generation (asked to confirm what it holds), and
  // if all come back the job goes on without a re-plan, in its own layout.
  const JobId id(entry.job.job_id());
  absl::Time until = now;
  for (const v1::MeshMember& member : live.mesh().members()) {
    *entry.job.mutable_mesh()->add_members() = member;
    const absl::Time deadline = entry.returning.at(member.worker_id()).deadline;
    table_->awaiting()[WorkerId(member.worker_id())] = Awaited{id, deadline};
    until = std::max(until, deadline);
  }
  entry.returning.clear();
  entry.suspension.reset();
  entry.ready.clear();
  entry.job.set_ready_workers(0);
  const std::string message = absl::StrCat(
      reason, "; every member was lost at once: awaiting them for up to ",
      absl::FormatDuration(absl::Trunc(until - now, absl::Milliseconds(1))),
      " to re-attach with the job's state");
  LOG(WARNING) << "job " << id << ": " << message;
  if (entry.job.state() != v1::JOB_STATE_RECONFIGURING) {
    table_->SetState(entry, v1::JOB_STATE_RECONFIGURING, message, now, effects);
  } else {
    table_->SetMessage(entry, message, now);
    JobTable::Emit(entry, v1::JOB_EVENT_KIND_STATE_CHANGED, effects);
  }
  return true;
}

void Replanner::Replan(JobEntry& entry, const std::string& reason, bool only_if_larger,
                        absl::Time now, Effects* effects) {
  if (IsTerminal(entry.job.state())) return;
  const JobId id(entry.job.job_id());
  if (only_if_larger && !entry.suspension.has_value()) {
    PlanRequest request = MakePlanRequest(entry.job.spec());
    int current = 0;
    for (const auto& member : entry.job.mesh().members()) {
      const WorkerRecord* record = membership_->Find(WorkerId(member.worker_id()));
      if (record != nullptr && record->state == WorkerState::kAssigned && record->job == id) {
        request.candidates.push_back(ToPlannerWorker(*record));
        ++current;
      }
    }
    AppendIdleCandidates(*membership_, entry.job.spec(), &request);
    // Workers kept apart count once: growing onto them would split again.
    const std::vector<std::string> apart = KeepReachable(entry, &request, {}, now);
    current -= static_cast<int>(std::count_if(apart.begin(), apart.end(), [&](const std::string& w) {
      return IsMember(entry, WorkerId(w));
    }));
    absl::StatusOr<MeshShape> shape =
        MeshPlanner::ChooseShape(request, static_cast<int>(request.candidates.size()));
    if (!shape.ok() || shape->world() <= current) return;
  }
  if (entry.suspension.has_value()) {
    Suspension& s = *entry.suspension;
    if (!only_if_larger) {
      s.growth = false;
      if (s.reason.find(reason) == std::string::npos) {
        absl::StrAppend(&s.reason, "; ", reason);
        // Published at once: operators (and failure-detection timing) see
        // every loss when it is noticed, not when the re-plan completes.
        table_->SetMessage(entry, absl::StrCat("re-planning (", s.reason, "): suspending ",
                                       s.awaiting.size(), " members"),
                   now);
        JobTable::Emit(entry, v1::JOB_EVENT_KIND_STATE_CHANGED, effects);
      }
    }
    if (s.awaiting.empty()) CompleteSuspension(entry, now, effects);
    return;
  }
  BeginSuspension(entry, reason, only_if_larger, now, effects);
}

void Replanner::BeginSuspension(JobEntry& entry, const std::string& reason, bool growth,
                                 absl::Time now, Effects* effects, const std::string& answered) {
  const JobId id(entry.job.job_id());
  Suspension fresh;
  fresh.reason = reason;
  fresh.started = now;
  fresh.deadline = now + options_.suspend_timeout;
  fresh.growth = growth;
  entry.suspension = std::move(fresh);
  Suspension& s = *entry.suspension;
  // Donors of a generation that has not taken effect still hold the live
  // state (a failed donation keeps it; EngineTrainer::Donate): they suspend
  // with the members and are planned with them, in their places of the live
  // mesh. A donor that already handed its state over answers with nothing.
  for (const v1::MeshMember& member : entry.job.live_state().mesh().members()) {
    if (!entry.donors.contains(WorkerId(member.worker_id())) || IsMember(entry, WorkerId(member.worker_id()))) {
      continue;
    }
    const WorkerRecord* record = membership_->Find(WorkerId(member.worker_id()));
    if (record == nullptr || record->job != id || record->state == WorkerState::kLost ||
        record->incarnation.value() != member.incarnation()) {
      continue;
    }
    *entry.job.mutable_mesh()->add_members() = member;
  }
  entry.donors.clear();
  for (const auto& member : entry.job.mesh().members()) {
    const WorkerId worker(member.worker_id());
    const WorkerRecord* record = membership_->Find(worker);
    if (record == nullptr || record->job != id || record->state == WorkerState::kLost) continue;
    if (worker.value() == answered) {
      s.awaiting.insert(worker);  // its answer is in hand (OnSuspended)
    } else {
      AskToSuspend(entry, worker, record->incarnation, now, effects);
    }
  }
  const size_t asked = s.awaiting.size();
  entry.ready.clear();
  entry.job.set_ready_workers(0);
  LOG(INFO) << "job " << id << " generation " << entry.job.generation() << ": re-planning ("
            << reason << "); suspending " << asked << " members";
  const std::string message =
      absl::StrCat("re-planning (", reason, "): suspending ", asked, " members");
  if (entry.job.state() != v1::JOB_STATE_RECONFIGURING) {
    table_->SetState(entry, v1::JOB_STATE_RECONFIGURING, message, now, effects);
  } else {
    table_->SetMessage(entry, message, now);
    JobTable::Emit(entry, v1::JOB_EVENT_KIND_STATE_CHANGED, effects);
  }
  if (asked == 0) CompleteSuspension(entry, now, effects);
}

void Replanner::OnSuspended(JobEntry& entry, const WorkerId& worker,
                             const v1::AssignmentStatus& status, absl::Time now,
                             Effects* effects) {
  if (!entry.suspension.has_value()) {
    // The worker stopped on its own (a peer failed under it): re-plan.
    BeginSuspension(entry,
                    absl::StrCat("worker ", worker.value(), " stopped",
                                 status.message().empty() ? "" : ": " + status.message()),
                    /*growth=*/false, now, effects, /*answered=*/worker.value());
  }
  if (!entry.suspension.has_value()) return;  // planned at once
  Suspension& s = *entry.suspension;
  // Bounded: a peer's report is input (16 names, 256 reports a suspension).
  const WorkerRecord* reporter = membership_->Find(worker);
  for (int i = 0; i < std::min(status.unreachable_workers_size(), 16) && reporter != nullptr;
       ++i) {
    const std::string& peer = status.unreachable_workers(i);
    if (peer.empty() || peer.size() > 256 || s.unreachable.size() >= 256) continue;
    const WorkerRecord* record = membership_->Find(WorkerId(peer));
    if (record == nullptr || record->state == WorkerState::kLost) continue;  // its loss says it
    s.unreachable.push_back(
        {worker, reporter->incarnation, WorkerId(peer), record->incarnation});
  }
  const uint64_t live = entry.job.live_state().generation();
  for (const v1::HeldState& held : status.held_states()) {
    if (live != 0 && held.generation() == live) {
      s.holders[worker.value()] = held.step();
      // Known to be done, even if this holder is gone by the next plan.
      entry.reached_step = std::max(entry.reached_step, held.step());
    }
  }
  s.awaiting.erase(worker);
  if (s.awaiting.empty()) CompleteSuspension(entry, now, effects);
}

std::vector<std::string> Replanner::KeepReachable(JobEntry& entry, PlanRequest* request,
                                                  const std::map<std::string, int64_t>& holders,
                                                  absl::Time now) {
  const JobId id(entry.job.job_id());
  if (entry.suspension.has_value()) {
    // Both ends still the processes reported, now that the suspension
    // settled (a crashed peer is lost by then, a restarted one another
    // incarnation): they could not reach each other.
    for (const Suspension::Unreachable& u : entry.suspension->unreachable) {
      const WorkerRecord* a = membership_->Find(u.reporter);
      const WorkerRecord* b = membership_->Find(u.peer);
      // A peer fenced as hung counts as alive here: a report is a hard
      // connection error (a stopped process only times out, which is not
      // reported), and behind a one-way cut UCX 1.13's blocking TCP connect
      // keeps the far side from answering its Suspend.
      const bool peer_alive =
          b != nullptr && (b->state != WorkerState::kLost || b->loss_reason == LossReason::kHang);
      if (a == nullptr || a->state == WorkerState::kLost || !peer_alive ||
          a->incarnation != u.reporter_incarnation || b->incarnation != u.peer_incarnation) {
        continue;
      }
      LOG(WARNING) << "job " << id << ": worker " << u.reporter << " (host " << a->host
                   << ") could not reach worker " << u.peer << " (host " << b->host
                   << "), both alive: keeping them apart";
      entry.reachability.Report({u.reporter.value(), a->host}, {u.peer.value(), b->host}, now);
    }
    entry.suspension->unreachable.clear();
  }
  if (!entry.reachability.Holding(now)) return {};
  // Holders of the state first, then the current members: a tie between
  // sides keeps the job where it runs.
  std::set<std::string> preferred;
  for (const auto& [worker, step] : holders) preferred.insert(worker);
  if (preferred.empty()) {
    for (const v1::MeshMember& m : entry.job.mesh().members()) preferred.insert(m.worker_id());
  }
  std::vector<std::string> apart = entry.reachability.Filter(&request->candidates, preferred, now);
  if (!apart.empty()) {
    LOG(INFO) << "job " << id << ": leaving out " << absl::StrJoin(apart, ", ")
              << " (kept apart: " << entry.reachability.Describe(now) << ")";
  }
  return apart;
}

void Replanner::CompleteSuspension(JobEntry& entry, absl::Time now, Effects* effects) {
  const JobId id(entry.job.job_id());
  Suspension& s = *entry.suspension;
  // After a coordinator restart, members that may still re-attach (with
  // their state) are waited for until the grace ends.
  for (const auto& [worker, awaited] : table_->awaiting()) {
    if (awaited.job == id) return;
  }
  PlanRequest request = MakePlanRequest(entry.job.spec());
  for (const auto& member : entry.job.mesh().members()) {
    const WorkerRecord* record = membership_->Find(WorkerId(member.worker_id()));
    if (record != nullptr && record->state == WorkerState::kAssigned && record->job == id) {
      request.candidates.push_back(ToPlannerWorker(*record));
    }
  }
  size_t members = request.candidates.size();
  // Every member was lost (a stall of the whole job, a partition of all of
  // it) and some may come back: wait for them all, so the job resumes in
  // its own layout rather than on whoever re-attached first.
  std::vector<std::string> pending;
  absl::Time until = absl::InfinitePast();
  for (const auto& [worker, returning] : entry.returning) {
    if (returning.deadline <= now) continue;
    pending.push_back(worker);
    until = std::max(until, returning.deadline);
  }
  if (!pending.empty() && members <= s.rejoined.size()) {
    std::sort(pending.begin(), pending.end());
    s.rejoin_deadline = until;
    const std::string message = absl::StrCat(
        s.reason, "; every member was lost: waiting up to ",
        absl::FormatDuration(absl::Trunc(until - now, absl::Milliseconds(1))), " for ",
        absl::StrJoin(pending, ", "), " to re-attach with the job's state");
    if (entry.job.message() != message) {
      LOG(INFO) << "job " << id << ": " << message;
      table_->SetMessage(entry, message, now);
      JobTable::Emit(entry, v1::JOB_EVENT_KIND_STATE_CHANGED, effects);
    }
    return;
  }
  AppendIdleCandidates(*membership_, entry.job.spec(), &request);
  const std::vector<std::string> apart = KeepReachable(entry, &request, s.holders, now);
  if (!apart.empty()) {
    // Members first in the candidates, kept in order.
    members = 0;
    for (const PlannerWorker& w : request.candidates) members += IsMember(entry, w.id) ? 1 : 0;
  }
  request.previous = &entry.job.mesh();
  absl::StatusOr<v1::Mesh> mesh = MeshPlanner::Plan(request);
  if (!mesh.ok() && s.growth) {
    // The growth is no longer possible: carry on as before.
    request.candidates.resize(members);
    mesh = MeshPlanner::Plan(request);
  }
  if (!mesh.ok()) {
    if (!s.waiting_since.has_value()) s.waiting_since = now;
    const std::string message =
        absl::StrCat(s.reason, "; waiting for workers: ", mesh.status().message(),
                     NoneAttached(*membership_, entry.job.spec().device_kind()),
                     " (the survivors keep their state)");
    if (entry.job.message() != message) {
      table_->SetMessage(entry, message, now);
      JobTable::Emit(entry, v1::JOB_EVENT_KIND_STATE_CHANGED, effects);
    }
    return;
  }
  RecoveryInput input;
  const v1::LiveState& live = entry.job.live_state();
  if (live.generation() != 0) {
    input.source = StateSource{Generation(live.generation()), live.mesh(), live.zero1(),
                               std::max(1, live.optimizer_replicas())};
  }
  input.holders = s.holders;
  for (const std::string& worker : apart) input.holders.erase(worker);  // cannot reach the others
  input.next_mesh = *mesh;
  input.checkpoint_step = LatestCheckpoint(id);
  input.reported_step = entry.reached_step;
  const v1::RecoveryPlan plan = PlanRecovery(input);
  if (plan.kind() != v1::RECOVERY_KIND_PEER && live.generation() != 0) {
    // State would be given up: first wait for lost members that may come
    // back with it (a stall, a partition), if their return would let the
    // job recover from memory.
    absl::Time until = absl::InfinitePast();
    std::vector<std::string> names;
    RecoveryInput with_them = input;
    int64_t step = entry.reached_step;
    for (const auto& [worker, held] : input.holders) step = std::min(step, held);
    for (const auto& [worker, returning] : entry.returning) {
      if (returning.deadline <= now) continue;
      until = std::max(until, returning.deadline);
      names.push_back(worker);
      with_them.holders[worker] = step;
    }
    const v1::RecoveryPlan hoped = PlanRecovery(with_them);
    // Worth waiting only if it saves steps (a checkpoint at the held step
    // loses none).
    if (!names.empty() && hoped.kind() == v1::RECOVERY_KIND_PEER && hoped.step() > plan.step()) {
      std::sort(names.begin(), names.end());
      s.rejoin_deadline = until;
      const std::string message = absl::StrCat(
          s.reason, "; waiting up to ", absl::FormatDuration(absl::Trunc(until - now, absl::Milliseconds(1))),
          " for ", absl::StrJoin(names, ", "),
          " (lost, possibly still holding the job's state) to re-attach; otherwise: ",
          plan.reason());
      if (entry.job.message() != message) {
        LOG(INFO) << "job " << id << ": " << message;
        table_->SetMessage(entry, message, now);
        JobTable::Emit(entry, v1::JOB_EVENT_KIND_STATE_CHANGED, effects);
      }
      return;
    }
  }
  const std::string reason = s.reason;
  entry.recovery_started = s.started;
  entry.recovery_planned = now;
  entry.first_step_wait.reset();
  entry.recovery_spare = IsSpareReplacement(plan, live.mesh(), *mesh);
  entry.suspension.reset();
  LOG(INFO) << "job " << id << ": " << v1::RecoveryKind_Name(plan.kind()) << " recovery at step "
            << plan.step() << " (" << plan.reason() << ")";
  ApplyMesh(entry, *std::move(mesh), reason, plan, now, effects);
}

void Replanner::ApplyMesh(JobEntry& entry, v1::Mesh mesh, const std::string& reason,
                           const v1::RecoveryPlan& plan, absl::Time now, Effects* effects) {
  const JobId id(entry.job.job_id());
  const bool first = entry.job.generation() == 0;
  const Generation generation(entry.job.generation() + 1);
  absl::flat_hash_set<std::string> in_new;
  for (const auto& member : mesh.members()) in_new.insert(member.worker_id());
  entry.donors.clear();
  for (const v1::Donor& donor : plan.donors()) entry.donors.insert(WorkerId(donor.worker_id()));
  // Lost members of the live generation stay awaited (JobEntry::returning)
  // until this generation takes effect: if it fails first, their state may
  // still save the job.

  // Members left out of the new mesh (shrink to a divisible size) serve their
  // state as donors if the plan needs it, and are released otherwise.
  for (const auto& member : entry.job.mesh().members()) {
    if (in_new.contains(member.worker_id())) continue;
    if (entry.donors.contains(WorkerId(member.worker_id()))) {
      const WorkerId worker(member.worker_id());
      const WorkerRecord* record = membership_->Find(worker);
      if (record == nullptr) continue;
      effects->messages.push_back(Effects::Message{
          worker, record->incarnation,
          commands::DonorReconfigure(
              id, generation, mesh, plan,
              absl::StrCat(reason, "; donate state to generation ", generation.value()))});
      continue;
    }
    const WorkerId worker(member.worker_id());
    const WorkerRecord* record = membership_->Find(worker);
    if (record != nullptr && record->job == id && record->state != WorkerState::kLost) {
      SendStop(*membership_, worker, id, generation, absl::StrCat("not part of generation ", generation.value()),
               effects);
      const bool draining = record->state == WorkerState::kDraining;
      membership_->Release(worker);
      if (draining) {
        effects->messages.push_back(
            Effects::Message{worker, record->incarnation, commands::Drain("drained")});
      }
    }
  }
  // The common parts once; each member's message adds its coordinates.
  std::shared_ptr<v1::CoordinatorMessage> reconfigure_base, assign_base;
  for (const auto& member : mesh.members()) {
    const WorkerId worker(member.worker_id());
    const WorkerRecord* record = membership_->Find(worker);
    CHECK(record != nullptr) << "planned worker " << worker << " is unknown";
    std::shared_ptr<const v1::CoordinatorMessage> base;
    if (record->state == WorkerState::kAssigned && record->job == id && !first) {
      if (reconfigure_base == nullptr) {
        reconfigure_base = std::make_shared<v1::CoordinatorMessage>(
            commands::Reconfigure(id, generation, mesh, plan, entry.job.spec(), reason));
      }
      base = reconfigure_base;
    } else {
      absl::Status assigned = membership_->AssignToJob(worker, id);
      CHECK(assigned.ok()) << assigned;
      if (assign_base == nullptr) {
        assign_base = std::make_shared<v1::CoordinatorMessage>(
            commands::Assign(id, generation, mesh, plan, entry.job.spec()));
      }
      base = assign_base;
    }
    effects->messages.push_back(
        Effects::Message{worker, record->incarnation,
                         commands::MemberCoordinates(base->kind_case(), member.coordinates()),
                         std::move(base)});
  }

  LOG(INFO) << "job " << id << " generation " << generation << ": " << MeshShapeString(mesh)
            << " on " << mesh.members_size() << " workers (" << reason << ")";
  *entry.job.mutable_mesh() = std::move(mesh);
  entry.job.set_generation(generation.value());
  *entry.job.mutable_recovery() = plan;
  // The job's progress is where this generation starts: steps reported
  // beyond it belong to the timeline the plan gave up (still counted in
  // reached_step until the plan takes effect), and a restarted coordinator
  // must not count them again.
  entry.job.mutable_progress()->set_step(plan.step());
  entry.prepare_deadline = now + options_.prepare_timeout;
  entry.ready.clear();
  entry.completed.clear();
  entry.slowest_prepare.Clear();
  entry.sessions_kept = 0;
  entry.sessions_warm = 0;
  entry.models_kept = 0;
  entry.job.set_ready_workers(0);
  effects->generation_changes.push_back(Effects::GenerationChange{id, generation});
  table_->SetState(entry, first ? v1::JOB_STATE_RUNNING : v1::JOB_STATE_RECONFIGURING,
           first ? "waiting for workers to report ready" : reason, now, effects);
  JobTable::Emit(entry, v1::JOB_EVENT_KIND_MESH_CHANGED, effects);
  // The spares' places are this generation's now.
  warm_->Update(effects);
}

std::optional<int64_t> Replanner::LatestCheckpoint(const JobId& id) const {
  if (!options_.latest_checkpoint) return std::nullopt;
  const std::optional<Step> step = options_.latest_checkpoint(id);
  return step.has_value() ? std::optional<int64_t>(step->value()) : std::nullopt;
}

absl::Duration Replanner::RejoinGrace(const JobEntry& entry) const {
  return std::min(options_.readopt_grace, WaitForWorkers(entry.job.spec()));
}

void Replanner::RememberReturning(JobEntry& entry, const LostWorker& lost, absl::Time now) {
  // Only a process that may still be alive: not one replaced by a new
  // process, gone on purpose, or fenced as hung.
  if ((lost.reason != LossReason::kStreamBroken && lost.reason != LossReason::kHeartbeatTimeout) ||
      lost.grace_expired) {
    return;
  }
  if (entry.job.live_state().generation() == 0) return;  // nothing trained to keep
  for (const v1::MeshMember& member : entry.job.mesh().members()) {
    if (member.worker_id() != lost.id.value()) continue;
    if (lost.incarnation.value() != 0 && member.incarnation() != lost.incarnation.value()) return;
    const absl::Duration grace =
        lost.reason == LossReason::kStreamBroken
            ? std::min(RejoinGrace(entry), options_.stream_rejoin_grace)
            : RejoinGrace(entry);
    entry.returning[member.worker_id()] =
        Returning{Incarnation(member.incarnation()), member, now + grace};
  }
}

bool Replanner::Rejoin(const v1::Hello& hello, absl::Time now, Effects* effects) {
  const WorkerId id(hello.worker_id());
  bool rejoined = false;
  // Only unfinished jobs await members (Finish clears `returning`): every
  // Hello must not cost a walk over the week of finished jobs.
  for (const JobId& job_id : table_->ActiveJobs()) {
    JobEntry& entry = table_->At(job_id);
    auto it = entry.returning.find(id.value());
    if (it == entry.returning.end()) continue;
    const Returning returning = it->second;
    entry.returning.erase(it);
    const uint64_t held = hello.held().job_id() == job_id.value() ? hello.held().generation() : 0;
    const bool holds = returning.incarnation.value() == hello.incarnation() && held != 0 &&
                       held >= entry.job.live_state().generation() &&
                       held <= entry.job.generation();
    // A plan already issued that loses nothing (PEER) gains nothing from its
    // state: taking it back would only cost another re-plan.
    const bool planned_without_it = !entry.suspension.has_value() &&
                                    entry.job.generation() != entry.job.live_state().generation() &&
                                    entry.job.recovery().kind() == v1::RECOVERY_KIND_PEER;
    if (!holds || IsTerminal(entry.job.state()) || now > returning.deadline ||
        planned_without_it || !membership_->AssignToJob(id, job_id).ok()) {
      // A new process (its state died with the old one), or no longer
      // awaited: a plan waiting for it need not wait any more.
      Suspension* s = entry.suspension ? &*entry.suspension : nullptr;
      if (s != nullptr && s->rejoin_deadline.has_value() && s->awaiting.empty()) {
        CompleteSuspension(entry, now, effects);
      }
      continue;
    }
    // Back in its place, it suspends like the other members and reports
    // the state it holds.
    auto* members = entry.job.mutable_mesh()->mutable_members();
    int at = 0;
    while (at < members->size() &&
           members->Get(at).coordinates().rank() < returning.member.coordinates().rank()) {
      ++at;
    }
    *members->Add() = returning.member;
    for (int i = members->size() - 1; i > at; --i) members->SwapElements(i, i - 1);
    LOG(INFO) << "worker " << id << " re-attached holding generation " << held << " of job "
              << job_id << "; it rejoins the re-plan with its state";
    rejoined = true;
    if (!entry.suspension.has_value()) {
      // After a coordinator restart: the re-plan starts now, with it.
      BeginSuspension(entry, absl::StrCat("worker ", id.value(), " re-attached with its state"),
                      /*growth=*/false, now, effects);
      if (entry.suspension.has_value()) entry.suspension->rejoined.insert(id);
      continue;
    }
    entry.suspension->rejoined.insert(id);
    AskToSuspend(entry, id, Incarnation(hello.incarnation()), now, effects);
  }
  return rejoined;
}

void Replanner::AskToSuspend(JobEntry& entry, const WorkerId& worker, Incarnation incarnation,
                              absl::Time now, Effects* effects) {
  Suspension& s = *entry.suspension;
  s.awaiting.insert(worker);
  // Its answer is due suspend_timeout after it was asked, like anyone's.
  s.deadline = std::max(s.deadline, now + options_.suspend_timeout);
  effects->messages.push_back(Effects::Message{
      worker, incarnation,
      commands::Suspend(JobId(entry.job.job_id()), Generation(entry.job.generation()), s.reason)});
}

}  // namespace cohort::coordinator

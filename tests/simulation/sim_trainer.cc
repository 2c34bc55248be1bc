// SimWorker's trainer half: what worker/engine/engine_trainer.cc does, in
// simulated time (see sim_worker.h).

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tests/simulation/sim_worker.h"
#include "tests/simulation/sim_world.h"

namespace cohort::simulation {
namespace {

std::vector<std::pair<int, uint64_t>> MembersOf(const v1::Mesh& mesh) {
  std::vector<std::pair<int, uint64_t>> members(static_cast<size_t>(mesh.members_size()));
  for (const v1::MeshMember& m : mesh.members()) {
    const int rank = m.coordinates().rank();
    if (rank >= 0 && rank < mesh.members_size()) {
      members[static_cast<size_t>(rank)] = {World::IndexOf(m.worker_id()), m.incarnation()};
    }
  }
  return members;
}

int Participants(const v1::Mesh& mesh, const v1::RecoveryPlan& plan) {
  return mesh.members_size() + (plan.kind() == v1::RECOVERY_KIND_PEER ? plan.donors_size() : 0);
}

}  // namespace

SimWorker::Run* SimWorker::HeldRun(const std::string& job, uint64_t generation) {
  for (std::optional<Run>* run : {&run_, &previous_}) {
    if (run->has_value() && (*run)->job == job && (*run)->generation == generation) {
      return &**run;
    }
  }
  return nullptr;
}

bool SimWorker::Serves(const Assignment& assignment) const {
  for (const v1::PieceSource& piece : assignment.recovery.pieces()) {
    if (piece.params_from() == assignment.participant ||
        piece.optimizer_from() == assignment.participant) {
      return true;
    }
  }
  return false;
}

void SimWorker::SuspendTraining() {
  if (!run_.has_value()) return;
  ++train_epoch_;
  phase_ = Phase::kIdle;
  world_->LeaveFabric(index_, incarnation_);
  // Once the current generation has trained, the older state is obsolete.
  if (run_->trained) previous_.reset();
}

void SimWorker::StopAll() {
  ++train_epoch_;
  phase_ = Phase::kIdle;
  world_->LeaveFabric(index_, incarnation_);
  run_.reset();
  previous_.reset();
}

std::vector<v1::HeldState> SimWorker::TrainerSuspend() {
  SuspendTraining();
  std::vector<v1::HeldState> held;
  for (const std::optional<Run>* run : {&run_, &previous_}) {
    if (!run->has_value()) continue;
    v1::HeldState state;
    state.set_generation((*run)->generation);
    state.set_step((*run)->newest);
    held.push_back(state);
  }
  return held;
}

void SimWorker::BeginInterruptible(const Assignment& assignment) {
  interruptible_ = std::pair(assignment.job, assignment.generation);
  for (auto it = interrupted_.begin(); it != interrupted_.end();) {
    it = it->first == assignment.job ? std::next(it) : interrupted_.erase(it);
  }
  auto it = interrupted_.find(assignment.job);
  cancelled_ = it != interrupted_.end() && assignment.generation <= it->second;
}

void SimWorker::TrainerInterrupt(const std::string& job, uint64_t generation) {
  uint64_t& newest = interrupted_[job];
  newest = std::max(newest, generation);
  if (op_ == 0 || !interruptible_.has_value() || interruptible_->first != job ||
      interruptible_->second > generation) {
    return;  // kept for a Prepare or Donate that has not begun
  }
  ActingOn(job, generation, "interrupt (Suspend or Stop)");
  CancelOp();
}

void SimWorker::CancelOp() {
  cancelled_ = true;
  if (op_ != 0) FailOp(op_, absl::CancelledError("trainer interrupted"));
}

void SimWorker::TrainerStop() {
  CancelOp();
  StopAll();
}

void SimWorker::FailOp(uint64_t op, absl::Status status) {
  if (op_ != op || op == 0) return;
  world_->LeaveFabric(index_, incarnation_);
  op_ = 0;
  Done done = std::move(op_done_);
  op_done_ = nullptr;
  world_->AtWorker(index_, incarnation_, absl::ZeroDuration(),
                   [done = std::move(done), status] { done(status); });
}

void SimWorker::TrainerPrepare(const Assignment& assignment, Done done) {
  SuspendTraining();
  BeginInterruptible(assignment);
  const uint64_t op = next_op_++;
  op_ = op;
  op_done_ = std::move(done);
  Bootstrap(assignment, op, [this, assignment, op] {
    Restore(assignment, op, [this, assignment, op](int64_t start) {
      FinishPrepare(assignment, op, start);
    });
  });
}

void SimWorker::TrainerDonate(const Assignment& assignment, Done done) {
  SuspendTraining();
  BeginInterruptible(assignment);
  // A donor keeps nothing once it handed its state over; a failed donation
  // keeps the source state (EngineTrainer::Donate).
  Done finish = [this, done = std::move(done)](absl::Status status) {
    if (status.ok()) StopAll();
    done(status);
  };
  const bool peer = assignment.recovery.kind() == v1::RECOVERY_KIND_PEER;
  if (!peer) {
    finish(absl::OkStatus());
    return;
  }
  if (HeldRun(assignment.job, assignment.recovery.source_generation()) == nullptr) {
    finish(absl::FailedPreconditionError(absl::StrCat(
        "no state of generation ", assignment.recovery.source_generation(), " to donate")));
    return;
  }
  const uint64_t op = next_op_++;
  op_ = op;
  op_done_ = std::move(finish);
  Bootstrap(assignment, op, [this, assignment, op] {
    Restore(assignment, op, [this, op](int64_t) {
      if (op_ != op) return;
      op_ = 0;
      Done done = std::move(op_done_);
      op_done_ = nullptr;
      done(absl::OkStatus());
    });
  });
}

void SimWorker::Bootstrap(const Assignment& assignment, uint64_t op, std::function<void()> next) {
  const absl::Duration build = world_->Uniform(absl::Milliseconds(1), world_->timing().build_max);
  const int participants = Participants(assignment.mesh, assignment.recovery);
  world_->AtWorker(index_, incarnation_, build, [this, assignment, op, participants, next] {
    if (op_ != op) return;
    if (participants <= 1) {
      next();
      return;
    }
    // The UCX context publishes this participant's address, then waits for
    // every other one (comm::UcxContext, through the generation's KV scope).
    world_->KvSet(index_, incarnation_, assignment.job, assignment.generation,
                  absl::StrCat("p", assignment.participant),
                  [this, assignment, op, participants, next](absl::Status set) {
                    if (op_ != op) return;
                    if (!set.ok()) {
                      FailOp(op, set);
                      return;
                    }
                    WaitForPeer(assignment, op, 0, participants,
                                world_->Now() + world_->timing().bootstrap_timeout, next);
                  });
  });
}

void SimWorker::WaitForPeer(const Assignment& assignment, uint64_t op, int peer,
                            int participants, absl::Time deadline, std::function<void()> next) {
  if (op_ != op) return;
  if (peer == assignment.participant) ++peer;
  if (peer >= participants) {
    next();
    return;
  }
  const absl::Duration remaining = deadline - world_->Now();
  if (remaining <= absl::ZeroDuration()) {
    FailOp(op, absl::DeadlineExceededError(absl::StrCat(
                   "bootstrap: no address from participant ", peer, " within ",
                   absl::FormatDuration(world_->timing().bootstrap_timeout))));
    return;
  }
  world_->KvWaitFor(
      index_, incarnation_, assignment.job, assignment.generation, absl::StrCat("p", peer),
      remaining, [this, assignment, op, peer, participants, deadline, next](absl::Status got) {
        if (op_ != op) return;
        if (got.ok()) {
          WaitForPeer(assignment, op, peer + 1, participants, deadline, next);
        } else if (absl::IsDeadlineExceeded(got)) {
          WaitForPeer(assignment, op, peer, participants, deadline, next);  // the server's cap
        } else {
          FailOp(op, got);
        }
      });
}

void SimWorker::Restore(const Assignment& assignment, uint64_t op,
                        std::function<void(int64_t)> done) {
  const v1::RecoveryPlan& plan = assignment.recovery;
  if (plan.kind() != v1::RECOVERY_KIND_PEER) {
    const int64_t start = plan.kind() == v1::RECOVERY_KIND_CHECKPOINT ? plan.checkpoint_step()
                                                                      : plan.step();
    const absl::Duration load =
        world_->Uniform(absl::Milliseconds(1), world_->timing().checkpoint_load_max);
    world_->AtWorker(index_, incarnation_, load, [this, op, start, done] {
      if (op_ == op) done(start);
    });
    return;
  }
  if (Serves(assignment)) {
    const Run* source = HeldRun(assignment.job, plan.source_generation());
    const bool holds = source != nullptr &&
                       (source->newest == plan.step() ||
                        (source->has_previous && source->newest == plan.step() + 1));
    if (!holds) {
      FailOp(op, absl::NotFoundError(absl::StrCat("step ", plan.step(), " of generation ",
                                                  plan.source_generation(), " is not held")));
      return;
    }
  }
  std::vector<std::pair<int, uint64_t>> participants = MembersOf(assignment.mesh);
  for (const v1::Donor& donor : plan.donors()) {
    participants.emplace_back(World::IndexOf(donor.worker_id()), donor.incarnation());
  }
  if (participants.size() <= 1) {
    done(plan.step());
    return;
  }
  world_->JoinTransfer(assignment.job, assignment.generation, participants, index_, incarnation_,
                       [this, op, step = plan.step(), done](absl::Status transferred) {
                         if (op_ != op) return;
                         if (!transferred.ok()) {
                           FailOp(op, transferred);
                           return;
                         }
                         done(step);
                       });
}

void SimWorker::FinishPrepare(const Assignment& assignment, uint64_t op, int64_t start) {
  if (op_ != op) return;
  if (cancelled_) {
    FailOp(op, absl::CancelledError("trainer interrupted during Prepare"));
    return;
  }
  // Keep the source generation until this one has trained a step.
  std::optional<Run> keep;
  if (assignment.recovery.kind() == v1::RECOVERY_KIND_PEER) {
    const uint64_t source = assignment.recovery.source_generation();
    if (run_.has_value() && run_->generation == source && run_->job == assignment.job) {
      keep = std::move(run_);
    } else if (previous_.has_value() && previous_->generation == source &&
               previous_->job == assignment.job) {
      keep = std::move(previous_);
    }
  }
  previous_ = std::move(keep);
  Run run;
  run.job = assignment.job;
  run.generation = assignment.generation;
  run.members = MembersOf(assignment.mesh);
  run.rank = assignment.coordinates.rank();
  run.newest = start;
  run.steps = assignment.spec.steps();
  run.checkpoint_interval = assignment.spec.checkpoint().interval_steps();
  run_ = std::move(run);
  op_ = 0;
  Done done = std::move(op_done_);
  op_done_ = nullptr;
  world_->Trace(absl::StrCat(id_, " prepared ", assignment.job, " g", assignment.generation,
                             " at step ", start));
  StartTraining();
  done(absl::OkStatus());
}

void SimWorker::StartTraining() {
  phase_ = Phase::kCompute;
  const uint64_t epoch = ++train_epoch_;
  ComputeStep(epoch);
}

void SimWorker::ComputeStep(uint64_t epoch) {
  if (epoch != train_epoch_ || !run_.has_value()) return;
  if (run_->newest >= run_->steps) {
    phase_ = Phase::kIdle;
    ++train_epoch_;
    ReportTrainingFinished(run_->job, run_->generation);
    return;
  }
  phase_ = Phase::kCompute;
  const absl::Duration compute =
      world_->Uniform(world_->timing().step_compute_min, world_->timing().step_compute_max);
  world_->AtWorker(index_, incarnation_, compute, [this, epoch] {
    if (epoch != train_epoch_ || !run_.has_value()) return;
    phase_ = Phase::kCollective;
    world_->ArriveAtCollective(run_->job, run_->generation, run_->newest + 1, run_->members,
                               index_, incarnation_,
                               [this, epoch](absl::Status status) { StepReduced(epoch, status); });
  });
}

void SimWorker::StepReduced(uint64_t epoch, absl::Status status) {
  if (epoch != train_epoch_ || !run_.has_value()) return;
  if (!status.ok()) {
    // A peer failed under this rank: the state is kept, the coordinator is
    // told at once (EngineTrainer's on_suspended).
    ++train_epoch_;
    phase_ = Phase::kIdle;
    world_->LeaveFabric(index_, incarnation_);
    ReportSuspended(run_->job, run_->generation, status);
    return;
  }
  phase_ = Phase::kEndPhase;
  world_->AtWorker(index_, incarnation_,
                   world_->Uniform(absl::ZeroDuration(), world_->timing().end_phase_max),
                   [this, epoch] { StepDone(epoch); });
}

void SimWorker::StepDone(uint64_t epoch) {
  if (epoch != train_epoch_ || !run_.has_value()) return;
  Run& run = *run_;
  ++run.newest;
  run.has_previous = true;
  run.trained = true;
  world_->StepCompleted(run.job, run.generation, index_, run.newest);
  if (run.rank == 0 && run.checkpoint_interval > 0 &&
      (run.newest % run.checkpoint_interval == 0 || run.newest == run.steps)) {
    world_->CheckpointTaken(run.job, run.generation, run.newest);
  }
  ComputeStep(epoch);
}

}  // namespace cohort::simulation

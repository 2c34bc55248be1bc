#include "worker/engine/warm_spare.h"

#include <string>
#include <tuple>
#include <utility>

#include "common/log.h"
#include "worker/engine/session_builder.h"
#include "worker/train/mesh_communicators.h"

namespace cohort::worker {
namespace {

// What a warm spare reports about `slot` (its place) in `state`.
v1::WarmSpare WarmStatusOf(const Assignment& slot, v1::WarmSpareState state) {
  v1::WarmSpare warm;
  warm.set_job_id(slot.job_id.value());
  warm.set_generation(slot.generation.value());
  warm.set_rank(slot.coordinates.rank());
  warm.set_state(state);
  return warm;
}

}  // namespace

WarmSpare::WarmSpare(uint64_t memory_bytes, BuildFn build)
    : memory_bytes_(memory_bytes), build_(std::move(build)) {}

WarmSpare::~WarmSpare() {
  {
    absl::MutexLock lock(&mu_);
    exit_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void WarmSpare::Warm(const Assignment& slot) {
  absl::MutexLock lock(&mu_);
  if (memory_bytes_ == 0 && !slot.job_id.value().empty()) {
    status_ = WarmStatusOf(slot, v1::WARM_SPARE_STATE_COLD);
    status_.set_message("preparing ahead is off (--warm_spare_memory 0)");
    return;
  }
  if (slot.job_id.value().empty()) {
    wanted_.reset();
  } else {
    wanted_ = slot;
    // The same place of a newer generation: what was prepared still fits.
    if (done_.has_value() && SessionBuilder::SamePlace(*done_, slot)) {
      done_ = slot;
      status_.set_generation(slot.generation.value());
    }
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
}

v1::WarmSpare WarmSpare::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

void WarmSpare::Loop() {
  auto key = [](const std::optional<Assignment>& a) {
    return a.has_value()
               ? std::tuple(a->job_id.value(), a->generation.value(), a->coordinates.rank())
               : std::tuple(std::string(), uint64_t{0}, -1);
  };
  absl::MutexLock lock(&mu_);
  while (true) {
    auto pending = [&] { return exit_ || key(wanted_) != key(done_); };
    mu_.Await(absl::Condition(&pending));
    if (exit_) return;
    const std::optional<Assignment> target = wanted_;
    std::unique_ptr<GenerationRun> drop = std::move(warm_);
    done_ = target;
    busy_ = true;
    status_ =
        target.has_value() ? WarmStatusOf(*target, v1::WARM_SPARE_STATE_WARMING) : v1::WarmSpare();
    mu_.Unlock();
    drop.reset();  // its memory goes back before the next session is built
    absl::StatusOr<std::unique_ptr<GenerationRun>> built =
        target.has_value() ? build_(*target) : std::unique_ptr<GenerationRun>();
    mu_.Lock();
    busy_ = false;
    if (!target.has_value()) continue;
    if (built.ok()) {
      warm_ = *std::move(built);
      status_.set_state(v1::WARM_SPARE_STATE_WARM);
      status_.set_bytes(warm_->warm_bytes);
      LOG(INFO) << "warm spare of job " << target->job_id << " rank " << target->coordinates.rank()
                << ": session ready (" << warm_->warm_bytes << " bytes)";
    } else {
      status_.set_state(v1::WARM_SPARE_STATE_COLD);
      status_.set_message(std::string(built.status().message()));
      LOG(WARNING) << "warm spare of job " << target->job_id << " rank "
                   << target->coordinates.rank() << ": not prepared: " << built.status();
    }
  }
}

std::unique_ptr<GenerationRun> WarmSpare::Take(const Assignment& assignment) {
  std::unique_ptr<GenerationRun> taken;
  {
    absl::MutexLock lock(&mu_);
    // A build in flight is this Prepare's head start if it is for its place;
    // otherwise the Prepare waits for its memory to be freed anyway.
    auto settled = [this] { return !busy_; };
    mu_.Await(absl::Condition(&settled));
    taken = std::move(warm_);
    wanted_.reset();
    done_.reset();
    status_.Clear();
  }
  if (taken == nullptr) return nullptr;
  if (SessionBuilder::CanKeepSession(*taken, assignment)) return taken;
  // Prepared for another place of the same model shard (any data rank of a
  // job without tensor or pipeline parallelism): a session for this place
  // is built around it.
  if (SessionBuilder::CanReuseSession(*taken, assignment)) {
    absl::StatusOr<train::TrainingConfig> config = TrainingConfigOf(assignment);
    if (config.ok() && taken->session->ModelFitsFor(
                           *config, train::LayoutOf(assignment.mesh, assignment.coordinates))) {
      return taken;
    }
  }
  return nullptr;  // released: its memory is freed before the Prepare builds
}

}  // namespace cohort::worker

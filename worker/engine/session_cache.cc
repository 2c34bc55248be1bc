#include "worker/engine/session_cache.h"

#include <utility>

namespace cohort::worker {

GenerationRun* SessionCache::Find(uint64_t generation) const {
  for (GenerationRun* run : {current_.get(), previous_.get()}) {
    if (run == nullptr || run->session == nullptr) continue;
    if (run->generation.value() == generation) return run;
    if (run->trained) continue;
    for (const Generation older : run->also_holds) {
      if (older.value() == generation) return run;
    }
  }
  return nullptr;
}

std::vector<v1::HeldState> SessionCache::HeldStates() const {
  std::vector<v1::HeldState> held;
  for (const GenerationRun* run : {current_.get(), previous_.get()}) {
    if (run == nullptr || run->session == nullptr) continue;
    const int64_t newest = run->session->runner().versions().newest();
    if (newest < 0) continue;
    std::vector<Generation> generations = {run->generation};
    if (!run->trained) {
      generations.insert(generations.end(), run->also_holds.begin(), run->also_holds.end());
    }
    for (const Generation generation : generations) held.push_back(HeldAt(generation, newest));
  }
  return held;
}

GenerationRun* SessionCache::Install(std::unique_ptr<GenerationRun> run, GenerationRun* source,
                                     bool session_kept, GenerationRun* shares_model) {
  // Keep the source generation (if it is not this one, and kept its own
  // session) until this one has trained a step; drop anything else.
  std::unique_ptr<GenerationRun> held;
  if (!session_kept && source == current_.get()) held = std::move(current_);
  if (!session_kept && source == previous_.get()) held = std::move(previous_);
  current_.reset();
  previous_ = std::move(held);
  current_ = std::move(run);
  // What this run reports as held besides its own state until it trains.
  GenerationRun* const self = current_.get();
  train::StateVersions& versions = self->session->runner().versions();
  self->kept.clear();
  auto add_kept = [self](Generation generation, int64_t step) {
    if (step >= 0) self->kept.push_back(HeldAt(generation, step));
  };
  if (previous_ != nullptr && previous_->session != nullptr) {
    add_kept(previous_->generation, previous_->session->runner().versions().newest());
  }
  for (const Generation older : self->also_holds) add_kept(older, versions.newest());
  if (shares_model != nullptr) {
    // Until this run's first step changes the shared weights, the source
    // generation (previous_) still holds them as they are.
    versions.set_on_first_update([older = shares_model, self] {
      older->session->runner().versions().BeginRestore();
      self->kept.clear();
      const int64_t step = older->session->runner().versions().newest();
      if (step >= 0) self->kept.push_back(HeldAt(older->generation, step));
    });
  }
  return self;
}

void SessionCache::Suspend(const absl::Status& reason) {
  if (current_ == nullptr) return;
  current_->Halt(reason);
  // Once the current generation has trained, the older state is obsolete.
  if (current_->trained) previous_.reset();
}

void SessionCache::Clear(const absl::Status& reason) {
  if (current_ != nullptr) current_->Halt(reason);
  current_.reset();
  previous_.reset();
}

}  // namespace cohort::worker

// World's training fabric: the collectives of a generation's step loop and
// the peer transfers of a recovery, among simulated workers.

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tests/simulation/sim_worker.h"
#include "tests/simulation/sim_world.h"

namespace cohort::simulation {
namespace {

bool Alive(const std::vector<std::unique_ptr<SimWorker>>& workers,
           const std::pair<int, uint64_t>& member) {
  if (member.first < 0 || member.first >= static_cast<int>(workers.size())) return false;
  const SimWorker& w = *workers[static_cast<size_t>(member.first)];
  return w.alive() && w.incarnation() == member.second;
}

template <typename Group>
std::optional<int> DeadMember(const std::vector<std::unique_ptr<SimWorker>>& workers,
                              const Group& members) {
  for (const auto& member : members) {
    if (!Alive(workers, member)) return member.first;
  }
  return std::nullopt;
}

template <typename Group>
bool AllArrived(const Group& members, const std::vector<Waiter>& waiting) {
  for (const auto& member : members) {
    bool found = false;
    for (const Waiter& w : waiting) found |= w.index == member.first && w.incarnation == member.second;
    if (!found) return false;
  }
  return true;
}

}  // namespace

void World::ArriveAtCollective(const std::string& job, uint64_t generation, int64_t step,
                               const std::vector<std::pair<int, uint64_t>>& members, int index,
                               uint64_t incarnation, std::function<void(absl::Status)> done) {
  const auto key = std::make_pair(job, generation);
  Collective& c = collectives_[key][step];
  c.members = members;
  const uint64_t id = next_waiter_id_++;
  c.waiting.push_back(Waiter{index, incarnation, id, std::move(done)});
  if (std::optional<int> dead = DeadMember(workers_, members)) {
    FailWaiters(&c.waiting, absl::UnavailableError(absl::StrCat("peer w", *dead, " is gone")));
    return;
  }
  if (AllArrived(members, c.waiting)) {
    std::vector<Waiter> waiting = std::move(c.waiting);
    collectives_[key].erase(step);
    StepReduced(job, generation, step, members);
    for (Waiter& w : waiting) {
      AtWorker(w.index, w.incarnation, Uniform(timing_.link_min, timing_.link_max),
               [done = std::move(w.done)] { done(absl::OkStatus()); });
    }
    return;
  }
  queue_.After(timing_.collective_timeout, [this, key, step, id] {
    auto group = collectives_.find(key);
    if (group == collectives_.end()) return;
    auto c = group->second.find(step);
    if (c == group->second.end()) return;
    TimeOut(&c->second.waiting, id, "collective");
  });
}

void World::JoinTransfer(const std::string& job, uint64_t generation,
                         const std::vector<std::pair<int, uint64_t>>& participants, int index,
                         uint64_t incarnation, std::function<void(absl::Status)> done) {
  const auto key = std::make_pair(job, generation);
  Transfer& t = transfers_[key];
  t.participants = participants;
  const uint64_t id = next_waiter_id_++;
  t.waiting.push_back(Waiter{index, incarnation, id, std::move(done)});
  if (std::optional<int> dead = DeadMember(workers_, participants)) {
    FailWaiters(&t.waiting,
                absl::UnavailableError(absl::StrCat("transfer participant w", *dead, " is gone")));
    return;
  }
  if (AllArrived(participants, t.waiting)) {
    std::vector<Waiter> waiting = std::move(t.waiting);
    transfers_.erase(key);
    const absl::Duration transfer = Uniform(absl::Milliseconds(1), timing_.transfer_max);
    for (Waiter& w : waiting) {
      AtWorker(w.index, w.incarnation, transfer,
               [done = std::move(w.done)] { done(absl::OkStatus()); });
    }
    return;
  }
  queue_.After(timing_.collective_timeout, [this, key, id] {
    auto t = transfers_.find(key);
    if (t != transfers_.end()) TimeOut(&t->second.waiting, id, "transfer");
  });
}

void World::FailWaiters(std::vector<Waiter>* waiting, const absl::Status& status) {
  std::vector<Waiter> failed = std::move(*waiting);
  waiting->clear();
  for (Waiter& w : failed) {
    AtWorker(w.index, w.incarnation,
             Uniform(absl::Microseconds(500), timing_.peer_failure_detect_max),
             [done = std::move(w.done), status] { done(status); });
  }
}

void World::TimeOut(std::vector<Waiter>* waiting, uint64_t id, const char* what) {
  for (auto it = waiting->begin(); it != waiting->end(); ++it) {
    if (it->id != id) continue;
    Waiter w = std::move(*it);
    waiting->erase(it);
    AtWorker(w.index, w.incarnation, absl::ZeroDuration(), [done = std::move(w.done), what, this] {
      done(absl::DeadlineExceededError(
          absl::StrCat(what, " timed out after ", absl::FormatDuration(timing_.collective_timeout))));
    });
    return;
  }
}

void World::LeaveFabric(int index, uint64_t incarnation) {
  auto leave = [&](std::vector<Waiter>* waiting) {
    waiting->erase(std::remove_if(waiting->begin(), waiting->end(),
                                  [&](const Waiter& w) {
                                    return w.index == index && w.incarnation == incarnation;
                                  }),
                   waiting->end());
  };
  for (auto& [key, steps] : collectives_) {
    for (auto& [step, c] : steps) leave(&c.waiting);
  }
  for (auto& [key, t] : transfers_) leave(&t.waiting);
}

void World::FailCollectivesOf(int index) {
  // The dead process's endpoints error out on its peers (UCX, shared memory).
  const absl::Status gone = absl::UnavailableError(absl::StrCat("peer w", index, " is gone"));
  auto involves = [index](const std::vector<std::pair<int, uint64_t>>& members) {
    for (const auto& m : members) {
      if (m.first == index) return true;
    }
    return false;
  };
  for (auto& [key, steps] : collectives_) {
    for (auto& [step, c] : steps) {
      if (involves(c.members)) FailWaiters(&c.waiting, gone);
    }
  }
  for (auto& [key, t] : transfers_) {
    if (involves(t.participants)) FailWaiters(&t.waiting, gone);
  }
}

}  // namespace cohort::simulation

#pragma once
// Reachability: the pairs of a job's workers that reported they could not
// reach each other while both were alive (a partial partition: a link
// between two hosts cut, one direction of it, a host's route to another),
// and which plan candidates keep none of those pairs together. Pure logic
// (docs/conventions.md, Pure core).
//
// A pair on different hosts is a cut between the hosts (a partition is a
// property of the network, so every worker pair across them is kept
// apart); a pair on one host is a cut between those two workers. A cut
// holds for `hold`, doubled with each repeat within its memory (up to 16x),
// after which the job may try the pair together again (a growth re-plan):
// a healed link rejoins, a broken one is learned again at the next
// failure, a little later each time.

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/jobs/mesh_planner.h"

namespace cohort::coordinator {

class Reachability {
 public:
  struct Options {
    absl::Duration hold = absl::Seconds(30);
  };
  struct Endpoint {
    std::string worker;
    std::string host;
  };

  Reachability() = default;
  explicit Reachability(Options options) : options_(options) {}

  // `a` could not reach `b` at `now`.
  void Report(const Endpoint& a, const Endpoint& b, absl::Time now);

  // Removes from `candidates` what a cut-free plan leaves out and returns
  // their ids (sorted). Kept: the set of hosts with no cut between any two
  // of them that has the most candidates (then the most `preferred`
  // workers, i.e. state holders; then the smallest host name), then within
  // it workers with a cut between them are dropped one at a time (most
  // cuts first, state holders last).
  std::vector<std::string> Filter(std::vector<PlannerWorker>* candidates,
                                  const std::set<std::string>& preferred, absl::Time now) const;

  // Whether a hold ended since the last call (the job may grow back).
  bool TakeEnded(absl::Time now);
  // The cuts holding at `now`: "host a <-> host b (12s)", "; "-separated.
  std::string Describe(absl::Time now) const;
  bool Holding(absl::Time now) const;

 private:
  struct Cut {
    absl::Time until;      // kept apart until then
    absl::Time forget_at;  // a repeat before then doubles the hold
    int strikes = 0;
    bool ended_seen = false;
  };
  using Pair = std::pair<std::string, std::string>;  // ordered a < b
  static Pair Ordered(const std::string& a, const std::string& b);
  void Add(std::map<Pair, Cut>& cuts, const Pair& pair, absl::Time now);

  Options options_;
  std::map<Pair, Cut> host_cuts_;    // by host name
  std::map<Pair, Cut> worker_cuts_;  // by worker id, same host
};

}  // namespace cohort::coordinator

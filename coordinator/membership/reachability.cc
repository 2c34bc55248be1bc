#include "coordinator/membership/reachability.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cohort::coordinator {
namespace {

// Beyond this many hosts in cuts the kept set is chosen greedily.
constexpr int kExhaustiveHosts = 12;
constexpr int kMaxDoublings = 4;

}  // namespace

Reachability::Pair Reachability::Ordered(const std::string& a, const std::string& b) {
  return a < b ? Pair{a, b} : Pair{b, a};
}

void Reachability::Add(std::map<Pair, Cut>& cuts, const Pair& pair, absl::Time now) {
  auto [it, inserted] = cuts.try_emplace(pair);
  Cut& cut = it->second;
  if (!inserted && now < cut.until) return;  // already held: the same failure seen twice
  if (!inserted && now < cut.forget_at) {
    cut.strikes = std::min(cut.strikes + 1, kMaxDoublings);
  } else {
    cut.strikes = 0;
  }
  const absl::Duration hold = options_.hold * (1 << cut.strikes);
  cut.until = now + hold;
  cut.forget_at = cut.until + 2 * hold;
  cut.ended_seen = false;
}

void Reachability::Report(const Endpoint& a, const Endpoint& b, absl::Time now) {
  if (a.worker == b.worker) return;
  if (a.host != b.host) {
    Add(host_cuts_, Ordered(a.host, b.host), now);
  } else {
    Add(worker_cuts_, Ordered(a.worker, b.worker), now);
  }
}

std::vector<std::string> Reachability::Filter(std::vector<PlannerWorker>* candidates,
                                              const std::set<std::string>& preferred,
                                              absl::Time now) const {
  std::vector<std::string> dropped;
  // Hosts, with their candidates and holders.
  std::map<std::string, std::pair<int, int>> hosts;  // host -> (workers, preferred)
  for (const PlannerWorker& w : *candidates) {
    auto& [workers, holders] = hosts[w.host];
    ++workers;
    holders += preferred.contains(w.id.value()) ? 1 : 0;
  }
  std::vector<Pair> host_edges;
  std::set<std::string> conflicted;
  for (const auto& [pair, cut] : host_cuts_) {
    if (cut.until <= now || !hosts.contains(pair.first) || !hosts.contains(pair.second)) continue;
    host_edges.push_back(pair);
    conflicted.insert(pair.first);
    conflicted.insert(pair.second);
  }
  std::set<std::string> left_out;
  if (!conflicted.empty()) {
    const std::vector<std::string> names(conflicted.begin(), conflicted.end());
    const int n = static_cast<int>(names.size());
    auto index = [&](const std::string& host) {
      return static_cast<int>(std::lower_bound(names.begin(), names.end(), host) - names.begin());
    };
    if (n <= kExhaustiveHosts) {
      // Every subset of the conflicted hosts without an edge inside: the
      // best by (workers, holders), ties to the one whose first host (by
      // name) comes first, i.e. the larger mask read from bit 0.
      uint32_t best = 0;
      std::tuple<int, int> best_score{-1, -1};
      for (uint32_t mask = 0; mask < (1u << n); ++mask) {
        bool clean = true;
        for (const Pair& e : host_edges) {
          if ((mask >> index(e.first) & 1u) && (mask >> index(e.second) & 1u)) clean = false;
        }
        if (!clean) continue;
        std::tuple<int, int> score{0, 0};
        for (int h = 0; h < n; ++h) {
          if (!(mask >> h & 1u)) continue;
          std::get<0>(score) += hosts[names[static_cast<size_t>(h)]].first;
          std::get<1>(score) += hosts[names[static_cast<size_t>(h)]].second;
        }
        // Ties: the subset with the lowest-named host not shared, kept.
        const bool better = score > best_score ||
                            (score == best_score && (mask & ~best & -(mask ^ best)) != 0);
        if (better) {
          best = mask;
          best_score = score;
        }
      }
      for (int h = 0; h < n; ++h) {
        if (!(best >> h & 1u)) left_out.insert(names[static_cast<size_t>(h)]);
      }
    } else {
      // Greedy: drop the host in most cuts (ties: fewer workers, then the
      // later name) until no cut is left among the kept.
      std::set<std::string> kept(conflicted);
      for (;;) {
        std::map<std::string, int> degree;
        for (const Pair& e : host_edges) {
          if (kept.contains(e.first) && kept.contains(e.second)) {
            ++degree[e.first];
            ++degree[e.second];
          }
        }
        if (degree.empty()) break;
        auto key = [&](const std::string& host) {
          return std::make_tuple(degree[host], -hosts[host].first, host);
        };
        const std::string* worst = &degree.begin()->first;
        for (const auto& [host, d] : degree) {
          if (key(host) > key(*worst)) worst = &host;
        }
        left_out.insert(*worst);
        kept.erase(*worst);
      }
    }
  }
  std::vector<PlannerWorker> kept;
  kept.reserve(candidates->size());
  for (PlannerWorker& w : *candidates) {
    if (left_out.contains(w.host)) {
      dropped.push_back(w.id.value());
    } else {
      kept.push_back(std::move(w));
    }
  }
  // Worker pairs on one host.
  for (;;) {
    std::map<std::string, int> degree;
    std::set<std::string> present;
    for (const PlannerWorker& w : kept) present.insert(w.id.value());
    for (const auto& [pair, cut] : worker_cuts_) {
      if (cut.until <= now || !present.contains(pair.first) || !present.contains(pair.second)) {
        continue;
      }
      ++degree[pair.first];
      ++degree[pair.second];
    }
    if (degree.empty()) break;
    // Most cuts first; among equals a non-holder, then the later id.
    auto key = [&](const std::string& id) {
      return std::make_tuple(degree[id], preferred.contains(id) ? 0 : 1, id);
    };
    std::string worst = degree.begin()->first;
    for (const auto& [id, d] : degree) {
      if (key(id) > key(worst)) worst = id;
    }
    dropped.push_back(worst);
    kept.erase(std::remove_if(kept.begin(), kept.end(),
                              [&](const PlannerWorker& w) { return w.id.value() == worst; }),
               kept.end());
  }
  *candidates = std::move(kept);
  std::sort(dropped.begin(), dropped.end());
  return dropped;
}

bool Reachability::TakeEnded(absl::Time now) {
  bool ended = false;
  for (auto* cuts : {&host_cuts_, &worker_cuts_}) {
    for (auto it = cuts->begin(); it != cuts->end();) {
      Cut& cut = it->second;
      if (cut.until <= now && !cut.ended_seen) {
        cut.ended_seen = true;
        ended = true;
      }
      if (cut.forget_at <= now) {
        it = cuts->erase(it);
      } else {
        ++it;
      }
    }
  }
  return ended;
}

bool Reachability::Holding(absl::Time now) const {
  for (const auto* cuts : {&host_cuts_, &worker_cuts_}) {
    for (const auto& [pair, cut] : *cuts) {
      if (cut.until > now) return true;
    }
  }
  return false;
}

std::string Reachability::Describe(absl::Time now) const {
  std::vector<std::string> parts;
  for (const auto& [kind, cuts] : {std::pair{"host", &host_cuts_}, std::pair{"worker", &worker_cuts_}}) {
    for (const auto& [pair, cut] : *cuts) {
      if (cut.until <= now) continue;
      parts.push_back(absl::StrCat(kind, " ", pair.first, " <-> ", pair.second, " (",
                                   absl::FormatDuration(absl::Trunc(cut.until - now, absl::Seconds(1))),
                                   ")"));
    }
  }
  return absl::StrJoin(parts, "; ");
}

}  // namespace cohort::coordinator

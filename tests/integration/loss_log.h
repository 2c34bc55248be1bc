#pragma once
// Reading the loss logs workers write with --loss_log (one line per step:
// "job J generation G step S loss L time T", L a hex float, T unix seconds),
// for trajectory comparisons in integration tests.

#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace cohort::testing {

// step -> loss text of `job_id` from every file in `paths`. Ranks of one
// generation compute the same loss, so their lines must agree exactly. A
// step trained again by a later generation (after a recovery to an earlier
// step) must reproduce it exactly when `repeat_tolerance` is 0 (the same
// layout: the determinism contract), else within repeat_tolerance x
// (1 + step) (another layout sums in another order). The first generation's
// value is kept. Disagreements fail the test.
inline std::map<int, std::string> ReadLosses(const std::vector<std::string>& paths,
                                             const std::string& job_id,
                                             double repeat_tolerance = 0) {
  std::map<std::pair<int, int>, std::string> by_generation;  // (step, generation)
  for (const std::string& path : paths) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      const std::vector<std::string> w = absl::StrSplit(line, ' ');
      if (w.size() < 8 || w[1] != job_id) continue;
      const int step = std::stoi(w[5]);
      const int generation = std::stoi(w[3]);
      auto [it, inserted] = by_generation.emplace(std::make_pair(step, generation), w[7]);
      EXPECT_EQ(it->second, w[7]) << job_id << " step " << step << " generation " << generation
                                  << " (" << path << "): ranks disagree";
    }
  }
  std::map<int, std::string> losses;
  for (const auto& [key, loss] : by_generation) {
    const int step = key.first;
    auto [it, inserted] = losses.emplace(step, loss);
    if (inserted) continue;
    if (repeat_tolerance == 0) {
      EXPECT_EQ(it->second, loss) << job_id << " step " << step << " generation " << key.second
                                  << " retrained it differently";
    } else {
      EXPECT_LE(std::fabs(std::strtod(it->second.c_str(), nullptr) -
                          std::strtod(loss.c_str(), nullptr)),
                repeat_tolerance * (1.0 + step))
          << job_id << " step " << step << " generation " << key.second << " retrained it: "
          << loss << " vs " << it->second;
    }
  }
  return losses;
}

// The largest |a - b| / (1 + step) over the steps both trajectories have;
// `common` gets how many they share.
inline double WorstRelativeDifference(const std::map<int, std::string>& a,
                                      const std::map<int, std::string>& b, int* common) {
  double worst = 0;
  *common = 0;
  for (const auto& [step, loss] : a) {
    auto it = b.find(step);
    if (it == b.end()) continue;
    ++*common;
    const double x = std::strtod(loss.c_str(), nullptr);
    const double y = std::strtod(it->second.c_str(), nullptr);
    worst = std::max(worst, std::fabs(x - y) / (1.0 + step));
  }
  return worst;
}

}  // namespace cohort::testing

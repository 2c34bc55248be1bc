#pragma once
// Reading the loss logs workers write with --loss_log (one line per step:
// "job J generation G step S loss L time T", L a hex float, T unix seconds),
// for trajectory comparisons in integration tests.

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace cohort::testing {

// One line of a loss log: a completed step (`loss` set) or a resume.
struct LossLogLine {
  int generation = 0;
  int step = 0;
  bool resume = false;
  std::string loss;  // hex float text, for steps
};

// The lines of `job_id` in every file in `paths`, in file order.
inline std::vector<LossLogLine> ReadLossLogLines(const std::vector<std::string>& paths,
                                                 const std::string& job_id) {
  std::vector<LossLogLine> lines;
  for (const std::string& path : paths) {
    std::ifstream in(path);
    std::string text;
    while (std::getline(in, text)) {
      const std::vector<std::string> w = absl::StrSplit(text, ' ');
      if (w.size() < 6 || w[1] != job_id || (w[4] != "resume" && w[4] != "step")) continue;
      if (w[4] == "step" && w.size() < 8) continue;
      LossLogLine line;
      line.generation = std::stoi(w[3]);
      line.step = std::stoi(w[5]);
      line.resume = w[4] == "resume";
      if (!line.resume) line.loss = w[7];
      lines.push_back(std::move(line));
    }
  }
  return lines;
}

// step -> loss text of `job_id` from every file in `paths`: the entry that
// stands for each step. Workers log "job J generation G step S loss L time
// T" per completed step and "job J generation G resume S time T" when a
// generation starts training at step S; an entry (g, s) is superseded by a
// resume (g' > g, S' < s): generation g' trains step s again. A superseded
// step with no newer entry yet is left out. Ranks of one generation compute
// the same loss, so their lines must agree exactly. A step trained again by
// a later generation must reproduce it exactly when `repeat_tolerance` is 0
// (the same layout: the determinism contract), else within repeat_tolerance
// x (1 + step) (another layout sums in another order). Disagreements fail
// the test.
inline std::map<int, std::string> ReadLosses(const std::vector<std::string>& paths,
                                             const std::string& job_id,
                                             double repeat_tolerance = 0) {
  std::map<std::pair<int, int>, std::string> by_generation;  // (step, generation)
  std::vector<std::pair<int, int>> resumes;                  // (generation, step)
  for (const LossLogLine& line : ReadLossLogLines(paths, job_id)) {
    if (line.resume) {
      resumes.emplace_back(line.generation, line.step);
      continue;
    }
    auto [it, inserted] =
        by_generation.emplace(std::make_pair(line.step, line.generation), line.loss);
    EXPECT_EQ(it->second, line.loss) << job_id << " step " << line.step << " generation "
                                     << line.generation << ": ranks disagree";
  }
  std::map<int, std::string> first;                     // step -> first generation's loss
  std::map<int, std::pair<int, std::string>> standing;  // step -> (generation, loss)
  for (const auto& [key, loss] : by_generation) {
    const auto [step, generation] = key;
    auto [it, inserted] = first.emplace(step, loss);
    if (!inserted) {
      if (repeat_tolerance == 0) {
        EXPECT_EQ(it->second, loss) << job_id << " step " << step << " generation " << generation
                                    << " retrained it differently";
      } else {
        EXPECT_LE(std::fabs(std::strtod(it->second.c_str(), nullptr) -
                            std::strtod(loss.c_str(), nullptr)),
                  repeat_tolerance * (1.0 + step))
            << job_id << " step " << step << " generation " << generation << " retrained it: "
            << loss << " vs " << it->second;
      }
    }
    bool superseded = false;
    for (const auto& [resumed_generation, resumed_step] : resumes) {
      superseded |= resumed_generation > generation && resumed_step < step;
    }
    auto current = standing.find(step);
    if (!superseded && (current == standing.end() || current->second.first < generation)) {
      standing[step] = {generation, loss};
    }
  }
  std::map<int, std::string> losses;
  for (const auto& [step, entry] : standing) losses[step] = entry.second;
  return losses;
}

// The steps trained again after recoveries: for each generation's resume at
// step S, the steps above S that older generations had logged.
inline int64_t CountRedoneSteps(const std::vector<std::string>& paths, const std::string& job_id) {
  std::map<int, std::vector<int>> logged;  // generation -> steps
  std::map<int, int> resumes;              // generation -> step
  for (const LossLogLine& line : ReadLossLogLines(paths, job_id)) {
    if (line.resume) {
      resumes[line.generation] = line.step;
    } else {
      logged[line.generation].push_back(line.step);
    }
  }
  int64_t redone = 0;
  for (const auto& [generation, step] : resumes) {
    std::set<int> above;
    for (const auto& [older, steps] : logged) {
      if (older >= generation) break;
      for (int s : steps) {
        if (s > step) above.insert(s);
      }
    }
    redone += static_cast<int64_t>(above.size());
  }
  return redone;
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

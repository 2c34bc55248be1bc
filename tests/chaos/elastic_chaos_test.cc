// Chaos: a job trains on 6 workers while random members are killed with
// SIGKILL or stopped with SIGSTOP (a hang) at random moments; killed workers
// are restarted and stopped ones continued after a random delay, and rejoin.
// The job must complete with every step's loss and the final checkpoint's
// weights and moments bitwise those of a fault-free run (the deterministic
// reduction makes the data-parallel degree, which the faults keep changing,
// irrelevant to the math; recoveries from a checkpoint replay exactly), and
// every fault must be detected and recovered from.
// Prints one line per fault (detection time, time to the first completed
// step after it, recovery kind, lost steps) and a summary.
//
// Size: COHORT_CHAOS_STEPS (default 60), COHORT_CHAOS_FAULTS (default 4),
// COHORT_CHAOS_TENSOR (tensor parallel degree, default 1), COHORT_CHAOS_SEED
// (default: random, printed). `tools/dev chaos` runs 300 steps and 20 faults.

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/proto_time.h"
#include "gtest/gtest.h"
#include "tests/integration/elastic_cluster.h"
#include "tests/integration/job_watcher.h"

namespace cohort::testing {
namespace {

constexpr int kWorkers = 6;

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* text = std::getenv(name);
  int64_t value = 0;
  return text != nullptr && absl::SimpleAtoi(text, &value) ? value : fallback;
}

struct Fault {
  bool hang = false;  // SIGSTOP (else SIGKILL)
  int worker = 0;
  int rank = 0;
  uint64_t generation = 0;  // of the job when it struck
  int64_t step = 0;         // newest step logged then
  absl::Time at;
  absl::Time resume_at;  // restart / SIGCONT
  bool resumed = false;
  // Measured afterwards.
  std::optional<absl::Duration> detect, recover;
  std::string kind = "-";
  int64_t lost_steps = 0;
  uint64_t recovered_generation = 0;  // faults recovered together share it
};

// (generation, completion time) of the first step a generation newer than
// `generation` completed, from the workers' loss logs.
std::optional<absl::Time> FirstStepAfter(const std::vector<std::string>& logs,
                                         const std::string& job_id, uint64_t generation) {
  std::optional<absl::Time> first;
  for (const std::string& path : logs) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      const std::vector<std::string> w = absl::StrSplit(line, ' ');
      uint64_t g = 0;
      double t = 0;
      if (w.size() < 10 || w[1] != job_id || !absl::SimpleAtoi(w[3], &g) || g <= generation ||
          !absl::SimpleAtod(w[9], &t)) {
        continue;
      }
      const absl::Time time = absl::UnixEpoch() + absl::Seconds(t);
      if (!first.has_value() || time < *first) first = time;
    }
  }
  return first;
}

std::string Percentiles(std::vector<absl::Duration> values) {
  if (values.empty()) return "none";
  std::sort(values.begin(), values.end());
  auto at = [&](double q) {
    return values[std::min(values.size() - 1, static_cast<size_t>(q * values.size()))];
  };
  return absl::StrFormat("median %.0f ms, p90 %.0f ms (n=%d)",
                         absl::ToDoubleMilliseconds(at(0.5)), absl::ToDoubleMilliseconds(at(0.9)),
                         static_cast<int>(values.size()));
}

class ChaosTest : public ElasticTest {};

TEST_F(ChaosTest, RandomKillsAndHangsDuringTrainingKeepTheTrajectory) {
  const int steps = static_cast<int>(EnvInt("COHORT_CHAOS_STEPS", 60));
  const int faults = static_cast<int>(EnvInt("COHORT_CHAOS_FAULTS", 4));
  const int tensor = static_cast<int>(EnvInt("COHORT_CHAOS_TENSOR", 1));
  const uint64_t seed = static_cast<uint64_t>(EnvInt("COHORT_CHAOS_SEED", std::random_device{}()));
  std::printf("chaos: %d steps, %d faults, tensor parallel %d, seed %llu (COHORT_CHAOS_SEED "
              "reruns it)\n",
              steps, faults, tensor, static_cast<unsigned long long>(seed));
  std::mt19937_64 random(seed);
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(random);
  };

  StartCluster(kWorkers);
  // ZeRO-1 (one mirror per optimizer shard) and 12 micro-batches: with tp 1
  // dp 6 on 6 workers, dp 5 on 5 (3+3+2+2+2), dp 4, dp 3, dp 2; with tp 2
  // dp 3, dp 2 (+ a spare), dp 1. Checkpoints every 25 steps for faults that
  // take every copy of some state (two adjacent data ranks, a whole tensor
  // rank).
  v1::JobSpec spec = ElasticSpec("chaos", tensor, 1, 2, kWorkers, /*zero1=*/true, steps);
  spec.mutable_batch()->set_global_batch_size(24);
  spec.mutable_batch()->set_micro_batch_size(2);
  spec.mutable_checkpoint()->set_interval_steps(25);
  const FixedRun fixed = ReferenceWithCheckpoint(spec);
  const std::map<int, std::string>& reference = fixed.losses;

  const std::string id = SubmitJob(spec);
  JobWatcher watcher(cluster_.channel(), id);
  WaitForStep(id, 1, kWorkers);
  // Faults land at steps spread over the run (5% to 85% of it), so they all
  // happen whatever the machine's speed (a schedule in time, from the
  // reference's duration, ran out of job on a loaded machine).
  std::vector<int64_t> fault_steps;
  for (int i = 0; i < faults; ++i) {
    fault_steps.push_back(static_cast<int64_t>(steps * uniform(0.05, 0.85)));
  }
  std::sort(fault_steps.begin(), fault_steps.end());

  std::vector<Fault> log;
  std::vector<bool> down(kWorkers, false);
  auto resume_due = [&](absl::Time now) {
    for (Fault& f : log) {
      if (f.resumed || now < f.resume_at) continue;
      f.resumed = true;
      if (f.hang) {
        processes_[f.worker]->Signal(SIGCONT);
      } else {
        StartWorker(f.worker);
      }
      down[f.worker] = false;
    }
  };
  size_t next = 0;
  v1::Job job;
  while (next < fault_steps.size()) {
    const absl::Time now = absl::Now();
    resume_due(now);
    absl::StatusOr<v1::Job> current = cluster_.GetJob(id);
    ASSERT_TRUE(current.ok()) << current.status();
    job = *current;
    if (Finished(job)) break;
    if (job.progress().step() < fault_steps[next]) {
      absl::SleepFor(absl::Milliseconds(20));  // polling the job's progress
      continue;
    }
    // A live member of the current mesh, keeping at least one alive.
    std::vector<std::pair<int, int>> candidates;  // (worker, rank)
    for (const auto& member : job.mesh().members()) {
      const int w = std::stoi(member.worker_id().substr(1));
      if (!down[w]) candidates.emplace_back(w, member.coordinates().rank());
    }
    if (candidates.size() < 2) {
      absl::SleepFor(absl::Milliseconds(20));  // the chaos schedule waits for the job to regrow
      continue;
    }
    const auto [worker, rank] =
        candidates[std::uniform_int_distribution<size_t>(0, candidates.size() - 1)(random)];
    Fault f;
    f.hang = uniform(0, 1) < 0.25;
    f.worker = worker;
    f.rank = rank;
    f.generation = job.generation();
    f.step = job.progress().step();
    f.at = absl::Now();
    // A hang lasts past the heartbeat timeout (1 s), a crash is restarted.
    f.resume_at = f.at + absl::Seconds(f.hang ? uniform(2.0, 4.0) : uniform(0.5, 3.0));
    if (f.hang) {
      processes_[worker]->Signal(SIGSTOP);
    } else {
      processes_[worker]->Kill();
    }
    down[worker] = true;
    log.push_back(f);
    ++next;
  }
  // Everything that is down comes back; the job finishes.
  while (std::any_of(log.begin(), log.end(), [](const Fault& f) { return !f.resumed; })) {
    resume_due(absl::Now());
    absl::SleepFor(absl::Milliseconds(20));
  }
  job = WaitForEnd(id);
  watcher.Stop();
  ASSERT_EQ(job.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(static_cast<int>(log.size()), faults) << "the job finished before every fault";

  // Match each fault with what the coordinator reported.
  const std::vector<v1::JobEvent> events = watcher.events();
  for (Fault& f : log) {
    const std::string lost = absl::StrCat("worker w", f.worker, " lost");
    for (const v1::JobEvent& e : events) {
      const absl::Time t = FromProtoTime(e.time());
      if (t < f.at) continue;
      if (!f.detect.has_value() && absl::StrContains(e.job().message(), lost)) f.detect = t - f.at;
      if (f.detect.has_value() && e.kind() == v1::JOB_EVENT_KIND_RECOVERED) {
        const v1::RecoveryPlan& plan = e.job().recovery();
        f.kind = absl::StrReplaceAll(v1::RecoveryKind_Name(plan.kind()), {{"RECOVERY_KIND_", ""}});
        f.lost_steps = plan.lost_steps();
        f.recovered_generation = e.job().generation();
        break;
      }
    }
    std::optional<absl::Time> first = FirstStepAfter(LossLogs(), id, f.generation);
    if (first.has_value() && *first > f.at) f.recover = *first - f.at;
  }

  std::printf("\n%-3s %-7s %-6s %-5s %-4s %-5s %10s %11s %-10s %s\n", "#", "fault", "worker",
              "rank", "gen", "step", "detect ms", "recover ms", "recovery", "lost steps");
  std::vector<absl::Duration> crash_detect, hang_detect, recover;
  struct KindTotals {
    int faults = 0;
    std::map<uint64_t, int64_t> recoveries;  // generation -> lost steps (once per recovery)
  };
  std::map<std::string, KindTotals> by_kind;
  for (size_t i = 0; i < log.size(); ++i) {
    const Fault& f = log[i];
    auto ms = [](const std::optional<absl::Duration>& d) {
      return d.has_value() ? absl::StrFormat("%.0f", absl::ToDoubleMilliseconds(*d))
                           : std::string("-");
    };
    std::printf("%-3zu %-7s w%-5d %-5d %-4llu %-5lld %10s %11s %-10s %lld\n", i + 1,
                f.hang ? "SIGSTOP" : "SIGKILL", f.worker, f.rank,
                static_cast<unsigned long long>(f.generation), static_cast<long long>(f.step),
                ms(f.detect).c_str(), ms(f.recover).c_str(), f.kind.c_str(),
                static_cast<long long>(f.lost_steps));
    EXPECT_TRUE(f.detect.has_value()) << "fault " << i + 1 << " was never reported";
    EXPECT_TRUE(f.recover.has_value()) << "no step completed after fault " << i + 1;
    if (f.detect.has_value()) (f.hang ? hang_detect : crash_detect).push_back(*f.detect);
    if (f.recover.has_value()) recover.push_back(*f.recover);
    by_kind[f.kind].faults++;
    by_kind[f.kind].recoveries[f.recovered_generation] = f.lost_steps;
  }
  std::printf("\ndetect crash (SIGKILL): %s\n", Percentiles(crash_detect).c_str());
  std::printf("detect hang (SIGSTOP):  %s\n", Percentiles(hang_detect).c_str());
  std::printf("failure -> first completed step after it: %s\n", Percentiles(recover).c_str());
  for (const auto& [kind, totals] : by_kind) {
    int64_t lost = 0;
    for (const auto& [generation, steps_lost] : totals.recoveries) lost += steps_lost;
    std::printf("recovery %-10s %d faults in %d recoveries, %lld lost steps (%.1f per fault)\n",
                kind.c_str(), totals.faults, static_cast<int>(totals.recoveries.size()),
                static_cast<long long>(lost), static_cast<double>(lost) / totals.faults);
  }
  std::printf("job: %d generations; recoveries %d peer (%d with a spare), %d checkpoint, %lld "
              "steps lost in all\n",
              static_cast<int>(job.generation()), job.recovery_stats().peer(),
              job.recovery_stats().spare(), job.recovery_stats().checkpoint(),
              static_cast<long long>(job.recovery_stats().lost_steps()));

  const std::map<int, std::string> losses = Losses(id);
  ASSERT_EQ(losses.count(steps), 1u);
  std::printf("final loss %s, fault-free %s%s\n", losses.at(steps).c_str(),
              reference.at(steps).c_str(),
              losses.at(steps) == reference.at(steps) ? " (bitwise equal)" : " (DIFFERENT)");
  ExpectTrajectory("chaos", losses, reference, /*bitwise=*/true);
  ExpectSameTensors(absl::StrCat("final checkpoint after ", job.recovery_stats().peer(),
                                 " peer and ", job.recovery_stats().checkpoint(),
                                 " checkpoint recoveries"),
                    CheckpointTensors(id, steps), fixed.tensors);
}

}  // namespace
}  // namespace cohort::testing

// A stall of the whole machine: the coordinator and every worker stop
// (SIGSTOP) for longer than the heartbeat timeout, then continue. Each side
// then believes the other gone (the coordinator marks every member lost;
// every worker abandons its stream), yet every process still holds the job's
// state. The job must continue from that memory, losing no step, not start
// over (issue 20, fault 1; tests/simulation's "stall" scenario).

#include <algorithm>
#include <csignal>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/elastic_cluster.h"
#include "tests/testing/wait.h"

namespace cohort::testing {
namespace {

// Whether the kernel has stopped `pid` (state T in /proc/<pid>/stat, after
// the parenthesised command name).
bool Stopped(pid_t pid) {
  std::ifstream file(absl::StrCat("/proc/", pid, "/stat"));
  const std::string stat((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const size_t name_end = stat.rfind(')');
  return name_end != std::string::npos && name_end + 2 < stat.size() && stat[name_end + 2] == 'T';
}

TEST_F(ElasticTest, AStallOfEveryProcessLosesNoStep) {
  StartCluster(4);
  const v1::JobSpec spec = ElasticSpec("stall", 1, 1, 1, 4, /*zero1=*/false, /*steps=*/40);
  const std::map<int, std::string> reference = Reference(spec);
  const std::string id = SubmitJob(spec);
  const v1::Job before = WaitForStep(id, 10, 4);
  ASSERT_FALSE(Finished(before)) << Logs();

  std::vector<Subprocess*> everyone = processes_;
  everyone.push_back(cluster_.coordinator());
  for (Subprocess* process : everyone) process->Signal(SIGSTOP);
  ASSERT_TRUE(WaitUntil(
      [&] {
        return std::all_of(everyone.begin(), everyone.end(),
                           [](Subprocess* process) { return Stopped(process->pid()); });
      },
      absl::Seconds(10)))
      << "the kernel did not stop every process";
  // The fault itself is a length of time, not a condition: nothing runs to
  // change while everything is stopped. Everything stays stopped for 2.5x
  // the heartbeat timeout (1 s here), counted from when the last process
  // stopped, so that both sides time out; below, the logs show they did.
  absl::SleepFor(absl::Milliseconds(2500));
  for (Subprocess* process : everyone) process->Signal(SIGCONT);

  const v1::Job job = WaitForEnd(id);
  // Every member comes back as the same process with its state. Whichever
  // side notices first decides the path: the members are re-adopted into
  // generation 1 (all lost at once), or re-planned from their memory (lost
  // one by one, as their streams broke). Never a checkpoint or a fresh
  // start, and no step lost.
  if (job.generation() > 1) {
    EXPECT_EQ(job.recovery().kind(), v1::RECOVERY_KIND_PEER) << Logs();
  }
  // The stall did what it is for: a side took the other for gone (the
  // coordinator lost a member to its heartbeat timeout, or a worker
  // abandoned its stream), though every process lived.
  const std::string logs = Logs();
  EXPECT_TRUE(absl::StrContains(logs, "lost (heartbeat_timeout") ||
              absl::StrContains(logs, "abandoning this stream"))
      << "the stall was too short to be noticed:\n"
      << logs;
  EXPECT_EQ(job.recovery_stats().checkpoint(), 0) << Logs();
  EXPECT_EQ(job.recovery_stats().lost_steps(), 0) << Logs();
  // Re-adopted into generation 1 (the same layout throughout): bitwise the
  // fault-free trajectory. Re-planned: a member that answered the first
  // Suspend before its stream broke counts as a survivor, and the job may
  // run a generation on fewer members before the rest rejoin (then grow
  // back): within the layout tolerance.
  const bool same_layout = job.generation() == 1;
  ExpectTrajectory("dp 4, every process stopped for 2.5 s", Losses(id, !same_layout), reference,
                   /*bitwise=*/same_layout);
  std::printf("stall at step %lld: generation %llu, %d peer recoveries, %lld lost steps\n",
              static_cast<long long>(before.progress().step()),
              static_cast<unsigned long long>(job.generation()), job.recovery_stats().peer(),
              static_cast<long long>(job.recovery_stats().lost_steps()));
}

}  // namespace
}  // namespace cohort::testing

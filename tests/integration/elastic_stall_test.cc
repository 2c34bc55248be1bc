// A stall of the whole machine: the coordinator and every worker stop
// (SIGSTOP) for longer than the heartbeat timeout, then continue. Each side
// then believes the other gone (the coordinator marks every member lost;
// every worker abandons its stream), yet every process still holds the job's
// state. The job must continue from that memory, losing no step, not start
// over (issue 20, fault 1; tests/simulation's "stall" scenario).

#include <csignal>
#include <string>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/elastic_cluster.h"

namespace cohort::testing {
namespace {

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
  // The fault itself is a length of time: everything stays stopped for 2.5x
  // the heartbeat timeout (1 s here), so that both sides time out.
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

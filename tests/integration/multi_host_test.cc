// Training across hosts with network stacks of their own (NetnsHosts): the
// coordinator in one namespace, two workers in each of two others, every
// byte between hosts over their links. A dp 4 job and a (dp 2, tp 2) job
// (its tensor groups inside a host) must follow the one process's
// trajectory within the layout tests' tolerance. Skips where namespaces
// cannot be made.

#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/elastic_cluster.h"
#include "tests/integration/local_cluster.h"
#include "tests/integration/loss_log.h"
#include "tests/testing/job_specs.h"
#include "tests/testing/netns_hosts.h"
#include "tests/testing/reference_losses.h"

namespace cohort::testing {
namespace {

// `spec` in one process (tensor parallel degree 1).
v1::JobSpec SmallJobSpecWithoutTensor(v1::JobSpec spec) {
  spec.mutable_parallelism()->set_tensor(1);
  return spec;
}

// Three hosts: the coordinator on host 0, idle workers h1w0, h1w1 on host
// 1 and h2w0, h2w1 on host 2, each with a loss log. Skips where namespaces
// cannot be made.
class MultiHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<NetnsHosts>> made = NetnsHosts::Create(3);
    if (absl::IsUnavailable(made.status())) GTEST_SKIP() << made.status().message();
    ASSERT_TRUE(made.ok()) << made.status();
    hosts_ = *std::move(made);
    cluster_ = std::make_unique<LocalCluster>("multihost");
    cluster_->UseHosts(hosts_.get());
    cluster_->StartCoordinator();
    for (int host : {1, 2}) {
      for (int i = 0; i < 2; ++i) {
        const std::string id = absl::StrCat("h", host, "w", i);
        logs_.push_back(absl::StrCat(cluster_->dir(), "/", id, ".loss"));
        ASSERT_NE(cluster_->StartWorkerOn(host, id, "engine", {"--loss_log=" + logs_.back()}),
                  nullptr);
      }
    }
    cluster_->WaitForIdleWorkers(4);
  }

  std::unique_ptr<NetnsHosts> hosts_;  // outlives the cluster's processes
  std::unique_ptr<LocalCluster> cluster_;
  std::vector<std::string> logs_;
};

TEST_F(MultiHostTest, JobsAcrossTwoHostsTrainTheTrajectoryOfOneProcess) {
  NetnsHosts& hosts = *hosts_;
  LocalCluster& cluster = *cluster_;
  const std::vector<std::string>& logs = logs_;

  for (const int tensor : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("tensor ", tensor));
    const uint64_t before = hosts.LinkBytes(1) + hosts.LinkBytes(2);
    v1::JobSpec spec = SmallJobSpec(absl::StrCat("multihost-tp", tensor), tensor, 4, 4);
    spec.set_steps(12);
    spec.mutable_parallelism()->set_zero1(true);
    const std::vector<double> reference = ReferenceLosses(SmallJobSpecWithoutTensor(spec));
    absl::StatusOr<v1::Job> submitted = cluster.Submit(spec);
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    const v1::Job done = cluster.WaitForJob(
        submitted->job_id(),
        [](const v1::Job& j) {
          return j.state() == v1::JOB_STATE_COMPLETED || j.state() == v1::JOB_STATE_FAILED;
        },
        absl::Seconds(150), "the job to finish");
    ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.message();
    // Two members on each host; a tensor group never spans hosts.
    std::map<std::string, int> per_host;
    std::map<int, std::set<std::string>> hosts_of_group;  // data index -> hosts
    for (const v1::MeshMember& m : done.mesh().members()) {
      const std::string host = m.worker_id().substr(0, 2);
      per_host[host] += 1;
      hosts_of_group[m.coordinates().data()].insert(host);
    }
    EXPECT_EQ(per_host["h1"], 2);
    EXPECT_EQ(per_host["h2"], 2);
    if (tensor > 1) {
      for (const auto& [group, in] : hosts_of_group) EXPECT_EQ(in.size(), 1u) << "group " << group;
    }

    const std::map<int, std::string> losses = ReadLosses(logs, submitted->job_id());
    ASSERT_EQ(losses.size(), reference.size());
    for (const auto& [step, text] : losses) {
      const double got = std::strtod(text.c_str(), nullptr);
      EXPECT_NEAR(got, reference[static_cast<size_t>(step - 1)], 1e-5 * (1 + step))
          << "step " << step;
    }
    // The data-parallel collectives crossed the hosts' links (the model's
    // gradients and weights, about 0.5 MB each, every step).
    const uint64_t moved = hosts.LinkBytes(1) + hosts.LinkBytes(2) - before;
    EXPECT_GT(moved, uint64_t{2} << 20) << "bytes through the hosts' links";
    std::printf("(dp %d, tp %d) over 2 hosts: %zu steps within 1e-5 x (1+t) of one process, "
                "%.1f MB through the hosts' links\n",
                4 / tensor, tensor, losses.size(), moved / 1e6);
  }
}

TEST_F(MultiHostTest, AHostCutFromTheCoordinatorIsFencedAndRejoinsOnceHealed) {
  // Host 2 loses its path to the coordinator (both ways) but still reaches
  // host 1: its workers miss their heartbeats and are fenced, the job goes
  // on with host 1's from their state (mirrors of host 2's optimizer shards
  // included); once the path heals they re-attach, are told their
  // generation is gone, and join again as new members.
  NetnsHosts& hosts = *hosts_;
  LocalCluster& cluster = *cluster_;
  const std::vector<std::string>& logs = logs_;
  const v1::JobSpec spec = ElasticSpec("cut", 1, 1, 2, 4, /*zero1=*/true, /*steps=*/80);
  absl::StatusOr<v1::Job> submitted = cluster.Submit(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string job = submitted->job_id();
  auto on = [](const v1::Job& j, const std::string& host) {
    int n = 0;
    for (const v1::MeshMember& m : j.mesh().members()) n += m.worker_id().substr(0, 2) == host;
    return n;
  };
  v1::Job running = cluster.WaitForJob(
      job, [](const v1::Job& j) { return Finished(j) || (LocalCluster::RunningAndReady(j, 4) &&
                                                         j.progress().step() >= 3); },
      absl::Seconds(120), "4 members training");
  ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING);

  ASSERT_TRUE(hosts.Cut(2, 0).ok());
  ASSERT_TRUE(hosts.Cut(0, 2).ok());
  const v1::Job without = cluster.WaitForJob(
      job, [&](const v1::Job& j) { return Finished(j) || (LocalCluster::RunningAndReady(j, 2) &&
                                                          on(j, "h1") == 2); },
      absl::Seconds(120), "the job on host 1 alone");
  ASSERT_EQ(without.state(), v1::JOB_STATE_RUNNING);
  // Host 1's ranks hold host 2's optimizer shards: the copy ring puts each
  // mirror on the other host.
  EXPECT_EQ(without.recovery().kind(), v1::RECOVERY_KIND_PEER) << without.recovery().reason();
  EXPECT_LE(without.recovery().lost_steps(), 1);

  ASSERT_TRUE(hosts.Heal(2, 0).ok());
  ASSERT_TRUE(hosts.Heal(0, 2).ok());
  const v1::Job rejoined = cluster.WaitForJob(
      job, [&](const v1::Job& j) { return Finished(j) || (LocalCluster::RunningAndReady(j, 4) &&
                                                          on(j, "h2") == 2); },
      absl::Seconds(120), "host 2's workers back in the job");
  ASSERT_EQ(rejoined.state(), v1::JOB_STATE_RUNNING) << "host 2 rejoined only after the end";
  EXPECT_GT(rejoined.generation(), without.generation());

  const v1::Job done = cluster.WaitForJob(job, Finished, absl::Seconds(240), "the job to end");
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.message();
  // The trajectory of one process: ranks agree, steps trained again in
  // another layout repeat within the layout tolerance.
  const std::map<int, std::string> losses = ReadLosses(logs, job, kLayoutTolerance);
  const std::vector<double> reference = ReferenceLosses(spec);
  ASSERT_EQ(losses.size(), reference.size());
  for (const auto& [step, text] : losses) {
    EXPECT_NEAR(std::strtod(text.c_str(), nullptr), reference[static_cast<size_t>(step - 1)],
                kLayoutTolerance * (1 + step))
        << "step " << step;
  }
  std::printf("host 2 cut from the coordinator after step %lld: fenced, the job went on with host "
              "1 (%s, %lld steps lost), and host 2 rejoined in generation %llu\n",
              static_cast<long long>(running.progress().step()),
              v1::RecoveryKind_Name(without.recovery().kind()).c_str(),
              static_cast<long long>(without.recovery().lost_steps()),
              static_cast<unsigned long long>(rejoined.generation()));
}

}  // namespace
}  // namespace cohort::testing

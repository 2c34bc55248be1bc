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

TEST(MultiHostTest, JobsAcrossTwoHostsTrainTheTrajectoryOfOneProcess) {
  absl::StatusOr<std::unique_ptr<NetnsHosts>> made = NetnsHosts::Create(3);
  if (absl::IsUnavailable(made.status())) GTEST_SKIP() << made.status().message();
  ASSERT_TRUE(made.ok()) << made.status();
  NetnsHosts& hosts = **made;
  LocalCluster cluster("multihost");
  cluster.UseHosts(&hosts);
  cluster.StartCoordinator();
  std::vector<std::string> logs;
  for (int host : {1, 2}) {
    for (int i = 0; i < 2; ++i) {
      const std::string id = absl::StrCat("h", host, "w", i);
      logs.push_back(absl::StrCat(cluster.dir(), "/", id, ".loss"));
      ASSERT_NE(cluster.StartWorkerOn(host, id, "engine", {"--loss_log=" + logs.back()}), nullptr);
    }
  }
  cluster.WaitForIdleWorkers(4);

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

}  // namespace
}  // namespace cohort::testing

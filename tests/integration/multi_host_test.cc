// Training across hosts with network stacks of their own (NetnsHosts): the
// coordinator in one namespace, two workers in each of two others, every
// byte between hosts over their links. A dp 4 job must compute the one
// process's losses bit for bit (the deterministic reduction), also through
// cuts and re-plans; a (dp 2, tp 2) job (its tensor groups inside a host)
// follows them within the layout tests' tolerance (tensor parallelism
// changes the math). Skips where namespaces cannot be made.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/integration/elastic_cluster.h"
#include "tests/integration/local_cluster.h"
#include "tests/integration/loss_log.h"
#include "tests/testing/job_specs.h"
#include "tests/testing/net.h"
#include "tests/testing/netns_hosts.h"
#include "tests/testing/reference_losses.h"
#include "tests/testing/wait.h"
#include "worker/model/parameter_table.h"
#include "worker/train/training_config.h"

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
    // Workers kept apart (a cut between hosts) are tried together again
    // after 10 s, and a step's exchange waits 15 s at most: a silent cut
    // costs that, not the default minute.
    cluster_->StartCoordinator("10s", {"--partition_hold=10s"});
    for (int host : {1, 2}) {
      for (int i = 0; i < 2; ++i) {
        const std::string id = absl::StrCat("h", host, "w", i);
        logs_.push_back(absl::StrCat(cluster_->dir(), "/", id, ".loss"));
        ASSERT_NE(cluster_->StartWorkerOn(host, id, "engine",
                                          {"--loss_log=" + logs_.back(), "--collective_timeout=15s"}),
                  nullptr);
      }
    }
    cluster_->WaitForIdleWorkers(4);
  }

  void SplitHosts(bool one_way);
  // Submits `spec` and waits until its 4 members train (step 3 or more).
  void StartOnFourWorkers(const v1::JobSpec& spec, std::string* job, v1::Job* running) {
    absl::StatusOr<v1::Job> submitted = cluster_->Submit(spec);
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    *job = submitted->job_id();
    *running = cluster_->WaitForJob(
        *job, [](const v1::Job& j) { return Finished(j) || (LocalCluster::RunningAndReady(j, 4) &&
                                                            j.progress().step() >= 3); },
        absl::Seconds(120), "4 members training");
    ASSERT_EQ(running->state(), v1::JOB_STATE_RUNNING) << running->message();
  }

  std::unique_ptr<NetnsHosts> hosts_;  // outlives the cluster's processes
  std::unique_ptr<LocalCluster> cluster_;
  std::vector<std::string> logs_;
};

TEST_F(MultiHostTest, JobsAcrossTwoHostsTrainTheTrajectoryOfOneProcess) {
  NetnsHosts& hosts = *hosts_;
  LocalCluster& cluster = *cluster_;
  const std::vector<std::string>& logs = logs_;

  // dp 4 reduces its gradients hierarchically (two ranks on each host:
  // --collectives=auto), in the reduction tree's order, with ZeRO-1 or not.
  for (const auto& [tensor, zero1] : {std::pair{1, false}, std::pair{1, true}, std::pair{2, true}}) {
    SCOPED_TRACE(absl::StrCat("tensor ", tensor, " zero1 ", zero1));
    const uint64_t before = hosts.LinkBytes(1) + hosts.LinkBytes(2);
    v1::JobSpec spec =
        SmallJobSpec(absl::StrCat("multihost-tp", tensor, zero1 ? "-zero1" : ""), tensor, 4, 4);
    spec.set_steps(12);
    spec.mutable_parallelism()->set_zero1(zero1);
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
      if (tensor == 1) {
        // dp 4 over TCP between hosts sums in the same tree as one process.
        EXPECT_EQ(got, reference[static_cast<size_t>(step - 1)]) << "step " << step;
      } else {
        EXPECT_NEAR(got, reference[static_cast<size_t>(step - 1)], 1e-5 * (1 + step))
            << "step " << step;
      }
    }
    // The data-parallel collectives crossed the hosts' links (the model's
    // gradients and weights, about 0.5 MB each, every step).
    const uint64_t moved = hosts.LinkBytes(1) + hosts.LinkBytes(2) - before;
    EXPECT_GT(moved, uint64_t{2} << 20) << "bytes through the hosts' links";
    std::printf("(dp %d, tp %d, zero1 %d) over 2 hosts: %zu steps %s one process, "
                "%.1f MB through the hosts' links\n",
                4 / tensor, tensor, zero1 ? 1 : 0, losses.size(),
                tensor == 1 ? "bitwise equal to" : "within 1e-5 x (1+t) of", moved / 1e6);
  }
  // UCX was told the interface of each worker's announced address (the
  // host's link), not left to every interface it finds; the data group
  // was hierarchical.
  std::ifstream log(absl::StrCat(cluster.dir(), "/h1w0.log"));
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("hierarchical collectives over 2 hosts x 2 ranks"), std::string::npos);
  // Data ranks are numbered host by host, so the reduction tree folds each
  // host's gradients before it crosses hosts (half the bytes of a flat
  // exchange: ~25 MB against ~50 MB for the dp 4 job without ZeRO-1).
  EXPECT_NE(text.find("ordered reduce-scatters fold host by host (hierarchical)"),
            std::string::npos);
  EXPECT_NE(text.find("UCX network devices between hosts: "), std::string::npos) << text;
  EXPECT_EQ(text.find("UCX network devices between hosts: UCX's choice"), std::string::npos);
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
  auto on = [](const v1::Job& j, const std::string& host) {
    int n = 0;
    for (const v1::MeshMember& m : j.mesh().members()) n += m.worker_id().substr(0, 2) == host;
    return n;
  };
  std::string job;
  v1::Job running;
  ASSERT_NO_FATAL_FAILURE(StartOnFourWorkers(spec, &job, &running));

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
  // The trajectory of one process, bit for bit (the deterministic
  // reduction): ranks agree, steps trained again in another layout repeat
  // exactly.
  const std::map<int, std::string> losses = ReadLosses(logs, job, /*repeat_tolerance=*/0);
  const std::vector<double> reference = ReferenceLosses(spec);
  ASSERT_EQ(losses.size(), reference.size());
  for (const auto& [step, text] : losses) {
    EXPECT_EQ(std::strtod(text.c_str(), nullptr), reference[static_cast<size_t>(step - 1)])
        << "step " << step;
  }
  std::printf("host 2 cut from the coordinator after step %lld: fenced, the job went on with host "
              "1 (%s, %lld steps lost), and host 2 rejoined in generation %llu\n",
              static_cast<long long>(running.progress().step()),
              v1::RecoveryKind_Name(without.recovery().kind()).c_str(),
              static_cast<long long>(without.recovery().lost_steps()),
              static_cast<unsigned long long>(rejoined.generation()));
}

// The newest step any rank logged for `job`.
int NewestLoggedStep(const std::vector<std::string>& logs, const std::string& job) {
  int newest = 0;
  for (const LossLogLine& line : ReadLossLogLines(logs, job)) newest = std::max(newest, line.step);
  return newest;
}

TEST_F(MultiHostTest, TheCoordinatorCutFromEveryHostFor20SecondsReadoptsEveryoneWithoutAReplan) {
  // Every host loses its path to the coordinator (both ways) for 20 s, far
  // beyond the heartbeat timeout and the re-adoption grace. The workers
  // still reach each other and keep training; the coordinator, hearing from
  // nobody, takes its own network to be cut and fences no one; once healed
  // the same processes attach again and are re-adopted in place: the job
  // goes on in the generation it had. It runs until cancelled, so the test
  // does not depend on how many steps fit in 20 s here.
  NetnsHosts& hosts = *hosts_;
  LocalCluster& cluster = *cluster_;
  const std::vector<std::string>& logs = logs_;
  const v1::JobSpec spec = ElasticSpec("isolated", 1, 1, 2, 4, /*zero1=*/true, /*steps=*/1000000);
  std::string job;
  v1::Job running;
  ASSERT_NO_FATAL_FAILURE(StartOnFourWorkers(spec, &job, &running));

  for (const int host : {1, 2}) {
    ASSERT_TRUE(hosts.Cut(host, 0).ok());
    ASSERT_TRUE(hosts.Cut(0, host).ok());
  }
  const absl::Time cut_at = absl::Now();
  const int step_at_cut = NewestLoggedStep(logs, job);
  // Training goes on without the coordinator.
  EXPECT_TRUE(WaitUntil([&] { return NewestLoggedStep(logs, job) >= step_at_cut + 20; },
                        absl::Seconds(20)))
      << "no progress while the coordinator was away (step " << NewestLoggedStep(logs, job) << ")";
  // The coordinator, hearing from nobody, takes its own network to be cut.
  EXPECT_TRUE(WaitUntil(
      [&] {
        return absl::StrContains(cluster.coordinator()->ReadLog(),
                                 "takes its own network to be cut");
      },
      absl::Seconds(20), absl::Milliseconds(100)))
      << "the coordinator never took itself to be isolated";
  // The fault is a length of time, 20 s from the cut (past the re-adoption
  // grace): for all of it the job is watched, so a re-plan fails the test
  // when it happens instead of after the wait.
  v1::Job away;
  WaitUntil(
      [&] {
        absl::StatusOr<v1::Job> now = cluster.GetJob(job);
        if (now.ok()) away = *now;
        return (now.ok() && (away.state() != v1::JOB_STATE_RUNNING ||
                             away.generation() != running.generation())) ||
               absl::Now() >= cut_at + absl::Seconds(20);
      },
      absl::Seconds(30), absl::Milliseconds(100));
  EXPECT_EQ(away.state(), v1::JOB_STATE_RUNNING) << away.message();
  EXPECT_EQ(away.generation(), running.generation()) << "re-planned while cut off: " << away.message();
  const int step_at_heal = NewestLoggedStep(logs, job);
  for (const int host : {1, 2}) {
    ASSERT_TRUE(hosts.Heal(host, 0).ok());
    ASSERT_TRUE(hosts.Heal(0, host).ok());
  }
  const absl::Time healed_at = absl::Now();
  // Re-adopted: the coordinator sees the steps trained while it was away,
  // and then some, from all four.
  const v1::Job back = cluster.WaitForJob(
      job, [&](const v1::Job& j) { return Finished(j) || (LocalCluster::RunningAndReady(j, 4) &&
                                                         j.progress().step() > step_at_heal + 10); },
      absl::Seconds(60), "the job's progress reported again");
  const absl::Duration readopted_in = absl::Now() - healed_at;
  ASSERT_EQ(back.state(), v1::JOB_STATE_RUNNING) << back.message();
  EXPECT_EQ(back.generation(), running.generation()) << back.message();
  ASSERT_TRUE(cluster.Cancel(job).ok());
  const v1::Job done = cluster.WaitForJob(job, Finished, absl::Seconds(60), "the job to end");
  EXPECT_EQ(done.state(), v1::JOB_STATE_CANCELLED) << done.message();
  EXPECT_EQ(done.generation(), running.generation()) << "a re-plan after the heal";

  // One generation throughout: every rank logged every step once, and the
  // ranks agree (ReadLosses fails the test otherwise); the first steps
  // follow the one process's trajectory (later ones drift apart in any
  // other layout, as floating-point sums in another order do).
  for (const LossLogLine& line : ReadLossLogLines(logs, job)) {
    ASSERT_EQ(line.generation, static_cast<int>(running.generation()))
        << (line.resume ? "resume" : "step") << " " << line.step;
  }
  const std::map<int, std::string> losses = ReadLosses(logs, job, /*repeat_tolerance=*/0);
  ASSERT_GE(losses.size(), static_cast<size_t>(step_at_heal));
  int expected = 1;
  for (const auto& [step, text] : losses) ASSERT_EQ(step, expected++) << "a step is missing";
  constexpr int kCompared = 40;
  const std::vector<double> reference = ReferenceLosses(spec, kCompared);
  for (int step = 1; step <= kCompared; ++step) {
    EXPECT_EQ(std::strtod(losses.at(step).c_str(), nullptr),
              reference[static_cast<size_t>(step - 1)])
        << "step " << step;
  }
  std::printf("coordinator cut from every host for 20 s at step %d: training reached step %d "
              "meanwhile; the 4 workers were re-adopted in generation %llu (no re-plan), "
              "reporting again %.2f s after the heal\n",
              step_at_cut, step_at_heal, static_cast<unsigned long long>(done.generation()),
              absl::ToDoubleSeconds(readopted_in));
}

// Hosts 1 and 2 lose their path to each other (both ways, or only host 2's
// sends to host 1) while both still reach the coordinator. The dp 4 job's
// step fails within the collective timeout; the next generation's
// connections name the pairs that cannot reach each other, and the job is
// re-planned onto workers that all can (one host), from their state, with
// no rank left hanging. Once healed, it grows back onto both hosts.
void MultiHostTest::SplitHosts(bool one_way) {
  NetnsHosts& hosts = *hosts_;
  LocalCluster& cluster = *cluster_;
  const std::vector<std::string>& logs = logs_;
  const v1::JobSpec spec = ElasticSpec(one_way ? "one-way" : "split", 1, 1, 2, 4,
                                       /*zero1=*/true, /*steps=*/1000000);
  auto on = [](const v1::Job& j, const std::string& host) {
    int n = 0;
    for (const v1::MeshMember& m : j.mesh().members()) n += m.worker_id().substr(0, 2) == host;
    return n;
  };
  std::string job;
  v1::Job running;
  ASSERT_NO_FATAL_FAILURE(StartOnFourWorkers(spec, &job, &running));

  if (!one_way) {
    ASSERT_TRUE(hosts.Cut(1, 2).ok());
  }
  ASSERT_TRUE(hosts.Cut(2, 1).ok());
  const absl::Time cut_at = absl::Now();
  const v1::Job split = cluster.WaitForJob(
      job, [&](const v1::Job& j) {
        return Finished(j) || (LocalCluster::RunningAndReady(j, 2) &&
                               (on(j, "h1") == 2 || on(j, "h2") == 2) &&
                               j.progress().step() > running.progress().step());
      },
      absl::Seconds(120), "the job on one host");
  const absl::Duration replanned_in = absl::Now() - cut_at;
  ASSERT_EQ(split.state(), v1::JOB_STATE_RUNNING) << split.message();
  EXPECT_EQ(split.recovery().kind(), v1::RECOVERY_KIND_PEER) << split.recovery().reason();

  if (!one_way) {
    ASSERT_TRUE(hosts.Heal(1, 2).ok());
  }
  ASSERT_TRUE(hosts.Heal(2, 1).ok());
  const v1::Job joined = cluster.WaitForJob(
      job, [&](const v1::Job& j) {
        return Finished(j) || (LocalCluster::RunningAndReady(j, 4) &&
                               j.progress().step() > split.progress().step());
      },
      absl::Seconds(120), "the job across both hosts again");
  ASSERT_EQ(joined.state(), v1::JOB_STATE_RUNNING) << joined.message();
  ASSERT_TRUE(cluster.Cancel(job).ok());
  const v1::Job done = cluster.WaitForJob(job, Finished, absl::Seconds(60), "the job to end");
  EXPECT_EQ(done.state(), v1::JOB_STATE_CANCELLED) << done.message();
  // Ranks of each generation agree; steps trained again in another layout
  // repeat exactly (the deterministic reduction).
  ReadLosses(logs, job, /*repeat_tolerance=*/0);
  std::printf("hosts 1 and 2 cut %s at step %lld: re-planned onto %s in %.2f s (%s, "
              "%lld steps lost); back on both hosts in generation %llu after the heal\n",
              one_way ? "one way (2 -> 1)" : "from each other",
              static_cast<long long>(running.progress().step()),
              on(split, "h1") == 2 ? "host 1" : "host 2", absl::ToDoubleSeconds(replanned_in),
              v1::RecoveryKind_Name(split.recovery().kind()).c_str(),
              static_cast<long long>(split.recovery().lost_steps()),
              static_cast<unsigned long long>(joined.generation()));
}

TEST_F(MultiHostTest, TwoHostsCutFromEachOtherLeaveAJobOnOneHostAndNoRankHangs) {
  SplitHosts(/*one_way=*/false);
}

TEST_F(MultiHostTest, AOneWayCutBetweenHostsIsHandledLikeACut) { SplitHosts(/*one_way=*/true); }

// The value of gauge `name` (no labels) in a Prometheus text page, if any.
std::optional<double> Gauge(const std::string& page, const std::string& name) {
  for (const absl::string_view line : absl::StrSplit(page, '\n')) {
    if (!absl::StartsWith(line, name + " ")) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(name.size() + 1), &value)) return value;
  }
  return std::nullopt;
}

TEST_F(MultiHostTest, AHostOnA100MbitLinkSlowsEveryRankAndTheJobCompletes) {
  // Host 2's link is limited to 100 Mbit/s (both directions) while a dp 4
  // job trains: every rank's step time (cohort_worker_step_seconds) rises
  // to what the slow link allows, since each step's ring crosses it, and
  // the job still completes with the one process's trajectory.
  NetnsHosts& hosts = *hosts_;
  LocalCluster& cluster = *cluster_;
  const std::vector<std::string>& logs = logs_;
  const v1::JobSpec spec = ElasticSpec("slow-link", 1, 1, 4, 4, /*zero1=*/true, /*steps=*/40);
  std::string job;
  v1::Job running;
  ASSERT_NO_FATAL_FAILURE(StartOnFourWorkers(spec, &job, &running));
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = cluster.ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  // Every rank's last step time, the largest of a few scrapes.
  auto step_seconds = [&] {
    std::map<std::string, double> out;
    for (int sample = 0; sample < 3; ++sample) {
      for (const v1::WorkerInfo& w : *workers) {
        absl::StatusOr<std::string> page =
            HttpGet(w.metrics_address(), "/metrics", absl::Seconds(5));
        if (!page.ok()) continue;
        const std::optional<double> v = Gauge(*page, "cohort_worker_step_seconds");
        if (v.has_value()) out[w.worker_id()] = std::max(out[w.worker_id()], *v);
      }
    }
    return out;
  };
  const std::map<std::string, double> before = step_seconds();
  ASSERT_EQ(before.size(), 4u);

  constexpr int64_t kRate = 100'000'000;  // bits/s
  ASSERT_TRUE(hosts.LimitRate(2, kRate).ok());
  const int64_t limited_at = cluster.WaitForJob(job, [](const v1::Job&) { return true; },
                                                absl::Seconds(10), "the job")
                                 .progress()
                                 .step();
  cluster.WaitForJob(
      job, [&](const v1::Job& j) { return Finished(j) || j.progress().step() >= limited_at + 4; },
      absl::Seconds(120), "steps on the slow link");
  const std::map<std::string, double> slow = step_seconds();
  // The data group is hierarchical (2 hosts x 2 ranks): a step's ordered
  // reduce-scatter of the fp32 gradients sends half of each lane's slice
  // across, and ZeRO-1's gather of the updated weights the other half, so
  // host 2's link carries the gradients' size each way per step: the link
  // alone takes at least this long, and every rank waits for it.
  absl::StatusOr<train::TrainingConfig> config = train::TrainingConfigFromSpec(spec, {});
  ASSERT_TRUE(config.ok()) << config.status();
  const double gradient_bytes =
      4.0 * static_cast<double>(model::ParameterTable(config->model).num_params());
  const double floor_seconds = gradient_bytes * 8 / static_cast<double>(kRate);
  ASSERT_EQ(slow.size(), 4u);
  for (const auto& [worker, seconds] : slow) {
    EXPECT_GE(seconds, 0.8 * floor_seconds)
        << worker << ": " << seconds << " s per step on the slow link (before: " << before.at(worker)
        << " s)";
    // The link's time comes on top of the step's compute (the reduction
    // follows the backward pass): a margin of half of it, not a ratio, so
    // that a busy machine's slower compute before the limit does not hide it.
    EXPECT_GT(seconds, before.at(worker) + 0.5 * floor_seconds)
        << worker << ": " << seconds << " s per step on the slow link, " << before.at(worker)
        << " s before it";
  }
  const v1::Job done = cluster.WaitForJob(job, Finished, absl::Seconds(240), "the job to end");
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.message();
  EXPECT_EQ(done.generation(), running.generation()) << "a slow link is not a failure";
  const std::map<int, std::string> losses = ReadLosses(logs, job, /*repeat_tolerance=*/0);
  const std::vector<double> reference = ReferenceLosses(spec);
  ASSERT_EQ(losses.size(), reference.size());
  for (const auto& [step, text] : losses) {
    EXPECT_EQ(std::strtod(text.c_str(), nullptr), reference[static_cast<size_t>(step - 1)])
        << "step " << step;
  }
  std::printf("host 2 limited to 100 Mbit/s: step time per rank");
  for (const auto& [worker, seconds] : slow) {
    std::printf(" %s %.3f s (was %.3f s)", worker.c_str(), seconds, before.at(worker));
  }
  std::printf("; the link alone needs >= %.3f s\n", floor_seconds);
}

}  // namespace
}  // namespace cohort::testing

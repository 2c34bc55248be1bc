// A survivor blocked inside a collective that ignores its own timeout (as
// NCCL waits on a dead peer) is freed, and keeps its session for the next
// generation: by the call watchdog when the call overruns its timeout plus
// --collective_watchdog_grace (the run then reports the lost peer itself),
// and by a Suspend whenever it comes. Two trainers as threads over in-process
// communicators (tests/testing/thread_comms.h); the survivor's data group
// blocks on demand (tests/testing/blocking_communicator.h) and its time is a
// FakeClock, so the watchdog fires exactly when the test moves it.

#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/jobs/recovery_planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/testing/blocking_communicator.h"
#include "tests/testing/engine_runs.h"
#include "tests/testing/thread_comms.h"
#include "tests/testing/wait.h"
#include "worker/engine/engine_trainer.h"

namespace cohort::worker {
namespace {

using ::testing::HasSubstr;
using testing::Together;

constexpr absl::Duration kWait = absl::Seconds(60);
constexpr absl::Duration kPoll = absl::Milliseconds(1);
constexpr absl::Duration kCollectiveTimeout = absl::Seconds(20);
constexpr absl::Duration kGrace = absl::Seconds(3);

// `inner`'s communicators, but the data group of generation `generation`
// blocks on demand (blocking()).
class HangingMesh {
 public:
  HangingMesh(CommsFactory inner, uint64_t generation)
      : inner_(std::move(inner)), generation_(generation) {}

  CommsFactory Factory() {
    return [this](const CommsRequest& request) -> absl::StatusOr<std::unique_ptr<GenerationComms>> {
      absl::StatusOr<std::unique_ptr<GenerationComms>> made = inner_(request);
      if (!made.ok() || request.assignment->generation != Generation(generation_) ||
          (*made)->groups().data == nullptr) {
        return made;
      }
      auto comms = std::make_unique<Comms>();
      comms->inner = *std::move(made);
      comms->data = std::make_unique<testing::BlockingCommunicator>(comms->inner->groups().data);
      absl::MutexLock lock(&mu_);
      blocking_ = comms->data.get();
      return std::unique_ptr<GenerationComms>(std::move(comms));
    };
  }
  // The hanging generation's data group (null before it is built).
  testing::BlockingCommunicator* blocking() {
    absl::MutexLock lock(&mu_);
    return blocking_;
  }

 private:
  struct Comms : GenerationComms {
    train::TrainingGroups groups() const override {
      train::TrainingGroups groups = inner->groups();
      groups.data = data.get();
      return groups;
    }
    comm::Communicator* world() const override { return inner->world(); }
    void Abort(const absl::Status& reason) override {
      data->Abort(reason);
      inner->Abort(reason);
    }
    std::unique_ptr<GenerationComms> inner;
    std::unique_ptr<testing::BlockingCommunicator> data;
  };
  const CommsFactory inner_;
  const uint64_t generation_;
  absl::Mutex mu_;
  testing::BlockingCommunicator* blocking_ ABSL_GUARDED_BY(mu_) = nullptr;
};

class EngineTrainerWatchdogTest : public ::testing::Test {
 protected:
  // Timed by `clock` (the test's FakeClock for the survivor), with `comms`.
  std::unique_ptr<EngineTrainer> NewTrainer(const Clock* clock, CommsFactory comms) {
    EngineTrainerOptions options = testing::OfflineEngineOptions(clock);
    options.collective_timeout = kCollectiveTimeout;
    options.collective_watchdog_grace = kGrace;
    options.comms_factory = std::move(comms);
    options.registry = registry_;
    options.on_finished = [this](const JobId&, Generation generation, const absl::Status& s) {
      absl::MutexLock lock(&mu_);
      finished_.push_back({generation, s});
    };
    options.on_suspended = [this](const JobId&, Generation generation,
                                  const std::vector<v1::HeldState>&, const absl::Status& s) {
      absl::MutexLock lock(&mu_);
      suspended_.push_back({generation, s});
    };
    return std::make_unique<EngineTrainer>(std::move(options));
  }

  // The statuses of `n` runs of `generation` that ended through `ended`
  // (finished_ or suspended_), once there are that many.
  std::vector<absl::Status> WaitEnded(std::vector<std::pair<Generation, absl::Status>>* ended,
                                      uint64_t generation, size_t n) {
    absl::MutexLock lock(&mu_);
    auto matching = [&] {
      std::vector<absl::Status> out;
      for (const auto& [g, s] : *ended) {
        if (g == Generation(generation)) out.push_back(s);
      }
      return out;
    };
    auto enough = [&] { return matching().size() >= n; };
    EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&enough), kWait))
        << "generation " << generation << ": " << matching().size() << " of " << n << " ended";
    return matching();
  }

  // Generation `generation` of `spec` on two fresh members, to the end; the
  // final loss.
  double FaultFreeLoss(const v1::JobSpec& spec, uint64_t generation) {
    std::unique_ptr<EngineTrainer> a = NewTrainer(RealClock::Get(), mesh_.Factory());
    std::unique_ptr<EngineTrainer> b = NewTrainer(RealClock::Get(), mesh_.Factory());
    const v1::Mesh two = testing::EngineMesh(2);
    for (const absl::Status& s :
         Together({[&] { return a->Prepare(testing::EngineMember(spec, generation, two, 0)); },
                   [&] { return b->Prepare(testing::EngineMember(spec, generation, two, 1)); }})) {
      EXPECT_TRUE(s.ok()) << s;
    }
    for (const absl::Status& s : WaitEnded(&finished_, generation, 2)) EXPECT_TRUE(s.ok()) << s;
    return a->progress().loss.value_or(-1);
  }

  // Generation 1 on two members: `survivor` (rank 0, over hanging_'s
  // communicators) and a peer; some steps in, the survivor's next data-group
  // call blocks and the peer stops, as a peer dies under NCCL.
  void TrainUntilBlocked(const v1::JobSpec& spec, EngineTrainer& survivor) {
    std::unique_ptr<EngineTrainer> peer = NewTrainer(RealClock::Get(), mesh_.Factory());
    const v1::Mesh two = testing::EngineMesh(2);
    for (const absl::Status& s :
         Together({[&] { return survivor.Prepare(testing::EngineMember(spec, 1, two, 0)); },
                   [&] { return peer->Prepare(testing::EngineMember(spec, 1, two, 1)); }})) {
      ASSERT_TRUE(s.ok()) << s;
    }
    ASSERT_TRUE(
        testing::WaitUntil([&] { return survivor.progress().step >= Step(3); }, kWait, kPoll));
    hanging_.blocking()->Arm();
    ASSERT_TRUE(testing::WaitUntil([&] { return hanging_.blocking()->blocked(); }, kWait, kPoll));
    peer->Stop();
  }

  // Generation 2: a spare takes rank 1's place, from the survivor's memory
  // at `step`; both train to the end. The survivor's final loss.
  double RecoverWithASpare(EngineTrainer& survivor, int64_t step) {
    const v1::Mesh two = testing::EngineMesh(2);
    v1::Mesh next = two;
    next.mutable_members(1)->set_worker_id("spare");
    coordinator::RecoveryInput input;
    input.source = coordinator::StateSource{Generation(1), two, true, 2};
    input.holders = {{two.members(0).worker_id(), step}};
    input.next_mesh = next;
    v1::RecoveryPlan plan = coordinator::PlanRecovery(input);
    EXPECT_EQ(plan.kind(), v1::RECOVERY_KIND_PEER) << plan.reason();
    std::unique_ptr<EngineTrainer> spare = NewTrainer(RealClock::Get(), mesh_.Factory());
    worker::Assignment mine = testing::EngineMember(spec_, 2, next, 0);
    worker::Assignment theirs = testing::EngineMember(spec_, 2, next, 1);
    mine.recovery = theirs.recovery = plan;
    for (const absl::Status& s : Together(
             {[&] { return survivor.Prepare(mine); }, [&] { return spare->Prepare(theirs); }})) {
      EXPECT_TRUE(s.ok()) << s;
    }
    // Trains on the session it had (nothing allocated, nothing received).
    EXPECT_TRUE(survivor.last_prepare().session_kept());
    EXPECT_EQ(survivor.last_prepare().restore_bytes(), 0u);
    for (const absl::Status& s : WaitEnded(&finished_, 2, 2)) EXPECT_TRUE(s.ok()) << s;
    return survivor.progress().loss.value_or(-1);
  }

  double WatchdogAborts() {
    double total = 0;
    for (const prometheus::MetricFamily& family : registry_->Collect()) {
      if (family.name != "cohort_worker_collective_watchdog_aborts_total") continue;
      for (const prometheus::ClientMetric& metric : family.metric) total += metric.counter.value;
    }
    return total;
  }

  const v1::JobSpec spec_ = testing::EngineJobSpec(30, /*replicas=*/2);
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  testing::ThreadMesh mesh_;
  HangingMesh hanging_{mesh_.Factory(), 1};
  FakeClock clock_;
  absl::Mutex mu_;
  std::vector<std::pair<Generation, absl::Status>> finished_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<Generation, absl::Status>> suspended_ ABSL_GUARDED_BY(mu_);
};

TEST_F(EngineTrainerWatchdogTest, TheWatchdogFreesABlockedSurvivorThatKeepsItsSession) {
  const double fault_free = FaultFreeLoss(spec_, 9);
  std::unique_ptr<EngineTrainer> a = NewTrainer(&clock_, hanging_.Factory());
  TrainUntilBlocked(spec_, *a);
  const float* weights = a->weights_for_testing();
  ASSERT_NE(weights, nullptr);

  // Its own timeout is no help (the call ignores it); at the timeout plus
  // the grace the watchdog aborts it, and the run reports a lost peer.
  clock_.Advance(kCollectiveTimeout + kGrace);
  const std::vector<absl::Status> suspended = WaitEnded(&suspended_, 1, 1);
  ASSERT_EQ(suspended.size(), 1u);
  EXPECT_TRUE(absl::IsDeadlineExceeded(suspended[0])) << suspended[0];
  EXPECT_THAT(suspended[0].message(), HasSubstr("watchdog: the data group's"));
  EXPECT_THAT(suspended[0].message(), HasSubstr("its timeout 20s plus a grace of 3s"));
  EXPECT_EQ(WatchdogAborts(), 1);

  const std::vector<v1::HeldState> held = a->Suspend();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].generation(), 1u);
  EXPECT_EQ(RecoverWithASpare(*a, held[0].step()), fault_free) << "from step " << held[0].step();
  EXPECT_EQ(a->weights_for_testing(), weights);
}

TEST_F(EngineTrainerWatchdogTest, ASuspendFreesABlockedSurvivorBeforeTheWatchdogWould) {
  const double fault_free = FaultFreeLoss(spec_, 9);
  std::unique_ptr<EngineTrainer> a = NewTrainer(&clock_, hanging_.Factory());
  TrainUntilBlocked(spec_, *a);
  const float* weights = a->weights_for_testing();

  // The clock stands still: only the Suspend's abort can end the call.
  std::future<std::vector<v1::HeldState>> suspending =
      std::async(std::launch::async, [&] { return a->Suspend(); });
  ASSERT_EQ(suspending.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  const std::vector<v1::HeldState> held = suspending.get();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].generation(), 1u);
  {
    absl::MutexLock lock(&mu_);
    EXPECT_TRUE(suspended_.empty());  // suspended by the coordinator, not on its own
  }
  EXPECT_EQ(WatchdogAborts(), 0);
  EXPECT_EQ(RecoverWithASpare(*a, held[0].step()), fault_free) << "from step " << held[0].step();
  EXPECT_EQ(a->weights_for_testing(), weights);
}

}  // namespace
}  // namespace cohort::worker

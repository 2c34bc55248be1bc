// CallWatchdog (worker/comm/call_watchdog.h) through TrackedCommunicator,
// over communicators that block until Abort whatever their timeout
// (tests/testing/blocking_communicator.h): the watchdog frees the caller once
// the call's timeout plus the grace has passed on the clock, not before,
// with an error that names the group, the call and the deadline, and aborts
// every communicator of the call's domain. Timed by a FakeClock; every wait
// for the blocked thread is bounded.

#include "worker/comm/call_watchdog.h"

#include <atomic>
#include <future>
#include <memory>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/blocking_communicator.h"
#include "tests/testing/wait.h"
#include "worker/comm/tracked_communicator.h"

namespace cohort::comm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(5);
constexpr absl::Duration kGrace = absl::Seconds(2);
// Real time allowed for a freed thread to return (it needs none to speak of).
constexpr std::chrono::seconds kReturnBound(20);

class RecordingObserver : public CollectiveObserver {
 public:
  void Observe(Collective, size_t, absl::Duration) override {}
  void WatchdogAborted(Collective collective) override {
    absl::MutexLock lock(&mu_);
    aborted_.push_back(collective);
  }
  std::vector<Collective> aborted() {
    absl::MutexLock lock(&mu_);
    return aborted_;
  }

 private:
  absl::Mutex mu_;
  std::vector<Collective> aborted_;
};

class CallWatchdogTest : public ::testing::Test {
 protected:
  // Only Poll() checks, unless a test makes its own watchdog.
  CallWatchdogTest()
      : watchdog_(CallWatchdogOptions{
            .grace = kGrace, .poll_interval = absl::InfiniteDuration(), .clock = &clock_}) {
    data_.Watch(&watchdog_, "data", &domain_);
    tensor_.Watch(&watchdog_, "tensor", &domain_);
  }

  // Runs `call` on its own thread once it is blocked in `blocking`.
  static std::future<absl::Status> StartBlocked(testing::BlockingCommunicator& blocking,
                                                std::function<absl::Status()> call) {
    std::future<absl::Status> done = std::async(std::launch::async, std::move(call));
    EXPECT_TRUE(testing::WaitUntil([&] { return blocking.blocked(); }, absl::Seconds(20),
                                   absl::Milliseconds(1)));
    return done;
  }

  // Ends the blocked calls, so that a failed test fails rather than waits
  // for its threads forever; a no-op where they were freed.
  void ReleaseAll() {
    data_inner_.Abort(absl::CancelledError("test over"));
    tensor_inner_.Abort(absl::CancelledError("test over"));
  }

  FakeClock clock_;
  CallWatchdog watchdog_;
  testing::BlockingCommunicator data_inner_{nullptr}, tensor_inner_{nullptr};
  std::atomic<int> in_flight_{0};
  RecordingObserver observer_;
  TrackedCommunicator data_{&data_inner_, &in_flight_, &observer_};
  TrackedCommunicator tensor_{&tensor_inner_, &in_flight_};
  // The generation: aborting it aborts both groups, as GenerationRun::Abort.
  std::vector<absl::Status> domain_aborts_;
  AbortDomain domain_{[this](const absl::Status& reason) {
    domain_aborts_.push_back(reason);
    data_inner_.Abort(reason);
    tensor_inner_.Abort(reason);
  }};
};

TEST_F(CallWatchdogTest, ACallBlockedPastItsTimeoutPlusTheGraceIsAbortedAndNamed) {
  data_inner_.Arm(Collective::kAllReduce);
  tensor_inner_.Arm();
  float value = 1;
  std::future<absl::Status> reduce = StartBlocked(data_inner_, [&] {
    return data_.AllReduce(&value, 1, DataType::kFloat32, ReduceOp::kSum, kTimeout);
  });
  std::future<absl::Status> other = StartBlocked(tensor_inner_, [&] {
    return tensor_.Recv(&value, sizeof(value), 1, 0, absl::InfiniteDuration());
  });
  absl::Cleanup release = [this] { ReleaseAll(); };
  EXPECT_EQ(in_flight_.load(), 2);

  // Not a moment before its deadline.
  clock_.Advance(kTimeout + kGrace - absl::Nanoseconds(1));
  EXPECT_EQ(watchdog_.Poll(), 0);
  EXPECT_TRUE(data_inner_.blocked());
  EXPECT_TRUE(domain_aborts_.empty());

  clock_.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(watchdog_.Poll(), 1);
  ASSERT_EQ(reduce.wait_for(kReturnBound), std::future_status::ready);
  const absl::Status status = reduce.get();
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("the data group's allreduce"));
  EXPECT_THAT(status.message(), HasSubstr("its timeout 5s plus a grace of 2s"));
  EXPECT_THAT(status.message(), HasSubstr("due at 2023-11-14T22:13:27+00:00"));
  // The communicator itself was aborted with that reason, then the domain.
  EXPECT_EQ(data_inner_.abort_reason(), status);
  ASSERT_EQ(domain_aborts_.size(), 1u);
  EXPECT_EQ(domain_aborts_[0], status);
  // The other group's call, with no deadline of its own, ended with it and
  // says why (not a bare Aborted, which would read as a Suspend).
  ASSERT_EQ(other.wait_for(kReturnBound), std::future_status::ready);
  EXPECT_EQ(other.get(), status);
  EXPECT_EQ(in_flight_.load(), 0);
  EXPECT_THAT(observer_.aborted(), ElementsAre(Collective::kAllReduce));
  EXPECT_EQ(watchdog_.aborts(), 1);
  // Later calls of the generation fail the same way, without a wait.
  EXPECT_EQ(data_.Barrier(kTimeout), status);
}

TEST_F(CallWatchdogTest, TheMonitorThreadFreesTheCallWithoutAPoll) {
  CallWatchdog watchdog(CallWatchdogOptions{
      .grace = kGrace, .poll_interval = absl::Milliseconds(1), .clock = &clock_});
  data_.Watch(&watchdog, "pipeline", &domain_);
  data_inner_.Arm();
  std::vector<char> buffer(8);
  std::future<absl::Status> exchange = StartBlocked(data_inner_, [&] {
    return data_.SendRecv(buffer.data(), 4, 1, buffer.data() + 4, 4, 1, 0, kTimeout);
  });
  absl::Cleanup release = [this] { ReleaseAll(); };
  clock_.Advance(kTimeout + kGrace);
  ASSERT_EQ(exchange.wait_for(kReturnBound), std::future_status::ready);
  const absl::Status status = exchange.get();
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("the pipeline group's sendrecv"));
  EXPECT_EQ(watchdog.aborts(), 1);
  data_.Watch(nullptr, "", nullptr);
}

TEST_F(CallWatchdogTest, ACallThatReturnsIsNoLongerWatched) {
  float value = 1;
  ASSERT_TRUE(data_.AllReduce(&value, 1, DataType::kFloat32, ReduceOp::kSum, kTimeout).ok());
  clock_.Advance(absl::Hours(1));
  EXPECT_EQ(watchdog_.Poll(), 0);
  EXPECT_TRUE(domain_aborts_.empty());
  EXPECT_TRUE(data_.Barrier(kTimeout).ok());
}

TEST_F(CallWatchdogTest, AnAbortByOthersIsNotTheWatchdogs) {
  // A Suspend aborts the generation: the call says Aborted, as before.
  data_inner_.Arm();
  std::future<absl::Status> barrier =
      StartBlocked(data_inner_, [&] { return data_.Barrier(kTimeout); });
  data_inner_.Abort(absl::AbortedError("trainer suspended"));
  ASSERT_EQ(barrier.wait_for(kReturnBound), std::future_status::ready);
  const absl::Status status = barrier.get();
  EXPECT_TRUE(absl::IsAborted(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("trainer suspended"));
  clock_.Advance(absl::Hours(1));
  EXPECT_EQ(watchdog_.Poll(), 0);
}

}  // namespace
}  // namespace cohort::comm

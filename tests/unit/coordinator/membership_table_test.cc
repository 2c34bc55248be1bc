#include "coordinator/membership/membership_table.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::Hello MakeHello(const std::string& id, uint64_t incarnation, const std::string& host = "h0",
                    int device_index = 0, v1::DeviceKind kind = v1::DEVICE_KIND_CPU) {
  v1::Hello hello;
  hello.set_worker_id(id);
  hello.set_incarnation(incarnation);
  hello.set_host(host);
  hello.set_device_index(device_index);
  hello.set_device_kind(kind);
  hello.set_metrics_address(absl::StrCat(host, ":9465"));
  hello.mutable_capabilities()->set_cpu_cores(4);
  return hello;
}

std::vector<std::string> Ids(const std::vector<const WorkerRecord*>& records) {
  std::vector<std::string> ids;
  for (const WorkerRecord* r : records) ids.push_back(r->id.value());
  return ids;
}

// The ids of the IDLE workers of `kind`, in the index's order.
std::vector<std::string> IdleIds(const MembershipTable& table, v1::DeviceKind kind) {
  std::vector<std::string> ids;
  table.ForEachIdle(kind, [&](const WorkerRecord& record) {
    ids.push_back(record.id.value());
    return true;
  });
  return ids;
}

std::vector<std::string> Ids(const std::vector<LostWorker>& lost) {
  std::vector<std::string> ids;
  for (const LostWorker& l : lost) ids.push_back(l.id.value());
  return ids;
}

const WorkerId kW0("w0");
const WorkerId kW1("w1");
const JobId kJob("job-a");

class MembershipTableTest : public ::testing::Test {
 protected:
  void JoinOk(const v1::Hello& hello) {
    absl::StatusOr<JoinResult> result = table_.Join(hello, clock_.Now());
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_FALSE(result->replaced_previous);
  }

  FakeClock clock_;
  MembershipTable table_{MembershipTable::Options{}};
};

TEST_F(MembershipTableTest, JoinRecordsTheHello) {
  JoinOk(MakeHello("w0", 11, "hostA", 3, v1::DEVICE_KIND_GPU));
  const WorkerRecord* record = table_.Find(kW0);
  ASSERT_NE(record, nullptr);
  EXPECT_EQ(record->incarnation, Incarnation(11));
  EXPECT_EQ(record->host, "hostA");
  EXPECT_EQ(record->device_index, 3);
  EXPECT_EQ(record->device_kind, v1::DEVICE_KIND_GPU);
  EXPECT_EQ(record->metrics_address, "hostA:9465");
  EXPECT_EQ(record->capabilities.cpu_cores(), 4);
  EXPECT_EQ(record->state, WorkerState::kIdle);
  EXPECT_EQ(record->joined_at, clock_.Now());
  EXPECT_EQ(record->last_heartbeat, clock_.Now());
  EXPECT_FALSE(record->job.has_value());
  EXPECT_EQ(table_.size(), 1u);
  EXPECT_EQ(table_.Find(WorkerId("nobody")), nullptr);
}

TEST_F(MembershipTableTest, JoinRejectsBadHellos) {
  absl::StatusOr<JoinResult> r = table_.Join(MakeHello("", 1), clock_.Now());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("worker_id"));

  r = table_.Join(MakeHello("w0", 0), clock_.Now());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("incarnation"));

  r = table_.Join(MakeHello("w0", 1, "h", 0, v1::DEVICE_KIND_UNSPECIFIED), clock_.Now());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("device_kind"));
  EXPECT_EQ(table_.size(), 0u);
}

TEST_F(MembershipTableTest, DuplicateStreamOfSameIncarnationIsRefused) {
  JoinOk(MakeHello("w0", 7));
  ASSERT_TRUE(table_.AssignToJob(kW0, kJob).ok());
  absl::StatusOr<JoinResult> r = table_.Join(MakeHello("w0", 7, "other"), clock_.Now());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists);
  // The attached record is untouched.
  EXPECT_EQ(table_.Find(kW0)->host, "h0");
  EXPECT_EQ(table_.Find(kW0)->state, WorkerState::kAssigned);
}

TEST_F(MembershipTableTest, NewIncarnationReplacesOldAndReportsItsJob) {
  JoinOk(MakeHello("w0", 7));
  ASSERT_TRUE(table_.AssignToJob(kW0, kJob).ok());
  clock_.Advance(absl::Seconds(1));
  absl::StatusOr<JoinResult> r = table_.Join(MakeHello("w0", 8, "h1", 2), clock_.Now());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->replaced_previous);
  EXPECT_EQ(r->previous_job, kJob);
  const WorkerRecord* record = table_.Find(kW0);
  EXPECT_EQ(record->incarnation, Incarnation(8));
  EXPECT_EQ(record->host, "h1");
  EXPECT_EQ(record->state, WorkerState::kIdle);
  EXPECT_FALSE(record->job.has_value());
  EXPECT_EQ(table_.size(), 1u);

  // The old incarnation is fenced: its heartbeats are Aborted and its stream
  // closing late does not mark the new one lost.
  EXPECT_EQ(table_.Heartbeat(kW0, Incarnation(7), clock_.Now()).code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(
      table_.MarkLost(kW0, Incarnation(7), LossReason::kStreamBroken, clock_.Now()).has_value());
  EXPECT_EQ(table_.Find(kW0)->state, WorkerState::kIdle);
}

TEST_F(MembershipTableTest, ReplacingALostRecordReportsNoJob) {
  JoinOk(MakeHello("w0", 7));
  ASSERT_TRUE(table_.AssignToJob(kW0, kJob).ok());
  ASSERT_TRUE(
      table_.MarkLost(kW0, Incarnation(7), LossReason::kStreamBroken, clock_.Now()).has_value());
  absl::StatusOr<JoinResult> r = table_.Join(MakeHello("w0", 9), clock_.Now());
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->replaced_previous);
  EXPECT_FALSE(r->previous_job.has_value());  // already reported by MarkLost
  EXPECT_EQ(table_.Find(kW0)->state, WorkerState::kIdle);
}

TEST_F(MembershipTableTest, BrokenStreamMarksLostAtOnce) {
  JoinOk(MakeHello("w0", 7));
  ASSERT_TRUE(table_.AssignToJob(kW0, kJob).ok());
  clock_.Advance(absl::Milliseconds(400));
  std::optional<LostWorker> lost =
      table_.MarkLost(kW0, Incarnation(7), LossReason::kStreamBroken, clock_.Now());
  ASSERT_TRUE(lost.has_value());
  EXPECT_EQ(lost->id, kW0);
  EXPECT_EQ(lost->incarnation, Incarnation(7));
  EXPECT_EQ(lost->job, kJob);
  EXPECT_EQ(lost->reason, LossReason::kStreamBroken);
  EXPECT_EQ(lost->silence, absl::Milliseconds(400));

  const WorkerRecord* record = table_.Find(kW0);
  EXPECT_EQ(record->state, WorkerState::kLost);
  EXPECT_EQ(record->loss_reason, LossReason::kStreamBroken);
  EXPECT_EQ(record->lost_at, clock_.Now());
  EXPECT_FALSE(record->job.has_value());

  // Twice is a no-op; heartbeats of a lost worker are refused.
  EXPECT_FALSE(
      table_.MarkLost(kW0, Incarnation(7), LossReason::kStreamBroken, clock_.Now()).has_value());
  EXPECT_EQ(table_.Heartbeat(kW0, Incarnation(7), clock_.Now()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(
      table_.MarkLost(WorkerId("x"), Incarnation(1), LossReason::kStreamBroken, clock_.Now()));
}

TEST_F(MembershipTableTest, SameIncarnationRejoinsAfterLoss) {
  JoinOk(MakeHello("w0", 7));
  ASSERT_TRUE(table_.MarkLost(kW0, Incarnation(7), LossReason::kStreamBroken, clock_.Now()));
  clock_.Advance(absl::Seconds(2));
  JoinOk(MakeHello("w0", 7));
  const WorkerRecord* record = table_.Find(kW0);
  EXPECT_EQ(record->state, WorkerState::kIdle);
  EXPECT_FALSE(record->loss_reason.has_value());
  EXPECT_EQ(record->last_heartbeat, clock_.Now());
  EXPECT_TRUE(table_.Heartbeat(kW0, Incarnation(7), clock_.Now()).ok());
}

TEST_F(MembershipTableTest, HeartbeatErrors) {
  EXPECT_EQ(table_.Heartbeat(kW0, Incarnation(1), clock_.Now()).code(),
            absl::StatusCode::kNotFound);
  JoinOk(MakeHello("w0", 7));
  EXPECT_EQ(table_.Heartbeat(kW0, Incarnation(6), clock_.Now()).code(), absl::StatusCode::kAborted);
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(table_.Heartbeat(kW0, Incarnation(7), clock_.Now()).ok());
  EXPECT_EQ(table_.Find(kW0)->last_heartbeat, clock_.Now());
}

TEST_F(MembershipTableTest, ExpireMarksSilentWorkersLostAfterTimeout) {
  JoinOk(MakeHello("w0", 1));
  JoinOk(MakeHello("w1", 2));
  ASSERT_TRUE(table_.AssignToJob(kW1, kJob).ok());
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(table_.Heartbeat(kW0, Incarnation(1), clock_.Now()).ok());

  // w1 silent for exactly the timeout: not yet lost.
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(table_.Expire(clock_.Now()).empty());

  clock_.Advance(absl::Milliseconds(100));
  std::vector<LostWorker> lost = table_.Expire(clock_.Now());
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].id, kW1);
  EXPECT_EQ(lost[0].reason, LossReason::kHeartbeatTimeout);
  EXPECT_EQ(lost[0].job, kJob);
  EXPECT_EQ(lost[0].silence, absl::Milliseconds(3100));
  EXPECT_EQ(table_.Find(kW1)->state, WorkerState::kLost);
  EXPECT_EQ(table_.Find(kW0)->state, WorkerState::kIdle);

  // Reported once only.
  EXPECT_TRUE(table_.Expire(clock_.Now()).empty());
  EXPECT_EQ(table_.CountInState(WorkerState::kLost), 1);
}

TEST_F(MembershipTableTest, ExpireHonoursConfiguredTimeoutAndSortsById) {
  MembershipTable table(MembershipTable::Options{.heartbeat_timeout = absl::Milliseconds(500)});
  for (const char* id : {"w3", "w1", "w2"}) {
    ASSERT_TRUE(table.Join(MakeHello(id, 5), clock_.Now()).ok());
  }
  ASSERT_TRUE(table.MarkDraining(WorkerId("w2")).ok());
  clock_.Advance(absl::Milliseconds(501));
  EXPECT_THAT(Ids(table.Expire(clock_.Now())), ElementsAre("w1", "w2", "w3"));
}

TEST_F(MembershipTableTest, LostRecordsAreForgottenAfterRetention) {
  MembershipTable table(MembershipTable::Options{.heartbeat_timeout = absl::Seconds(3),
                                                 .lost_retention = absl::Minutes(1)});
  ASSERT_TRUE(table.Join(MakeHello("w0", 1), clock_.Now()).ok());
  ASSERT_TRUE(table.MarkLost(kW0, Incarnation(1), LossReason::kStreamBroken, clock_.Now()));
  clock_.Advance(absl::Minutes(1));
  EXPECT_TRUE(table.Expire(clock_.Now()).empty());
  EXPECT_NE(table.Find(kW0), nullptr);  // exactly the retention: still listed
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(table.Expire(clock_.Now()).empty());
  EXPECT_EQ(table.Find(kW0), nullptr);
  EXPECT_EQ(table.size(), 0u);
}

// The counts are kept by every state change; they agree with a scan of the
// records through joins, assignment, draining, loss, a device-kind change
// on re-join and forgetting.
TEST_F(MembershipTableTest, CountsFollowEveryStateChange) {
  MembershipTable table(MembershipTable::Options{.heartbeat_timeout = absl::Seconds(3),
                                                 .lost_retention = absl::Minutes(1)});
  auto expect_counts = [&](int idle, int assigned, int lost, int draining, int cpu, int gpu) {
    EXPECT_EQ(table.CountInState(WorkerState::kIdle), idle);
    EXPECT_EQ(table.CountInState(WorkerState::kAssigned), assigned);
    EXPECT_EQ(table.CountInState(WorkerState::kLost), lost);
    EXPECT_EQ(table.CountInState(WorkerState::kDraining), draining);
    EXPECT_EQ(table.CountAttached(v1::DEVICE_KIND_CPU), cpu);
    EXPECT_EQ(table.CountAttached(v1::DEVICE_KIND_GPU), gpu);
    int scanned_idle = 0;
    for (const WorkerRecord* r : table.List()) scanned_idle += r->state == WorkerState::kIdle;
    EXPECT_EQ(scanned_idle, idle);
  };
  expect_counts(0, 0, 0, 0, 0, 0);
  ASSERT_TRUE(table.Join(MakeHello("w0", 1), clock_.Now()).ok());
  ASSERT_TRUE(table.Join(MakeHello("w1", 1, "h0", 1, v1::DEVICE_KIND_GPU), clock_.Now()).ok());
  expect_counts(2, 0, 0, 0, 1, 1);
  ASSERT_TRUE(table.AssignToJob(kW0, kJob).ok());
  expect_counts(1, 1, 0, 0, 1, 1);
  ASSERT_TRUE(table.MarkDraining(kW0).ok());
  expect_counts(1, 0, 0, 1, 1, 1);
  ASSERT_TRUE(table.MarkLost(kW0, Incarnation(1), LossReason::kLeft, clock_.Now()));
  expect_counts(1, 0, 1, 0, 0, 1);
  // w0 comes back as a GPU worker: its kind changes while it is LOST.
  ASSERT_TRUE(table.Join(MakeHello("w0", 2, "h0", 0, v1::DEVICE_KIND_GPU), clock_.Now()).ok());
  expect_counts(2, 0, 0, 0, 0, 2);
  // A new process under w1's name replaces the attached one.
  ASSERT_TRUE(table.Join(MakeHello("w1", 7, "h0", 1, v1::DEVICE_KIND_CPU), clock_.Now()).ok());
  expect_counts(2, 0, 0, 0, 1, 1);
  ASSERT_TRUE(table.MarkLost(kW1, Incarnation(7), LossReason::kStreamBroken, clock_.Now()));
  clock_.Advance(absl::Minutes(2));
  const std::vector<LostWorker> silent = table.Expire(clock_.Now());
  EXPECT_THAT(Ids(silent), ElementsAre("w0"));  // heartbeat timeout
  clock_.Advance(absl::Minutes(2));
  EXPECT_TRUE(table.Expire(clock_.Now()).empty());  // both forgotten
  expect_counts(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(table.size(), 0u);
}

TEST_F(MembershipTableTest, AssignAndRelease) {
  JoinOk(MakeHello("w0", 1));
  EXPECT_EQ(table_.AssignToJob(WorkerId("x"), kJob).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(table_.AssignToJob(kW0, kJob).ok());
  EXPECT_EQ(table_.Find(kW0)->state, WorkerState::kAssigned);
  EXPECT_EQ(table_.Find(kW0)->job, kJob);
  EXPECT_TRUE(table_.AssignToJob(kW0, kJob).ok());  // idempotent for the same job
  absl::Status other = table_.AssignToJob(kW0, JobId("job-b"));
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.message(), HasSubstr("job-a"));

  table_.Release(kW0);
  EXPECT_EQ(table_.Find(kW0)->state, WorkerState::kIdle);
  EXPECT_FALSE(table_.Find(kW0)->job.has_value());
  table_.Release(kW0);            // idle: no-op
  table_.Release(WorkerId("x"));  // unknown: no-op
  EXPECT_TRUE(table_.AssignToJob(kW0, JobId("job-b")).ok());
}

TEST_F(MembershipTableTest, DrainingLeavesJobOnReleaseAndTakesNoAssignments) {
  JoinOk(MakeHello("w0", 1));
  JoinOk(MakeHello("w1", 2));
  ASSERT_TRUE(table_.AssignToJob(kW0, kJob).ok());
  ASSERT_TRUE(table_.MarkDraining(kW0).ok());
  ASSERT_TRUE(table_.MarkDraining(kW1).ok());
  EXPECT_EQ(table_.Find(kW0)->state, WorkerState::kDraining);
  EXPECT_EQ(table_.Find(kW0)->job, kJob);
  EXPECT_EQ(table_.AssignToJob(kW1, kJob).code(), absl::StatusCode::kFailedPrecondition);

  table_.Release(kW0);
  EXPECT_EQ(table_.Find(kW0)->state, WorkerState::kDraining);
  EXPECT_FALSE(table_.Find(kW0)->job.has_value());

  EXPECT_EQ(table_.MarkDraining(WorkerId("x")).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(table_.MarkLost(kW1, Incarnation(2), LossReason::kStreamBroken, clock_.Now()));
  EXPECT_EQ(table_.MarkDraining(kW1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table_.AssignToJob(kW1, kJob).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(MembershipTableTest, ListAndIdleOrdering) {
  JoinOk(MakeHello("w2", 1, "hb", 0));
  JoinOk(MakeHello("w0", 1, "hb", 1));
  JoinOk(MakeHello("w1", 1, "ha", 5));
  JoinOk(MakeHello("w3", 1, "ha", 0, v1::DEVICE_KIND_GPU));
  JoinOk(MakeHello("w4", 1, "ha", 1));
  ASSERT_TRUE(table_.AssignToJob(WorkerId("w4"), kJob).ok());

  EXPECT_THAT(Ids(table_.List()), ElementsAre("w0", "w1", "w2", "w3", "w4"));
  EXPECT_THAT(IdleIds(table_, v1::DEVICE_KIND_CPU), ElementsAre("w1", "w2", "w0"));
  EXPECT_THAT(IdleIds(table_, v1::DEVICE_KIND_GPU), ElementsAre("w3"));
  // ForEachIdle stops when told.
  std::vector<std::string> visited;
  table_.ForEachIdle(v1::DEVICE_KIND_CPU, [&](const WorkerRecord& record) {
    visited.push_back(record.id.value());
    return visited.size() < 2;
  });
  EXPECT_THAT(visited, ElementsAre("w1", "w2"));
  EXPECT_TRUE(
      MembershipTable::IdleBefore(*table_.Find(WorkerId("w1")), *table_.Find(WorkerId("w0"))));
  EXPECT_EQ(table_.CountInState(WorkerState::kIdle), 4);
  EXPECT_EQ(table_.CountInState(WorkerState::kAssigned), 1);
  EXPECT_EQ(table_.CountInState(WorkerState::kDraining), 0);
}

TEST(MembershipNamesTest, StateAndReasonNames) {
  EXPECT_STREQ(WorkerStateName(WorkerState::kIdle), "idle");
  EXPECT_STREQ(WorkerStateName(WorkerState::kAssigned), "assigned");
  EXPECT_STREQ(WorkerStateName(WorkerState::kLost), "lost");
  EXPECT_STREQ(WorkerStateName(WorkerState::kDraining), "draining");
  EXPECT_STREQ(LossReasonName(LossReason::kStreamBroken), "stream_broken");
  EXPECT_STREQ(LossReasonName(LossReason::kHeartbeatTimeout), "heartbeat_timeout");
  EXPECT_STREQ(LossReasonName(LossReason::kReplaced), "replaced");
}

TEST(MembershipScaleTest, ExpireOverTenThousandWorkers) {
  FakeClock clock;
  MembershipTable table(MembershipTable::Options{});
  for (int i = 0; i < 10000; ++i) {
    ASSERT_TRUE(
        table.Join(MakeHello(absl::StrCat("w", i), 1, absl::StrCat("h", i / 8), i % 8), clock.Now())
            .ok());
  }
  // Every worker but the multiples of 1000 keeps heartbeating at 1 s; poll
  // every 100 ms as the coordinator does.
  int lost = 0;
  for (int tick = 1; tick <= 40; ++tick) {
    clock.Advance(absl::Milliseconds(100));
    if (tick % 10 == 0) {
      for (int i = 0; i < 10000; ++i) {
        if (i % 1000 != 0) {
          ASSERT_TRUE(
              table.Heartbeat(WorkerId(absl::StrCat("w", i)), Incarnation(1), clock.Now()).ok());
        }
      }
    }
    lost += static_cast<int>(table.Expire(clock.Now()).size());
  }
  EXPECT_EQ(lost, 10);
  EXPECT_EQ(table.CountInState(WorkerState::kLost), 10);
  EXPECT_EQ(table.CountInState(WorkerState::kIdle), 9990);
}

// Issue 22: the idle workers come from an index every state change keeps, not from
// a scan and sort of every worker per job per scheduling pass. Checked
// against the definition (a filter and sort of List()) after each change.
TEST_F(MembershipTableTest, TheIdleIndexFollowsEveryStateChange) {
  auto scanned = [this](v1::DeviceKind kind) {
    std::vector<const WorkerRecord*> idle;
    for (const WorkerRecord* r : table_.List()) {
      if (r->state == WorkerState::kIdle && r->device_kind == kind) idle.push_back(r);
    }
    std::sort(idle.begin(), idle.end(), [](const WorkerRecord* a, const WorkerRecord* b) {
      return std::tie(a->host, a->device_index, a->id) < std::tie(b->host, b->device_index, b->id);
    });
    return Ids(idle);
  };
  auto check = [&](const std::string& after) {
    for (v1::DeviceKind kind : {v1::DEVICE_KIND_CPU, v1::DEVICE_KIND_GPU}) {
      EXPECT_EQ(IdleIds(table_, kind), scanned(kind)) << "after " << after;
      EXPECT_EQ(table_.HasIdle(kind), !scanned(kind).empty()) << "after " << after;
    }
  };
  JoinOk(MakeHello("w2", 1, "hb", 1));
  JoinOk(MakeHello("w1", 1, "hb", 0));
  JoinOk(MakeHello("w0", 1, "ha", 5));
  JoinOk(MakeHello("g0", 1, "ha", 0, v1::DEVICE_KIND_GPU));
  check("joins");
  EXPECT_THAT(IdleIds(table_, v1::DEVICE_KIND_CPU), ElementsAre("w0", "w1", "w2"));
  ASSERT_TRUE(table_.AssignToJob(kW1, kJob).ok());
  check("assign");
  ASSERT_TRUE(table_.MarkDraining(kW0).ok());
  check("drain");
  table_.Release(kW1);
  check("release");
  ASSERT_TRUE(table_.MarkLost(WorkerId("w2"), Incarnation(1), LossReason::kStreamBroken,
                              clock_.Now())
                  .has_value());
  check("lost");
  // w1 restarts on another host: it moves in the order.
  ASSERT_TRUE(table_.Join(MakeHello("w1", 2, "hc", 0), clock_.Now()).ok());
  check("rejoin elsewhere");
  EXPECT_THAT(IdleIds(table_, v1::DEVICE_KIND_CPU), ElementsAre("w1"));
  // w2 comes back (same incarnation after a broken stream).
  ASSERT_TRUE(table_.Join(MakeHello("w2", 1, "hb", 1), clock_.Now()).ok());
  check("rejoin");
  clock_.Advance(absl::Seconds(60));
  table_.Expire(clock_.Now());
  check("expire");
  EXPECT_FALSE(table_.HasIdle(v1::DEVICE_KIND_CPU));
  clock_.Advance(absl::Hours(1));
  table_.Expire(clock_.Now());  // forgets the lost records
  check("forget");
}

// NewestHeartbeat is kept as workers are heard (the coordinator's isolation
// check asks on every tick); it must equal the newest Hello or heartbeat
// heard, and count only the workers not LOST now.
TEST(MembershipNewestHeartbeatTest, TheNewestHelloOrHeartbeatHeardWhileEnoughAreAlive) {
  FakeClock clock;
  MembershipTable table{MembershipTable::Options{}};
  EXPECT_EQ(table.NewestHeartbeat(1), std::nullopt) << "no worker yet";
  ASSERT_TRUE(table.Join(MakeHello("w0", 1), clock.Now()).ok());
  const absl::Time first = clock.Now();
  EXPECT_EQ(table.NewestHeartbeat(1), first);
  EXPECT_EQ(table.NewestHeartbeat(2), std::nullopt) << "one worker is not two";
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(table.Join(MakeHello("w1", 2), clock.Now()).ok());
  EXPECT_EQ(table.NewestHeartbeat(2), clock.Now());
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(table.Heartbeat(WorkerId("w0"), Incarnation(1), clock.Now()).ok());
  const absl::Time heard = clock.Now();
  EXPECT_EQ(table.NewestHeartbeat(2), heard);
  // A heartbeat stamped earlier than the newest (a late message) moves nothing.
  ASSERT_TRUE(table.Heartbeat(WorkerId("w1"), Incarnation(2), heard - absl::Seconds(1)).ok());
  EXPECT_EQ(table.NewestHeartbeat(2), heard);
  // w0, heard last, is lost: it was still heard then, but one alive is not two.
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(table.MarkLost(WorkerId("w0"), Incarnation(1), LossReason::kStreamBroken, clock.Now())
                  .has_value());
  EXPECT_EQ(table.NewestHeartbeat(1), heard);
  EXPECT_EQ(table.NewestHeartbeat(2), std::nullopt);
  // The coordinator's own stall moves it later, at most to now.
  clock.Advance(absl::Seconds(10));
  table.Discount(absl::Seconds(4), clock.Now());
  EXPECT_EQ(table.NewestHeartbeat(1), heard + absl::Seconds(4));
  table.Discount(absl::Hours(1), clock.Now());
  EXPECT_EQ(table.NewestHeartbeat(1), clock.Now());
}

}  // namespace
}  // namespace cohort::coordinator

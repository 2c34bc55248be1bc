// A Watch client that does not read is dropped, not buffered for (issue 21,
// found 3): the outbox coalesces progress and refuses past its limits.

#include "coordinator/service/watch_outbox.h"

#include <string>

#include "gtest/gtest.h"

namespace cohort::coordinator {
namespace {

using Added = WatchOutbox::Added;

v1::JobEvent Event(v1::JobEventKind kind, int64_t step, size_t padding = 0) {
  v1::JobEvent event;
  event.set_kind(kind);
  event.mutable_job()->set_job_id("job-1");
  event.mutable_job()->mutable_progress()->set_step(step);
  if (padding > 0) event.mutable_job()->set_message(std::string(padding, 'x'));
  return event;
}

TEST(WatchOutboxTest, TheFirstEventStartsAWriteAndLaterOnesWaitBehindIt) {
  WatchOutbox outbox;
  EXPECT_EQ(outbox.Add(Event(v1::JOB_EVENT_KIND_SNAPSHOT, 0)), Added::kStartWrite);
  EXPECT_EQ(outbox.Add(Event(v1::JOB_EVENT_KIND_STATE_CHANGED, 1)), Added::kQueued);
  EXPECT_EQ(outbox.front().kind(), v1::JOB_EVENT_KIND_SNAPSHOT);
  EXPECT_TRUE(outbox.PopWritten());
  EXPECT_EQ(outbox.front().kind(), v1::JOB_EVENT_KIND_STATE_CHANGED);
  EXPECT_FALSE(outbox.PopWritten());
  EXPECT_TRUE(outbox.empty());
  EXPECT_EQ(outbox.bytes(), 0u);
  EXPECT_EQ(outbox.Add(Event(v1::JOB_EVENT_KIND_PROGRESS, 2)), Added::kStartWrite);
}

TEST(WatchOutboxTest, WaitingProgressIsReplacedByNewerProgressButTheWriteInFlightIsNot) {
  WatchOutbox outbox;
  ASSERT_EQ(outbox.Add(Event(v1::JOB_EVENT_KIND_PROGRESS, 1)), Added::kStartWrite);
  // The front is being written: a second progress event must queue.
  EXPECT_EQ(outbox.Add(Event(v1::JOB_EVENT_KIND_PROGRESS, 2)), Added::kQueued);
  for (int step = 3; step < 1000; ++step) {
    EXPECT_EQ(outbox.Add(Event(v1::JOB_EVENT_KIND_PROGRESS, step)), Added::kCoalesced);
  }
  EXPECT_EQ(outbox.size(), 2u);
  EXPECT_EQ(outbox.bytes(), Event(v1::JOB_EVENT_KIND_PROGRESS, 1).ByteSizeLong() +
                                Event(v1::JOB_EVENT_KIND_PROGRESS, 999).ByteSizeLong());
  EXPECT_TRUE(outbox.PopWritten());
  EXPECT_EQ(outbox.front().job().progress().step(), 999);
  // A state change is never coalesced away.
  EXPECT_EQ(outbox.Add(Event(v1::JOB_EVENT_KIND_STATE_CHANGED, 1000)), Added::kQueued);
  EXPECT_EQ(outbox.Add(Event(v1::JOB_EVENT_KIND_PROGRESS, 1001)), Added::kQueued);
  EXPECT_EQ(outbox.size(), 3u);
}

TEST(WatchOutboxTest, AWatcherThatFallsMoreThanTheEventLimitBehindOverflows) {
  WatchOutbox outbox;
  ASSERT_EQ(outbox.Add(Event(v1::JOB_EVENT_KIND_SNAPSHOT, 0)), Added::kStartWrite);
  for (size_t i = 0; i < WatchOutbox::kMaxEvents; ++i) {
    ASSERT_EQ(outbox.Add(Event(v1::JOB_EVENT_KIND_STATE_CHANGED, i)), Added::kQueued) << i;
  }
  const size_t bytes = outbox.bytes();
  EXPECT_EQ(outbox.Add(Event(v1::JOB_EVENT_KIND_STATE_CHANGED, 99)), Added::kOverflow);
  EXPECT_EQ(outbox.size(), WatchOutbox::kMaxEvents + 1) << "an overflow queues nothing";
  EXPECT_EQ(outbox.bytes(), bytes);
  // Once the client reads, there is room again.
  ASSERT_TRUE(outbox.PopWritten());
  EXPECT_EQ(outbox.Add(Event(v1::JOB_EVENT_KIND_STATE_CHANGED, 100)), Added::kQueued);
}

TEST(WatchOutboxTest, AWatcherThatFallsMoreThanTheByteLimitBehindOverflows) {
  constexpr size_t kEvent = 1 << 20;
  WatchOutbox outbox;
  // The event in flight does not count: a client reading a large snapshot
  // still has the whole byte budget for what follows.
  ASSERT_EQ(outbox.Add(Event(v1::JOB_EVENT_KIND_SNAPSHOT, 0, 4 * kEvent)), Added::kStartWrite);
  const size_t fit = WatchOutbox::kMaxBytes / Event(v1::JOB_EVENT_KIND_STATE_CHANGED, 1, kEvent).ByteSizeLong();
  ASSERT_GE(fit, 2u);
  for (size_t i = 0; i < fit; ++i) {
    ASSERT_EQ(outbox.Add(Event(v1::JOB_EVENT_KIND_STATE_CHANGED, 1, kEvent)), Added::kQueued) << i;
  }
  EXPECT_EQ(outbox.Add(Event(v1::JOB_EVENT_KIND_STATE_CHANGED, 2, kEvent)), Added::kOverflow);
  EXPECT_LE(outbox.bytes() - outbox.front().ByteSizeLong(), WatchOutbox::kMaxBytes);
}

TEST(WatchOutboxTest, OneWaitingEventIsAllowedWhateverItsSize) {
  WatchOutbox outbox;
  ASSERT_EQ(outbox.Add(Event(v1::JOB_EVENT_KIND_SNAPSHOT, 0)), Added::kStartWrite);
  EXPECT_EQ(outbox.Add(Event(v1::JOB_EVENT_KIND_STATE_CHANGED, 1, WatchOutbox::kMaxBytes + 1)),
            Added::kQueued);
  EXPECT_EQ(outbox.Add(Event(v1::JOB_EVENT_KIND_STATE_CHANGED, 2)), Added::kOverflow);
}

}  // namespace
}  // namespace cohort::coordinator

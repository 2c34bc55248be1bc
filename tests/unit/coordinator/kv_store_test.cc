#include "coordinator/kv_store.h"

#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

KvScope Scope(const std::string& job, uint64_t generation) {
  return KvScope{JobId(job), Generation(generation)};
}

// Records every result a waiter callback receives, so tests can check that it
// ran exactly once and with what.
struct Recorder {
  std::vector<absl::StatusOr<std::string>> results;
  KvWaiterCallback Callback() {
    return [this](absl::StatusOr<std::string> result) { results.push_back(std::move(result)); };
  }
};

void RunAll(std::vector<KvCompletion> completions) {
  for (KvCompletion& completion : completions) completion.Run();
}

class KvStoreTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  KvStore store_{KvStore::Options{}};
};

TEST_F(KvStoreTest, SetThenGetReturnsValue) {
  ASSERT_TRUE(store_.Set(Scope("j", 1), "addr/0", "tcp://a").ok());
  absl::StatusOr<std::string> value = store_.Get(Scope("j", 1), "addr/0");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "tcp://a");
  EXPECT_EQ(store_.key_count(), 1u);
}

TEST_F(KvStoreTest, GetMissingKeyIsNotFoundNamingKeyAndScope) {
  absl::StatusOr<std::string> value = store_.Get(Scope("j", 3), "nope");
  EXPECT_EQ(value.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(value.status().message(), HasSubstr("\"nope\""));
  EXPECT_THAT(value.status().message(), HasSubstr("job j generation 3"));
}

TEST_F(KvStoreTest, SetOverwritesWithoutAddingAKey) {
  ASSERT_TRUE(store_.Set(Scope("j", 1), "k", "first").ok());
  ASSERT_TRUE(store_.Set(Scope("j", 1), "k", "second").ok());
  EXPECT_EQ(*store_.Get(Scope("j", 1), "k"), "second");
  EXPECT_EQ(store_.key_count(), 1u);
}

TEST_F(KvStoreTest, BinaryValuesRoundTrip) {
  const std::string value("\0\x01\xff tail", 7);
  ASSERT_TRUE(store_.Set(Scope("j", 1), "nccl", value).ok());
  EXPECT_EQ(*store_.Get(Scope("j", 1), "nccl"), value);
}

TEST_F(KvStoreTest, WaitForExistingKeyCompletesAtOnce) {
  ASSERT_TRUE(store_.Set(Scope("j", 1), "k", "v").ok());
  Recorder recorder;
  std::vector<KvCompletion> completions =
      store_.WaitFor(Scope("j", 1), "k", clock_.Now() + absl::Seconds(5), recorder.Callback());
  ASSERT_THAT(completions, SizeIs(1));
  EXPECT_EQ(store_.waiter_count(), 0u);
  RunAll(std::move(completions));
  ASSERT_THAT(recorder.results, SizeIs(1));
  EXPECT_EQ(*recorder.results[0], "v");
}

TEST_F(KvStoreTest, WaiterIsCompletedBySetExactlyOnce) {
  Recorder recorder;
  EXPECT_THAT(
      store_.WaitFor(Scope("j", 1), "k", clock_.Now() + absl::Seconds(5), recorder.Callback()),
      IsEmpty());
  EXPECT_EQ(store_.waiter_count(), 1u);

  absl::StatusOr<std::vector<KvCompletion>> completions = store_.Set(Scope("j", 1), "k", "v");
  ASSERT_TRUE(completions.ok()) << completions.status();
  ASSERT_THAT(*completions, SizeIs(1));
  // Completions are returned, not run: nothing has been delivered yet.
  EXPECT_THAT(recorder.results, IsEmpty());
  EXPECT_EQ(store_.waiter_count(), 0u);
  RunAll(std::move(*completions));
  ASSERT_THAT(recorder.results, SizeIs(1));
  EXPECT_EQ(*recorder.results[0], "v");

  // Neither a second Set nor a later Expire reaches the completed waiter.
  absl::StatusOr<std::vector<KvCompletion>> again = store_.Set(Scope("j", 1), "k", "w");
  ASSERT_TRUE(again.ok());
  EXPECT_THAT(*again, IsEmpty());
  EXPECT_THAT(store_.Expire(clock_.Now() + absl::Hours(1)), IsEmpty());
  EXPECT_THAT(recorder.results, SizeIs(1));
}

TEST_F(KvStoreTest, SeveralWaitersOnOneKeyAllGetTheValueInOrder) {
  std::vector<int> order;
  std::vector<std::string> values;
  for (int i = 0; i < 3; ++i) {
    store_.WaitFor(Scope("j", 1), "barrier", clock_.Now() + absl::Seconds(10 - i),
                   [i, &order, &values](absl::StatusOr<std::string> result) {
                     order.push_back(i);
                     values.push_back(result.ok() ? *result : result.status().ToString());
                   });
  }
  // A waiter on another key is untouched.
  Recorder other;
  store_.WaitFor(Scope("j", 1), "other", clock_.Now() + absl::Seconds(10), other.Callback());
  EXPECT_EQ(store_.waiter_count(), 4u);

  absl::StatusOr<std::vector<KvCompletion>> completions =
      store_.Set(Scope("j", 1), "barrier", "go");
  ASSERT_TRUE(completions.ok());
  RunAll(std::move(*completions));
  EXPECT_THAT(order, ElementsAre(0, 1, 2));
  EXPECT_THAT(values, ElementsAre("go", "go", "go"));
  EXPECT_THAT(other.results, IsEmpty());
  EXPECT_EQ(store_.waiter_count(), 1u);
}

TEST_F(KvStoreTest, ExpireCompletesOnlyDueWaitersWithDeadlineExceeded) {
  const absl::Time start = clock_.Now();
  Recorder early, late;
  store_.WaitFor(Scope("j", 2), "early", start + absl::Seconds(1), early.Callback());
  store_.WaitFor(Scope("j", 2), "late", start + absl::Seconds(3), late.Callback());

  EXPECT_THAT(store_.Expire(start + absl::Milliseconds(999)), IsEmpty());
  EXPECT_EQ(store_.waiter_count(), 2u);

  clock_.Advance(absl::Seconds(1));  // exactly the deadline: due
  std::vector<KvCompletion> expired = store_.Expire(clock_.Now());
  ASSERT_THAT(expired, SizeIs(1));
  RunAll(std::move(expired));
  ASSERT_THAT(early.results, SizeIs(1));
  EXPECT_EQ(early.results[0].status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(early.results[0].status().message(), HasSubstr("\"early\""));
  EXPECT_THAT(early.results[0].status().message(), HasSubstr("job j generation 2"));
  EXPECT_THAT(late.results, IsEmpty());
  EXPECT_EQ(store_.waiter_count(), 1u);

  // The expired waiter is gone: a later Set does not complete it again.
  absl::StatusOr<std::vector<KvCompletion>> set = store_.Set(Scope("j", 2), "early", "v");
  ASSERT_TRUE(set.ok());
  EXPECT_THAT(*set, IsEmpty());

  clock_.Advance(absl::Seconds(5));
  RunAll(store_.Expire(clock_.Now()));
  ASSERT_THAT(late.results, SizeIs(1));
  EXPECT_EQ(late.results[0].status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(store_.waiter_count(), 0u);
  EXPECT_THAT(early.results, SizeIs(1));
}

TEST_F(KvStoreTest, ExpireRemovesOneOfSeveralWaitersOnAKey) {
  const absl::Time start = clock_.Now();
  Recorder short_wait, long_wait;
  store_.WaitFor(Scope("j", 1), "k", start + absl::Seconds(1), short_wait.Callback());
  store_.WaitFor(Scope("j", 1), "k", start + absl::Seconds(9), long_wait.Callback());
  RunAll(store_.Expire(start + absl::Seconds(2)));
  ASSERT_THAT(short_wait.results, SizeIs(1));
  EXPECT_FALSE(short_wait.results[0].ok());

  absl::StatusOr<std::vector<KvCompletion>> set = store_.Set(Scope("j", 1), "k", "v");
  ASSERT_TRUE(set.ok());
  RunAll(std::move(*set));
  ASSERT_THAT(long_wait.results, SizeIs(1));
  EXPECT_EQ(*long_wait.results[0], "v");
  EXPECT_THAT(short_wait.results, SizeIs(1));
}

TEST_F(KvStoreTest, ExpireWalksDeadlinesInOrderAcrossManyWaiters) {
  const absl::Time start = clock_.Now();
  std::vector<int> expired_order;
  // Registered in reverse deadline order, spread over scopes and keys.
  for (int i = 99; i >= 0; --i) {
    store_.WaitFor(Scope(i % 2 ? "a" : "b", static_cast<uint64_t>(i % 3)), absl::StrCat("k", i),
                   start + absl::Seconds(i), [i, &expired_order](absl::StatusOr<std::string>) {
                     expired_order.push_back(i);
                   });
  }
  RunAll(store_.Expire(start + absl::Seconds(49)));
  ASSERT_THAT(expired_order, SizeIs(50));
  for (int i = 0; i < 50; ++i) EXPECT_EQ(expired_order[i], i);
  EXPECT_EQ(store_.waiter_count(), 50u);
  RunAll(store_.Expire(start + absl::Seconds(1000)));
  EXPECT_THAT(expired_order, SizeIs(100));
  EXPECT_EQ(store_.waiter_count(), 0u);
}

TEST_F(KvStoreTest, CancelWaiterCompletesItOnceWithCancelled) {
  Recorder recorder;
  uint64_t id = 0;
  EXPECT_TRUE(store_.WaitFor(Scope("j", 1), "k", absl::InfiniteFuture(), recorder.Callback(), &id)
                  .empty());
  ASSERT_NE(id, 0u);
  std::vector<KvCompletion> cancelled = store_.CancelWaiter(Scope("j", 1), "k", id);
  ASSERT_EQ(cancelled.size(), 1u);
  for (KvCompletion& c : cancelled) c.Run();
  ASSERT_EQ(recorder.results.size(), 1u);
  EXPECT_EQ(recorder.results[0].status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(store_.waiter_count(), 0u);
  EXPECT_TRUE(store_.CancelWaiter(Scope("j", 1), "k", id).empty());  // gone
  EXPECT_TRUE(store_.Expire(absl::InfiniteFuture()).empty());
}

TEST_F(KvStoreTest, ScopesAreIsolated) {
  ASSERT_TRUE(store_.Set(Scope("j", 1), "k", "j1").ok());
  ASSERT_TRUE(store_.Set(Scope("j", 2), "k", "j2").ok());
  ASSERT_TRUE(store_.Set(Scope("other", 1), "k", "other1").ok());
  EXPECT_EQ(*store_.Get(Scope("j", 1), "k"), "j1");
  EXPECT_EQ(*store_.Get(Scope("j", 2), "k"), "j2");
  EXPECT_EQ(*store_.Get(Scope("other", 1), "k"), "other1");
  EXPECT_EQ(store_.Get(Scope("other", 2), "k").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_.key_count(), 3u);

  // A waiter in one scope is not completed by a Set of the same key elsewhere.
  Recorder recorder;
  store_.WaitFor(Scope("j", 3), "x", clock_.Now() + absl::Seconds(5), recorder.Callback());
  for (const KvScope& scope : {Scope("j", 2), Scope("other", 3)}) {
    absl::StatusOr<std::vector<KvCompletion>> set = store_.Set(scope, "x", "wrong");
    ASSERT_TRUE(set.ok());
    EXPECT_THAT(*set, IsEmpty());
  }
  absl::StatusOr<std::vector<KvCompletion>> set = store_.Set(Scope("j", 3), "x", "right");
  ASSERT_TRUE(set.ok());
  RunAll(std::move(*set));
  ASSERT_THAT(recorder.results, SizeIs(1));
  EXPECT_EQ(*recorder.results[0], "right");
}

TEST_F(KvStoreTest, DropScopeAbortsWaitersWithReasonAndRemovesKeys) {
  ASSERT_TRUE(store_.Set(Scope("j", 1), "k", "v").ok());
  ASSERT_TRUE(store_.Set(Scope("j", 2), "k", "kept").ok());
  Recorder first, second;
  store_.WaitFor(Scope("j", 1), "a", clock_.Now() + absl::Seconds(5), first.Callback());
  store_.WaitFor(Scope("j", 1), "b", clock_.Now() + absl::Seconds(5), second.Callback());

  RunAll(store_.DropScope(Scope("j", 1), "job j ended"));
  for (Recorder* recorder : {&first, &second}) {
    ASSERT_THAT(recorder->results, SizeIs(1));
    EXPECT_EQ(recorder->results[0].status().code(), absl::StatusCode::kAborted);
    EXPECT_THAT(recorder->results[0].status().message(), HasSubstr("job j ended"));
  }
  EXPECT_THAT(first.results[0].status().message(), HasSubstr("\"a\""));
  EXPECT_EQ(store_.Get(Scope("j", 1), "k").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*store_.Get(Scope("j", 2), "k"), "kept");
  EXPECT_EQ(store_.waiter_count(), 0u);
  EXPECT_EQ(store_.key_count(), 1u);
  // Aborted waiters left the deadline index too.
  EXPECT_THAT(store_.Expire(clock_.Now() + absl::Hours(1)), IsEmpty());
  EXPECT_THAT(store_.DropScope(Scope("never", 1), "nothing there"), IsEmpty());
}

TEST_F(KvStoreTest, DropOlderThanAbortsOlderGenerationsAndKeepsCurrent) {
  const absl::Time deadline = clock_.Now() + absl::Seconds(30);
  Recorder gen1, gen2, gen3, other_job;
  store_.WaitFor(Scope("j", 1), "k", deadline, gen1.Callback());
  store_.WaitFor(Scope("j", 2), "k", deadline, gen2.Callback());
  store_.WaitFor(Scope("j", 3), "k", deadline, gen3.Callback());
  store_.WaitFor(Scope("other", 1), "k", deadline, other_job.Callback());
  ASSERT_TRUE(store_.Set(Scope("j", 2), "old", "v").ok());
  ASSERT_TRUE(store_.Set(Scope("j", 3), "current", "v").ok());

  std::vector<KvCompletion> dropped =
      store_.DropOlderThan(JobId("j"), Generation(3), "generation 3 superseded older ones");
  ASSERT_THAT(dropped, SizeIs(2));
  RunAll(std::move(dropped));
  for (Recorder* recorder : {&gen1, &gen2}) {
    ASSERT_THAT(recorder->results, SizeIs(1));
    EXPECT_EQ(recorder->results[0].status().code(), absl::StatusCode::kAborted);
    EXPECT_THAT(recorder->results[0].status().message(),
                HasSubstr("generation 3 superseded older ones"));
  }
  EXPECT_THAT(gen3.results, IsEmpty());
  EXPECT_THAT(other_job.results, IsEmpty());
  EXPECT_EQ(store_.Get(Scope("j", 2), "old").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*store_.Get(Scope("j", 3), "current"), "v");
  EXPECT_EQ(store_.waiter_count(), 2u);

  // The current generation still works normally.
  absl::StatusOr<std::vector<KvCompletion>> set = store_.Set(Scope("j", 3), "k", "new");
  ASSERT_TRUE(set.ok());
  RunAll(std::move(*set));
  ASSERT_THAT(gen3.results, SizeIs(1));
  EXPECT_EQ(*gen3.results[0], "new");
}

TEST_F(KvStoreTest, DropOlderThanMaxGenerationDropsEveryScopeOfTheJob) {
  ASSERT_TRUE(store_.Set(Scope("j", 1), "k", "v").ok());
  ASSERT_TRUE(store_.Set(Scope("j", ~uint64_t{0}), "k", "v").ok());
  ASSERT_TRUE(store_.Set(Scope("other", 1), "k", "v").ok());
  store_.DropOlderThan(JobId("j"), Generation(~uint64_t{0}), "job ended");
  EXPECT_EQ(store_.key_count(), 1u);
  EXPECT_TRUE(store_.Get(Scope("other", 1), "k").ok());
}

TEST(KvStoreLimitsTest, RejectsBadKeysAndValuesNamingTheLimit) {
  KvStore store(
      KvStore::Options{.max_value_bytes = 8, .max_keys_per_scope = 100, .max_key_bytes = 4});
  absl::StatusOr<std::vector<KvCompletion>> empty_key = store.Set(Scope("j", 1), "", "v");
  EXPECT_EQ(empty_key.status().code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<std::vector<KvCompletion>> long_key = store.Set(Scope("j", 1), "12345", "v");
  EXPECT_EQ(long_key.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(long_key.status().message(), HasSubstr("limit of 4 bytes"));
  EXPECT_TRUE(store.Set(Scope("j", 1), "1234", "v").ok());

  absl::StatusOr<std::vector<KvCompletion>> big = store.Set(Scope("j", 1), "k", "123456789");
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(big.status().message(), HasSubstr("limit of 8 bytes (--max_kv_value_bytes)"));
  EXPECT_TRUE(store.Set(Scope("j", 1), "k", "12345678").ok());

  EXPECT_EQ(store.Get(Scope("j", 1), "12345").status().code(),
            absl::StatusCode::kResourceExhausted);

  // An invalid key given to WaitFor completes at once instead of waiting forever.
  Recorder recorder;
  std::vector<KvCompletion> completions =
      store.WaitFor(Scope("j", 1), "", absl::InfiniteFuture(), recorder.Callback());
  ASSERT_THAT(completions, SizeIs(1));
  RunAll(std::move(completions));
  ASSERT_THAT(recorder.results, SizeIs(1));
  EXPECT_EQ(recorder.results[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.waiter_count(), 0u);
}

TEST(KvStoreLimitsTest, KeysPerScopeLimitAllowsOverwriteAndOtherScopes) {
  KvStore store(KvStore::Options{.max_keys_per_scope = 2});
  ASSERT_TRUE(store.Set(Scope("j", 1), "a", "1").ok());
  ASSERT_TRUE(store.Set(Scope("j", 1), "b", "2").ok());

  absl::StatusOr<std::vector<KvCompletion>> third = store.Set(Scope("j", 1), "c", "3");
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("max_keys_per_scope=2"));
  EXPECT_THAT(third.status().message(), HasSubstr("job j generation 1"));
  EXPECT_EQ(store.Get(Scope("j", 1), "c").status().code(), absl::StatusCode::kNotFound);

  EXPECT_TRUE(store.Set(Scope("j", 1), "a", "overwrite").ok());
  EXPECT_TRUE(store.Set(Scope("j", 2), "c", "3").ok());
  EXPECT_EQ(store.key_count(), 3u);
}

// Issue 21: 65,536 keys of 1 MiB per scope was the only bound.
TEST(KvStoreLimitsTest, BytesPerJobAndInAllHaveABudgetFreedWithTheirScopes) {
  KvStore store(KvStore::Options{.max_bytes_per_job = 100, .max_total_bytes = 150});
  ASSERT_TRUE(store.Set(Scope("a", 1), "k", std::string(59, 'x')).ok());  // 60 bytes
  ASSERT_TRUE(store.Set(Scope("a", 2), "k", std::string(39, 'x')).ok());  // 100 for job a
  absl::StatusOr<std::vector<KvCompletion>> over = store.Set(Scope("a", 2), "l", "1");
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("job a's KeyValue holds 100 bytes"));
  // Overwriting with a shorter value frees bytes.
  ASSERT_TRUE(store.Set(Scope("a", 2), "k", "short").ok());  // 66 for job a
  ASSERT_TRUE(store.Set(Scope("b", 1), "k", std::string(79, 'x')).ok());  // 146 in all
  over = store.Set(Scope("b", 1), "l", std::string(9, 'x'));
  EXPECT_THAT(over.status().message(), HasSubstr("the KeyValue store holds 146 bytes"));
  EXPECT_EQ(store.total_bytes(), 146u);
  store.DropOlderThan(JobId("a"), Generation(std::numeric_limits<uint64_t>::max()), "gone");
  EXPECT_EQ(store.total_bytes(), 80u);
  EXPECT_TRUE(store.Set(Scope("b", 1), "l", std::string(9, 'x')).ok());
}

TEST(KvStoreLimitsTest, RefusedSetLeavesWaitersInPlace) {
  KvStore store(KvStore::Options{.max_value_bytes = 1});
  Recorder recorder;
  store.WaitFor(Scope("j", 1), "k", absl::InfiniteFuture(), recorder.Callback());
  EXPECT_FALSE(store.Set(Scope("j", 1), "k", "too long").ok());
  EXPECT_THAT(recorder.results, IsEmpty());
  EXPECT_EQ(store.waiter_count(), 1u);
}

}  // namespace
}  // namespace cohort::coordinator

// InMemoryCommunicator (worker/comm/in_memory_communicator.h): the
// Communicator the unit tests of the training code run on. Its collectives
// choose between the direct and ring algorithms as UcxCommunicator does
// (ring_algorithms_test checks the algorithms themselves); here: a group of
// one, the point-to-point calls, and the error contract of communicator.h
// (a failed call breaks the communicator for good, an abort reads as
// Aborted, a wrongly sized receive is InvalidArgument and leaves it usable).

#include "worker/comm/in_memory_communicator.h"

#include <numeric>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/rank_threads.h"

namespace cohort::comm {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(20);

std::vector<absl::Status> OnRanks(InMemoryFabric& fabric,
                                  const std::function<absl::Status(Communicator&)>& body) {
  return testing::RunOnRankThreads(fabric.size(), [&](int rank) {
    InMemoryCommunicator communicator(&fabric, rank);
    return body(communicator);
  });
}

TEST(InMemoryCommunicatorTest, AGroupOfOneKeepsOrCopiesItsOwnData) {
  InMemoryFabric fabric(1);
  InMemoryCommunicator one(&fabric, 0);
  std::vector<float> data = {1.5f, -2.0f, 3.0f};
  ASSERT_TRUE(one.AllReduce(data.data(), 3, DataType::kFloat32, ReduceOp::kSum, kTimeout).ok());
  EXPECT_EQ(data, (std::vector<float>{1.5f, -2.0f, 3.0f}));
  std::vector<float> out(3);
  ASSERT_TRUE(
      one.ReduceScatter(data.data(), out.data(), 3, DataType::kFloat32, ReduceOp::kSum, kTimeout)
          .ok());
  EXPECT_EQ(out, data);
  std::vector<float> gathered(3);
  ASSERT_TRUE(one.AllGather(data.data(), gathered.data(), 3, DataType::kFloat32, kTimeout).ok());
  EXPECT_EQ(gathered, data);
  EXPECT_TRUE(one.Broadcast(data.data(), 3, DataType::kFloat32, 0, kTimeout).ok());
  EXPECT_TRUE(one.Barrier(kTimeout).ok());
}

TEST(InMemoryCommunicatorTest, CollectivesPickTheAlgorithmBySizeAndAgreeWithTheSum) {
  // 1000 floats x 3 ranks is under kDirectMaxBytes (direct); 100,000 over
  // it (ring).
  for (size_t count : {size_t{1000}, size_t{100'000}}) {
    SCOPED_TRACE(absl::StrCat("count ", count));
    const int n = 3;
    std::vector<std::vector<int32_t>> data(n, std::vector<int32_t>(count));
    for (int r = 0; r < n; ++r) std::iota(data[r].begin(), data[r].end(), r * 7);
    InMemoryFabric fabric(n);
    const std::vector<absl::Status> statuses = OnRanks(fabric, [&](Communicator& c) {
      return c.AllReduce(data[c.rank()].data(), count, DataType::kInt32, ReduceOp::kSum, kTimeout);
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(statuses[r].ok()) << statuses[r];
      for (size_t i = 0; i < count; i += 997) {
        ASSERT_EQ(data[r][i], static_cast<int32_t>(3 * i + 21)) << "rank " << r << " at " << i;
      }
    }
  }
}

TEST(InMemoryCommunicatorTest, SendRecvBetweenNeighboursInBothDirectionsDoesNotDeadlock) {
  const int n = 4;
  std::vector<int> from_left(n, -1);
  InMemoryFabric fabric(n);
  const std::vector<absl::Status> statuses = OnRanks(fabric, [&](Communicator& c) {
    const int value = 100 + c.rank();
    return c.SendRecv(&value, sizeof(value), (c.rank() + 1) % n, &from_left[c.rank()], sizeof(int),
                      (c.rank() + n - 1) % n, /*tag=*/5, kTimeout);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    EXPECT_EQ(from_left[r], 100 + (r + n - 1) % n);
  }
}

TEST(InMemoryCommunicatorTest, MessagesOfOneTagArriveInOrderAndTagsDoNotMix) {
  InMemoryFabric fabric(2);
  std::vector<int> received;
  std::vector<absl::Status> statuses = OnRanks(fabric, [&](Communicator& c) -> absl::Status {
    for (int v : {1, 2, 3}) {
      const absl::Status s = c.rank() == 0 ? c.Send(&v, sizeof(v), 1, 9, kTimeout)
                                           : c.Recv(&v, sizeof(v), 0, 9, kTimeout);
      if (!s.ok()) return s;
      if (c.rank() == 1) received.push_back(v);
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(statuses[0].ok() && statuses[1].ok()) << statuses[0] << " " << statuses[1];
  EXPECT_EQ(received, (std::vector<int>{1, 2, 3}));
  // A receive on tag 8 never takes a message sent on tag 9: both wait out
  // their deadline (sends complete when received, in this transport).
  InMemoryFabric other(2);
  statuses = OnRanks(other, [&](Communicator& c) -> absl::Status {
    int v = 4;
    return c.rank() == 0 ? c.Send(&v, sizeof(v), 1, 9, absl::Milliseconds(200))
                         : c.Recv(&v, sizeof(v), 0, 8, absl::Milliseconds(200));
  });
  EXPECT_TRUE(absl::IsDeadlineExceeded(statuses[0])) << statuses[0];
  EXPECT_TRUE(absl::IsDeadlineExceeded(statuses[1])) << statuses[1];
}

TEST(InMemoryCommunicatorTest, AWronglySizedReceiveIsInvalidArgumentAndKeepsTheCommunicator) {
  InMemoryFabric fabric(2);
  const std::vector<absl::Status> statuses = OnRanks(fabric, [&](Communicator& c) -> absl::Status {
    int64_t big = 7;
    int32_t small = 0;
    if (c.rank() == 0) {
      if (absl::Status s = c.Send(&big, sizeof(big), 1, 0, kTimeout); !s.ok()) return s;
      return c.Send(&big, sizeof(big), 1, 0, kTimeout);
    }
    const absl::Status wrong = c.Recv(&small, sizeof(small), 0, 0, kTimeout);
    if (!absl::IsInvalidArgument(wrong)) return absl::InternalError(wrong.ToString());
    // Still usable: the next message arrives.
    int64_t right = 0;
    if (absl::Status s = c.Recv(&right, sizeof(right), 0, 0, kTimeout); !s.ok()) return s;
    return right == 7 ? absl::OkStatus() : absl::InternalError("wrong value");
  });
  EXPECT_TRUE(statuses[0].ok()) << statuses[0];
  EXPECT_TRUE(statuses[1].ok()) << statuses[1];
}

TEST(InMemoryCommunicatorTest, AFailedCallBreaksEveryLaterCallWithTheSameError) {
  InMemoryFabric fabric(2);
  fabric.Fail(1);
  InMemoryCommunicator c(&fabric, 0);
  float x = 1;
  const absl::Status first = c.AllReduce(&x, 1, DataType::kFloat32, ReduceOp::kSum, kTimeout);
  EXPECT_TRUE(absl::IsUnavailable(first)) << first;
  EXPECT_EQ(c.Barrier(kTimeout), first);
}

TEST(InMemoryCommunicatorTest, AbortEndsAWaitingCallAndEveryLaterOneWithAborted) {
  InMemoryFabric fabric(2);
  InMemoryCommunicator c(&fabric, 0);
  absl::Status waited;
  std::thread waiting([&] { waited = c.Barrier(absl::Seconds(30)); });
  c.Abort(absl::CancelledError("job stopped"));
  waiting.join();
  EXPECT_TRUE(absl::IsAborted(waited)) << waited;
  EXPECT_TRUE(absl::IsAborted(c.Barrier(kTimeout)));
}

}  // namespace
}  // namespace cohort::comm

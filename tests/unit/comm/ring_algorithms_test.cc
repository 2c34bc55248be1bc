// The collective algorithms (worker/comm/ring_algorithms.h) on the in-memory
// channel seam, ranks as threads: ring and direct all-reduce, reduce-scatter
// and all-gather for groups of 2, 3, 4 and 8 (a group of 1 never reaches
// them: the communicators answer it themselves, in_memory_communicator_test),
// counts that do not divide by the group and counts whose chunks span
// several ring segments, every data type; sums against a sum in double
// within n * (u + 2^-53) * sum |x| (u the type's unit roundoff: recursive
// summation of n terms errs by at most (n - 1) u sum |x|, and the double
// reference by its own share), integers exactly; every rank
// the same bits; the documented order of additions, bit for bit; and a
// failed, absent or aborted peer ends the call with an error, not a hang.

#include "worker/comm/ring_algorithms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/rank_threads.h"
#include "worker/comm/failed_peer.h"
#include "worker/comm/in_memory_channel.h"
#include "worker/comm/reduce.h"

namespace cohort::comm {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(20);
constexpr int kGroupSizes[] = {2, 3, 4, 8};
constexpr DataType kTypes[] = {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat16,
                               DataType::kFloat64, DataType::kInt32,    DataType::kInt64,
                               DataType::kUInt8};

enum class Algorithm { kRing, kDirect };
const char* Name(Algorithm algorithm) { return algorithm == Algorithm::kRing ? "ring" : "direct"; }

// Elements of one ring segment: counts above n * 2 * this span two or more
// segments per chunk.
size_t SegmentElements(DataType type) { return kRingSegmentBytes / DataTypeSize(type); }
// Not divisible by any group size tested, and 2+ segments per chunk.
size_t SeveralSegments(DataType type, int n) {
  return 2 * static_cast<size_t>(n) * SegmentElements(type) + 7;
}

bool IsFloat(DataType type) {
  return type == DataType::kFloat32 || type == DataType::kFloat64 || type == DataType::kBFloat16 ||
         type == DataType::kFloat16;
}

// The unit roundoff of a floating type (half its epsilon); 0 for integers.
double UnitRoundoff(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return std::ldexp(1.0, -24);
    case DataType::kFloat64:
      return std::ldexp(1.0, -53);
    case DataType::kBFloat16:
      return std::ldexp(1.0, -8);
    case DataType::kFloat16:
      return std::ldexp(1.0, -11);
    default:
      return 0;
  }
}

// One element of `type` holding `value` (exactly representable in it).
template <typename T>
void Put(T value, uint8_t* out) {
  std::memcpy(out, &value, sizeof(T));
}
template <typename T>
T Get(const uint8_t* in) {
  T value;
  std::memcpy(&value, in, sizeof(T));
  return value;
}

void Store(DataType type, double value, uint8_t* out) {
  switch (type) {
    case DataType::kFloat32:
      return Put(static_cast<float>(value), out);
    case DataType::kFloat64:
      return Put(value, out);
    case DataType::kBFloat16:
      return Put(FloatToBFloat16(static_cast<float>(value)), out);
    case DataType::kFloat16:
      return Put(FloatToHalf(static_cast<float>(value)), out);
    case DataType::kInt32:
      return Put(static_cast<int32_t>(value), out);
    case DataType::kInt64:
      return Put(static_cast<int64_t>(value), out);
    case DataType::kUInt8:
      return Put(static_cast<uint8_t>(value), out);
  }
}

double Load(DataType type, const uint8_t* in) {
  switch (type) {
    case DataType::kFloat32:
      return Get<float>(in);
    case DataType::kFloat64:
      return Get<double>(in);
    case DataType::kBFloat16:
      return BFloat16ToFloat(Get<uint16_t>(in));
    case DataType::kFloat16:
      return HalfToFloat(Get<uint16_t>(in));
    case DataType::kInt32:
      return Get<int32_t>(in);
    case DataType::kInt64:
      return static_cast<double>(Get<int64_t>(in));
    case DataType::kUInt8:
      return Get<uint8_t>(in);
  }
  return 0;
}

// Rank r's `count` elements: floats in (-1, 1), integers small enough that
// no sum of 8 overflows (uint8: at most 31 each).
std::vector<uint8_t> Input(DataType type, int rank, size_t count) {
  std::mt19937 random(static_cast<uint32_t>(1000 + rank));
  std::uniform_real_distribution<double> real(-1.0, 1.0);
  std::uniform_int_distribution<int> integer(type == DataType::kUInt8 ? 0 : -1000,
                                             type == DataType::kUInt8 ? 31 : 1000);
  const size_t element = DataTypeSize(type);
  std::vector<uint8_t> bytes(count * element);
  for (size_t i = 0; i < count; ++i) {
    Store(type, IsFloat(type) ? real(random) : integer(random), bytes.data() + i * element);
  }
  return bytes;
}

// Checks `result` (count elements) against the sum over `inputs` of
// elements [first, first + count), computed in double.
void ExpectSum(DataType type, const std::vector<std::vector<uint8_t>>& inputs, size_t first,
               size_t count, const uint8_t* result) {
  const size_t element = DataTypeSize(type);
  const double u = UnitRoundoff(type);
  const double n = static_cast<double>(inputs.size());
  int reported = 0;
  for (size_t i = 0; i < count && reported < 5; ++i) {
    double exact = 0, magnitude = 0;
    for (const std::vector<uint8_t>& input : inputs) {
      const double x = Load(type, input.data() + (first + i) * element);
      exact += x;
      magnitude += std::fabs(x);
    }
    const double got = Load(type, result + i * element);
    // The reference's own rounding (n additions in double) on top.
    const double tolerance = n * (u + std::ldexp(1.0, -53)) * magnitude;
    if (std::fabs(got - exact) > tolerance) {
      ADD_FAILURE() << "element " << first + i << ": " << got << ", exact " << exact
                    << ", tolerance " << tolerance;
      ++reported;
    }
  }
}

// Runs `body` on every rank of `fabric` with a call begun and returns each
// rank's status; a failed rank releases its requests, as a communicator does.
// A body whose buffers are its own must release them itself (Released).
std::vector<absl::Status> OnChannels(
    InMemoryFabric& fabric, absl::Duration timeout,
    const std::function<absl::Status(InMemoryChannel&, int)>& body) {
  return testing::RunOnRankThreads(fabric.size(), [&](int rank) {
    InMemoryChannel channel(&fabric, rank);
    channel.BeginCall(timeout);
    channel.NextSequence();
    absl::Status status = body(channel, rank);
    if (!status.ok()) channel.ReleaseAll();
    return status;
  });
}

// `status`, after releasing the channel's requests if it failed: a peer
// could still complete a receive into the caller's buffers, so a failed call
// releases before they go (as UcxCommunicator does).
absl::Status Released(InMemoryChannel& channel, absl::Status status) {
  if (!status.ok()) channel.ReleaseAll();
  return status;
}

void ExpectAllOk(const std::vector<absl::Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r) {
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  }
}

// Every rank's all-reduced buffer, from `inputs`.
std::vector<std::vector<uint8_t>> AllReduced(Algorithm algorithm, InMemoryFabric& fabric,
                                             DataType type, ReduceOp op,
                                             const std::vector<std::vector<uint8_t>>& inputs) {
  const size_t count = inputs[0].size() / DataTypeSize(type);
  std::vector<std::vector<uint8_t>> data = inputs;
  ExpectAllOk(OnChannels(fabric, kTimeout, [&](InMemoryChannel& channel, int rank) {
    ScratchBuffer scratch;
    void* buffer = data[static_cast<size_t>(rank)].data();
    return algorithm == Algorithm::kRing
               ? RingAllReduce(channel, buffer, count, type, op, scratch)
               : DirectAllReduce(channel, buffer, count, type, op, scratch);
  }));
  return data;
}

// Every rank's reduce-scattered block, from `inputs` (n blocks each).
std::vector<std::vector<uint8_t>> ReduceScattered(Algorithm algorithm, InMemoryFabric& fabric,
                                                  DataType type,
                                                  const std::vector<std::vector<uint8_t>>& inputs) {
  const size_t per_rank = inputs[0].size() / DataTypeSize(type) / inputs.size();
  std::vector<std::vector<uint8_t>> out(inputs.size(),
                                        std::vector<uint8_t>(per_rank * DataTypeSize(type)));
  ExpectAllOk(OnChannels(fabric, kTimeout, [&](InMemoryChannel& channel, int rank) {
    ScratchBuffer scratch, work;
    const void* in = inputs[static_cast<size_t>(rank)].data();
    void* o = out[static_cast<size_t>(rank)].data();
    return algorithm == Algorithm::kRing
               ? RingReduceScatter(channel, in, o, per_rank, type, ReduceOp::kSum, scratch, work)
               : DirectReduceScatter(channel, in, o, per_rank, type, ReduceOp::kSum, scratch);
  }));
  return out;
}

TEST(RingAlgorithmsTest, AllReduceSumsAsTheDoubleSumForEveryTypeGroupAndAlgorithm) {
  for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kDirect}) {
    for (int n : kGroupSizes) {
      for (DataType type : kTypes) {
        // 1001: one segment, not divisible by n; 3 < n for n > 3: empty chunks.
        for (size_t count : {size_t{1001}, size_t{3}}) {
          SCOPED_TRACE(
              absl::StrCat(Name(algorithm), " n=", n, " ", DataTypeName(type), " count=", count));
          std::vector<std::vector<uint8_t>> inputs;
          for (int r = 0; r < n; ++r) inputs.push_back(Input(type, r, count));
          InMemoryFabric fabric(n);
          const auto data = AllReduced(algorithm, fabric, type, ReduceOp::kSum, inputs);
          ExpectSum(type, inputs, 0, count, data[0].data());
          for (int r = 1; r < n; ++r) EXPECT_TRUE(data[r] == data[0]) << "rank " << r << " differs";
        }
      }
    }
  }
}

TEST(RingAlgorithmsTest, RingAllReduceOverSeveralSegmentsPerChunkSumsEveryElement) {
  for (DataType type :
       {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat64, DataType::kInt32}) {
    for (int n : kGroupSizes) {
      if (type != DataType::kFloat32 && n != 3) continue;  // the other types once
      const size_t count = SeveralSegments(type, n);
      SCOPED_TRACE(absl::StrCat("n=", n, " ", DataTypeName(type), " count=", count));
      std::vector<std::vector<uint8_t>> inputs;
      for (int r = 0; r < n; ++r) inputs.push_back(Input(type, r, count));
      InMemoryFabric fabric(n);
      const auto data = AllReduced(Algorithm::kRing, fabric, type, ReduceOp::kSum, inputs);
      ExpectSum(type, inputs, 0, count, data[0].data());
      for (int r = 1; r < n; ++r) EXPECT_TRUE(data[r] == data[0]) << "rank " << r << " differs";
    }
  }
}

TEST(RingAlgorithmsTest, AllReduceMaxIsTheExactMaximum) {
  for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kDirect}) {
    for (DataType type : {DataType::kFloat32, DataType::kInt64}) {
      const int n = 3;
      const size_t count = 1001;
      SCOPED_TRACE(absl::StrCat(Name(algorithm), " ", DataTypeName(type)));
      std::vector<std::vector<uint8_t>> inputs;
      for (int r = 0; r < n; ++r) inputs.push_back(Input(type, r, count));
      InMemoryFabric fabric(n);
      const auto data = AllReduced(algorithm, fabric, type, ReduceOp::kMax, inputs);
      const size_t element = DataTypeSize(type);
      for (size_t i = 0; i < count; ++i) {
        double max = Load(type, inputs[0].data() + i * element);
        for (int r = 1; r < n; ++r) max = std::max(max, Load(type, inputs[r].data() + i * element));
        for (int r = 0; r < n; ++r) ASSERT_EQ(Load(type, data[r].data() + i * element), max);
      }
    }
  }
}

TEST(RingAlgorithmsTest, ReduceScatterGivesEachRankTheSumOfItsBlock) {
  for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kDirect}) {
    for (int n : kGroupSizes) {
      for (DataType type : kTypes) {
        for (size_t per_rank : {size_t{333}, size_t{1}}) {
          SCOPED_TRACE(absl::StrCat(Name(algorithm), " n=", n, " ", DataTypeName(type),
                                    " per rank=", per_rank));
          std::vector<std::vector<uint8_t>> inputs;
          for (int r = 0; r < n; ++r) inputs.push_back(Input(type, r, per_rank * n));
          InMemoryFabric fabric(n);
          const auto out = ReduceScattered(algorithm, fabric, type, inputs);
          for (int r = 0; r < n; ++r)
            ExpectSum(type, inputs, r * per_rank, per_rank, out[r].data());
        }
      }
    }
  }
}

TEST(RingAlgorithmsTest, RingReduceScatterOverSeveralSegmentsPerBlockSumsEveryElement) {
  for (int n : kGroupSizes) {
    const DataType type = DataType::kFloat32;
    const size_t per_rank = 2 * SegmentElements(type) + 5;
    SCOPED_TRACE(absl::StrCat("n=", n));
    std::vector<std::vector<uint8_t>> inputs;
    for (int r = 0; r < n; ++r) inputs.push_back(Input(type, r, per_rank * n));
    InMemoryFabric fabric(n);
    const auto out = ReduceScattered(Algorithm::kRing, fabric, type, inputs);
    for (int r = 0; r < n; ++r) ExpectSum(type, inputs, r * per_rank, per_rank, out[r].data());
  }
}

TEST(RingAlgorithmsTest, AllGatherCopiesEveryRanksBlockToEveryRank) {
  for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kDirect}) {
    for (int n : kGroupSizes) {
      // One byte, an odd size, and (ring only) two segments and a bit.
      std::vector<size_t> sizes = {1, 1001};
      if (algorithm == Algorithm::kRing) sizes.push_back(2 * kRingSegmentBytes + 3);
      for (size_t bytes : sizes) {
        SCOPED_TRACE(absl::StrCat(Name(algorithm), " n=", n, " bytes per rank=", bytes));
        std::vector<uint8_t> expected;
        for (int r = 0; r < n; ++r) {
          const std::vector<uint8_t> block = Input(DataType::kUInt8, r, bytes);
          expected.insert(expected.end(), block.begin(), block.end());
        }
        std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>(expected.size(), 0xee));
        for (int r = 0; r < n; ++r) {
          std::memcpy(out[r].data() + r * bytes, expected.data() + r * bytes, bytes);
        }
        InMemoryFabric fabric(n);
        ExpectAllOk(OnChannels(fabric, kTimeout, [&](InMemoryChannel& channel, int rank) {
          void* o = out[static_cast<size_t>(rank)].data();
          return algorithm == Algorithm::kRing ? RingAllGather(channel, o, bytes)
                                               : DirectAllGather(channel, o, bytes);
        }));
        for (int r = 0; r < n; ++r) EXPECT_TRUE(out[r] == expected) << "rank " << r;
      }
    }
  }
}

// The additions the header documents, in T's own arithmetic: `first` is the
// ring position of the first term, each next position's value is added to
// the partial sum (its own value first; a + b == b + a bitwise).
template <typename T>
T RingOrderSum(const std::vector<const T*>& by_position, int first, size_t i) {
  const int n = static_cast<int>(by_position.size());
  T sum = by_position[static_cast<size_t>(first % n)][i];
  for (int k = 1; k < n; ++k) sum = by_position[static_cast<size_t>((first + k) % n)][i] + sum;
  return sum;
}

// Checks every bit of the results against the documented order, on the
// fabric's ring (`hosts` as InMemoryFabric).
template <typename T>
void ExpectDocumentedOrder(DataType type, int n, size_t count,
                           const std::vector<std::string>& hosts = {}) {
  std::vector<std::vector<uint8_t>> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(Input(type, r, count));
  InMemoryFabric fabric(n, hosts);
  std::vector<const T*> by_position, by_rank;
  for (int p = 0; p < n; ++p) {
    by_position.push_back(reinterpret_cast<const T*>(inputs[fabric.ring_order()[p]].data()));
  }
  for (int r = 0; r < n; ++r) by_rank.push_back(reinterpret_cast<const T*>(inputs[r].data()));
  {
    SCOPED_TRACE("ring all-reduce: chunk c from position c on");
    const auto data = AllReduced(Algorithm::kRing, fabric, type, ReduceOp::kSum, inputs);
    const size_t chunk = (count + n - 1) / n;
    for (int r = 0; r < n; ++r) {
      const T* got = reinterpret_cast<const T*>(data[r].data());
      for (size_t i = 0; i < count; ++i) {
        const T want = RingOrderSum(by_position, static_cast<int>(i / chunk), i);
        ASSERT_EQ(std::memcmp(&got[i], &want, sizeof(T)), 0) << "rank " << r << " element " << i;
      }
    }
  }
  {
    SCOPED_TRACE("direct all-reduce: rank order");
    const auto data = AllReduced(Algorithm::kDirect, fabric, type, ReduceOp::kSum, inputs);
    for (size_t i = 0; i < count; ++i) {
      T want = by_rank[0][i];
      for (int r = 1; r < n; ++r) want = want + by_rank[r][i];
      const T* got = reinterpret_cast<const T*>(data[0].data());
      ASSERT_EQ(std::memcmp(&got[i], &want, sizeof(T)), 0) << "element " << i;
    }
  }
  {
    SCOPED_TRACE("ring reduce-scatter: the block at position b from position b + 1 on");
    const size_t per_rank = count / n;
    std::vector<std::vector<uint8_t>> blocks = inputs;
    for (auto& b : blocks) b.resize(per_rank * n * sizeof(T));
    const auto out = ReduceScattered(Algorithm::kRing, fabric, type, blocks);
    for (int p = 0; p < n; ++p) {
      const int owner = fabric.ring_order()[p];
      const T* got = reinterpret_cast<const T*>(out[owner].data());
      for (size_t i = 0; i < per_rank; ++i) {
        const T want = RingOrderSum(by_position, p + 1, owner * per_rank + i);
        ASSERT_EQ(std::memcmp(&got[i], &want, sizeof(T)), 0)
            << "rank " << owner << " element " << i;
      }
    }
  }
}

TEST(RingAlgorithmsTest, SumsFollowTheDocumentedOrderBitForBit) {
  for (int n : kGroupSizes) {
    SCOPED_TRACE(absl::StrCat("n=", n));
    ExpectDocumentedOrder<float>(DataType::kFloat32, n, 1001);
    ExpectDocumentedOrder<double>(DataType::kFloat64, n, 1001);
  }
  SCOPED_TRACE("several segments per chunk");
  ExpectDocumentedOrder<float>(DataType::kFloat32, 3, SeveralSegments(DataType::kFloat32, 3));
}

TEST(RingAlgorithmsTest, AHostByHostRingSumsInItsOwnPositionOrder) {
  // Hosts b, a, b, a, c: the ring visits ranks 0 2 1 3 4.
  const std::vector<std::string> hosts = {"b", "a", "b", "a", "c"};
  InMemoryFabric probe(5, hosts);
  ASSERT_EQ(probe.ring_order(), (std::vector<int>{0, 2, 1, 3, 4}));
  ExpectDocumentedOrder<float>(DataType::kFloat32, 5, 1001, hosts);
  ExpectDocumentedOrder<float>(DataType::kFloat32, 5, SeveralSegments(DataType::kFloat32, 5),
                               hosts);
  // All-gather on that ring still puts each rank's block at its rank.
  const size_t bytes = kRingSegmentBytes + 9;
  std::vector<std::vector<uint8_t>> out(5, std::vector<uint8_t>(5 * bytes));
  for (int r = 0; r < 5; ++r) std::memset(out[r].data() + r * bytes, r + 1, bytes);
  ExpectAllOk(OnChannels(probe, kTimeout, [&](InMemoryChannel& channel, int rank) {
    return RingAllGather(channel, out[static_cast<size_t>(rank)].data(), bytes);
  }));
  for (int r = 0; r < 5; ++r) {
    for (int b = 0; b < 5; ++b) {
      EXPECT_EQ(out[r][b * bytes], b + 1) << "rank " << r << " block " << b;
      EXPECT_EQ(out[r][b * bytes + bytes - 1], b + 1) << "rank " << r << " block " << b;
    }
  }
}

TEST(RingAlgorithmsTest, TheSameSizeAndCountGiveTheSameBitsTwice) {
  for (int n : kGroupSizes) {
    for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kDirect}) {
      SCOPED_TRACE(absl::StrCat(Name(algorithm), " n=", n));
      std::vector<std::vector<uint8_t>> inputs;
      for (int r = 0; r < n; ++r) inputs.push_back(Input(DataType::kFloat32, r, 5003));
      InMemoryFabric first(n), second(n);
      const auto a = AllReduced(algorithm, first, DataType::kFloat32, ReduceOp::kSum, inputs);
      const auto b = AllReduced(algorithm, second, DataType::kFloat32, ReduceOp::kSum, inputs);
      EXPECT_TRUE(a == b);
    }
  }
}

TEST(RingAlgorithmsTest, BroadcastReachesEveryRankFromAnyRoot) {
  for (int n : kGroupSizes) {
    // Direct below kDirectMaxBytes, a chain of segments above.
    for (size_t bytes : {size_t{100}, 2 * kRingSegmentBytes + 1}) {
      for (int root : {0, n - 1}) {
        SCOPED_TRACE(absl::StrCat("n=", n, " bytes=", bytes, " root=", root));
        const std::vector<uint8_t> message = Input(DataType::kUInt8, 99, bytes);
        std::vector<std::vector<uint8_t>> data(n, std::vector<uint8_t>(bytes, 0));
        data[root] = message;
        InMemoryFabric fabric(n);
        ExpectAllOk(OnChannels(fabric, kTimeout, [&](InMemoryChannel& channel, int rank) {
          return Broadcast(channel, data[static_cast<size_t>(rank)].data(), bytes, root);
        }));
        for (int r = 0; r < n; ++r) EXPECT_TRUE(data[r] == message) << "rank " << r;
      }
    }
  }
}

TEST(RingAlgorithmsTest, BarrierCompletesOnEveryGroupSize) {
  for (int n : {1, 2, 3, 4, 8}) {
    InMemoryFabric fabric(n);
    ExpectAllOk(OnChannels(fabric, kTimeout, [](InMemoryChannel& channel, int) {
      return DisseminationBarrier(channel);
    }));
  }
}

// A ring all-reduce large enough to need many messages.
absl::Status LargeRingAllReduce(InMemoryChannel& channel) {
  std::vector<float> data(SeveralSegments(DataType::kFloat32, channel.size()), 1.0f);
  ScratchBuffer scratch;
  return Released(channel, RingAllReduce(channel, data.data(), data.size(), DataType::kFloat32,
                                         ReduceOp::kSum, scratch));
}

TEST(RingAlgorithmsTest, ADeadPeerEndsTheCallWithAnErrorNotAHang) {
  // Rank 3 died before the call: its ring neighbours see Unavailable naming
  // it at once; the rank beyond waits on a live peer that gave up and times
  // out. Nobody waits past the deadline.
  const absl::Duration timeout = absl::Seconds(1);
  for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kDirect}) {
    SCOPED_TRACE(Name(algorithm));
    InMemoryFabric fabric(4);
    fabric.Fail(3);
    const absl::Time start = absl::Now();
    const std::vector<absl::Status> statuses =
        OnChannels(fabric, timeout, [&](InMemoryChannel& channel, int rank) {
          if (rank == 3) return absl::UnavailableError("dead");
          if (algorithm == Algorithm::kRing) return LargeRingAllReduce(channel);
          std::vector<float> data(100, 1.0f);
          ScratchBuffer scratch;
          return Released(channel, DirectAllReduce(channel, data.data(), data.size(),
                                                   DataType::kFloat32, ReduceOp::kSum, scratch));
        });
    EXPECT_LT(absl::Now() - start, timeout + absl::Seconds(1));
    // Rank 0 receives from rank 3 in both algorithms, rank 2 sends to it.
    for (int r : {0, 2}) {
      EXPECT_TRUE(absl::IsUnavailable(statuses[r])) << "rank " << r << ": " << statuses[r];
      EXPECT_EQ(FailedPeer(statuses[r]).value_or(-1), 3) << "rank " << r << ": " << statuses[r];
    }
    EXPECT_TRUE(absl::IsUnavailable(statuses[1]) || absl::IsDeadlineExceeded(statuses[1]))
        << statuses[1];
  }
}

TEST(RingAlgorithmsTest, APeerDyingMidRingFailsEveryRank) {
  // Rank 1 dies as it posts its fifth send, with segments of the first
  // steps already through.
  InMemoryFabric fabric(4);
  fabric.FailAfterSends(1, 5);
  const absl::Duration timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  const std::vector<absl::Status> statuses = OnChannels(
      fabric, timeout, [](InMemoryChannel& channel, int) { return LargeRingAllReduce(channel); });
  EXPECT_LT(absl::Now() - start, timeout + absl::Seconds(1));
  EXPECT_TRUE(absl::IsUnavailable(statuses[1])) << statuses[1];
  EXPECT_TRUE(fabric.failed(1));
  // Its right neighbour waits on its data, its left one on its receives.
  for (int r : {0, 2}) {
    EXPECT_TRUE(absl::IsUnavailable(statuses[r])) << "rank " << r << ": " << statuses[r];
    EXPECT_EQ(FailedPeer(statuses[r]).value_or(-1), 1) << "rank " << r;
  }
  EXPECT_FALSE(statuses[3].ok());
}

TEST(RingAlgorithmsTest, APeerThatNeverArrivesEndsTheCallAtTheDeadline) {
  const absl::Duration timeout = absl::Milliseconds(300);
  InMemoryFabric fabric(3);
  const absl::Time start = absl::Now();
  // Rank 2 never calls (its thread returns at once, without a channel).
  const std::vector<absl::Status> statuses =
      testing::RunOnRankThreads(3, [&](int rank) -> absl::Status {
        if (rank == 2) return absl::OkStatus();
        InMemoryChannel channel(&fabric, rank);
        channel.BeginCall(timeout);
        channel.NextSequence();
        std::vector<double> data(10, 1.0);
        ScratchBuffer scratch;
        return Released(channel, DirectAllReduce(channel, data.data(), data.size(),
                                                 DataType::kFloat64, ReduceOp::kSum, scratch));
      });
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_GE(elapsed, timeout);
  EXPECT_LT(elapsed, timeout + absl::Seconds(2));
  for (int r : {0, 1}) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(statuses[r])) << "rank " << r << ": " << statuses[r];
  }
}

TEST(RingAlgorithmsTest, AnAbortEndsAWaitingCallWithAborted) {
  InMemoryFabric fabric(2);
  InMemoryChannel channel(&fabric, 0);
  channel.BeginCall(absl::Seconds(30));
  channel.NextSequence();
  absl::Status status;
  std::thread waiting([&] {
    ScratchBuffer scratch;
    std::vector<float> data(1000, 1.0f);
    status = Released(channel, RingAllReduce(channel, data.data(), data.size(), DataType::kFloat32,
                                             ReduceOp::kSum, scratch));
  });
  // Whether the abort lands before the call or during its wait, the call
  // ends Aborted, with the reason, long before its deadline.
  channel.Abort(absl::CancelledError("stop the test"));
  waiting.join();
  EXPECT_TRUE(absl::IsAborted(status)) << status;
  EXPECT_NE(status.message().find("stop the test"), absl::string_view::npos) << status;
}

TEST(RingAlgorithmsTest, AMessageOfAnotherLengthFailsTheReceiveWithInvalidArgument) {
  InMemoryFabric fabric(2);
  const std::vector<absl::Status> statuses =
      OnChannels(fabric, kTimeout, [](InMemoryChannel& channel, int rank) -> absl::Status {
        uint8_t buffer[8] = {};
        const uint64_t tag = channel.CollectiveTag(0, 0);
        if (rank == 0) {
          absl::StatusOr<Channel::Handle> send = channel.PostSend(1, tag, buffer, 8);
          if (!send.ok()) return send.status();
          return channel.Wait(&*send);
        }
        absl::StatusOr<Channel::Handle> recv = channel.PostRecv(0, tag, buffer, 4);
        if (!recv.ok()) return recv.status();
        return channel.Wait(&*recv);
      });
  EXPECT_TRUE(statuses[0].ok()) << statuses[0];
  EXPECT_TRUE(absl::IsInvalidArgument(statuses[1])) << statuses[1];
}

}  // namespace
}  // namespace cohort::comm

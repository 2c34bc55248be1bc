#include "worker/comm/shm_collectives.h"

#include <dirent.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/comm/local_peer.h"

// The shared-memory algorithm with ranks as threads of this process (each
// maps every segment like a separate process would). Cross-process runs,
// kill -9 and the choice of this path are in
// tests/integration/ucx_collectives_test.cc (transport "default").

namespace cohort::comm {
namespace {

std::atomic<int> next_group{0};

std::vector<std::string> SegmentNames(int size) {
  const int group = next_group.fetch_add(1);
  std::vector<std::string> names;
  for (int r = 0; r < size; ++r) {
    names.push_back(ShmSegment::Name(SelfIdentity(), absl::StrCat("unit", group, "-", r)));
  }
  return names;
}

std::vector<std::unique_ptr<ShmCollectives>> MakeGroup(int size, size_t piece_bytes) {
  std::vector<std::string> names = SegmentNames(size);
  std::vector<std::unique_ptr<ShmCollectives>> group;
  for (int r = 0; r < size; ++r) {
    ShmCollectivesOptions options;
    options.rank = r;
    options.size = size;
    options.segment_names = names;
    options.piece_bytes = piece_bytes;
    absl::StatusOr<std::unique_ptr<ShmCollectives>> c = ShmCollectives::Create(options);
    EXPECT_TRUE(c.ok()) << c.status();
    group.push_back(std::move(*c));
  }
  return group;
}

absl::Status NoError(int) { return absl::OkStatus(); }

// Runs fn(rank) on one thread per rank and returns each rank's status.
template <typename Fn>
std::vector<absl::Status> OnEveryRank(int size, Fn fn) {
  std::vector<absl::Status> statuses(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { statuses[r] = fn(r); });
  for (std::thread& t : threads) t.join();
  return statuses;
}

int CohortSegmentsInDevShm() {
  int n = 0;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  const std::string prefix = absl::StrCat("cohort-", SelfIdentity().pid, "-");
  while (const dirent* e = readdir(dir)) {
    if (std::string(e->d_name).rfind(prefix, 0) == 0) ++n;
  }
  closedir(dir);
  return n;
}

class ShmAllReduceTest : public ::testing::TestWithParam<std::tuple<int, size_t>> {};

// Sizes around the piece and block boundaries; pieces of 256 bytes (64
// floats) so that many rounds (and both staging slots) are exercised.
TEST_P(ShmAllReduceTest, MatchesDoubleReferenceAndAgreesBitwise) {
  const auto [size, count] = GetParam();
  auto group = MakeGroup(size, 256);
  std::vector<std::vector<float>> data(size, std::vector<float>(count));
  std::mt19937 rng(static_cast<uint32_t>(count * 31 + size));
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<double> reference(count, 0.0), magnitude(count, 0.0);
  for (int r = 0; r < size; ++r) {
    for (size_t i = 0; i < count; ++i) {
      data[r][i] = uniform(rng);
      reference[i] += data[r][i];
      magnitude[i] += std::fabs(data[r][i]);
    }
  }
  // Two calls in a row: the round counters carry across calls.
  for (int call = 0; call < 2; ++call) {
    if (call == 1) {
      for (int r = 0; r < size; ++r) {
        for (size_t i = 0; i < count; ++i) data[r][i] = static_cast<float>(reference[i]) / size;
      }
    }
    std::vector<absl::Status> statuses = OnEveryRank(size, [&](int r) {
      return group[r]->AllReduce(data[r].data(), count, DataType::kFloat32, ReduceOp::kSum,
                                 NoError);
    });
    for (int r = 0; r < size; ++r) ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    for (int r = 1; r < size; ++r) {
      ASSERT_EQ(std::memcmp(data[0].data(), data[r].data(), count * sizeof(float)), 0)
          << "rank " << r << " differs from rank 0";
    }
    if (call == 0) {
      const double eps = std::numeric_limits<float>::epsilon();
      for (size_t i = 0; i < count; ++i) {
        ASSERT_NEAR(data[0][i], reference[i], size * eps * magnitude[i] + 1e-30) << "element " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, ShmAllReduceTest,
                         ::testing::Combine(::testing::Values(2, 3, 4),
                                            ::testing::Values(size_t{0}, size_t{1}, size_t{7},
                                                              size_t{1023}, size_t{64 * 5 + 3},
                                                              size_t{100003})));

TEST(ShmCollectivesTest, IntegerReduceScatterAndAllGatherAreExact) {
  constexpr int kSize = 3;
  constexpr size_t kPerRank = 1000;
  auto group = MakeGroup(kSize, 512);
  std::vector<std::vector<int32_t>> input(kSize, std::vector<int32_t>(kSize * kPerRank));
  for (int r = 0; r < kSize; ++r) {
    for (size_t i = 0; i < input[r].size(); ++i) input[r][i] = static_cast<int32_t>(i * 7 + r);
  }
  std::vector<std::vector<int32_t>> scattered(kSize, std::vector<int32_t>(kPerRank));
  std::vector<absl::Status> statuses = OnEveryRank(kSize, [&](int r) {
    return group[r]->ReduceScatter(input[r].data(), scattered[r].data(), kPerRank,
                                   DataType::kInt32, ReduceOp::kSum, NoError);
  });
  for (const absl::Status& s : statuses) ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < kSize; ++r) {
    for (size_t i = 0; i < kPerRank; ++i) {
      const size_t global = r * kPerRank + i;
      ASSERT_EQ(scattered[r][i], static_cast<int32_t>(3 * global * 7 + 0 + 1 + 2));
    }
  }
  std::vector<std::vector<int32_t>> gathered(kSize, std::vector<int32_t>(kSize * kPerRank, -1));
  for (int r = 0; r < kSize; ++r) {
    std::memcpy(gathered[r].data() + r * kPerRank, scattered[r].data(), kPerRank * 4);
  }
  statuses = OnEveryRank(kSize, [&](int r) {
    return group[r]->AllGather(gathered[r].data(), kPerRank, DataType::kInt32, NoError);
  });
  for (const absl::Status& s : statuses) ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < kSize; ++r) {
    for (size_t i = 0; i < kSize * kPerRank; ++i) {
      ASSERT_EQ(gathered[r][i], static_cast<int32_t>(3 * i * 7 + 3)) << "rank " << r << " i " << i;
    }
  }
}

// The caller's order of additions, bit for bit: values of mixed
// magnitudes so that another association would show; blocks uneven (the
// count is not a multiple of the block) and pieces small (many rounds).
TEST(ShmCollectivesTest, OrderedReduceScatterAddsInTheGivenOrder) {
  constexpr int kSize = 5;
  constexpr size_t kBlock = 301;
  constexpr size_t kCount = kBlock * kSize - 17;
  // ((r0 + r1) + (r2 + r3)) + r4: the tree over 5 leaves.
  const std::vector<std::pair<int, int>> merges = {{0, 1}, {2, 3}, {0, 2}, {0, 4}};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<std::vector<float>> inputs(kSize, std::vector<float>(kCount));
  for (auto& input : inputs) {
    for (float& x : input) x = std::ldexp(unit(rng), exponent(rng));
  }
  std::vector<float> expected(kCount), sequential(kCount);
  for (size_t e = 0; e < kCount; ++e) {
    std::vector<float> v;
    for (int q = 0; q < kSize; ++q) v.push_back(inputs[q][e]);
    for (const auto& [into, from] : merges) v[into] += v[from];
    expected[e] = v[0];
    sequential[e] = (((inputs[0][e] + inputs[1][e]) + inputs[2][e]) + inputs[3][e]) + inputs[4][e];
  }
  ASSERT_NE(std::memcmp(expected.data(), sequential.data(), kCount * sizeof(float)), 0)
      << "the values do not tell the orders apart";
  auto group = MakeGroup(kSize, 256);
  std::vector<std::vector<float>> outputs(kSize, std::vector<float>(kBlock, NAN));
  const std::vector<absl::Status> statuses = OnEveryRank(kSize, [&](int r) {
    return group[r]->ReduceScatterOrdered(inputs[r].data(), kCount, kBlock, outputs[r].data(),
                                          merges, NoError);
  });
  for (int r = 0; r < kSize; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    const size_t begin = kBlock * r;
    const size_t length = std::min(kBlock, kCount - begin);
    EXPECT_EQ(std::memcmp(outputs[r].data(), expected.data() + begin, length * sizeof(float)), 0)
        << "rank " << r;
  }
}

TEST(ShmCollectivesTest, MaxOfBFloat16) {
  constexpr int kSize = 2;
  auto group = MakeGroup(kSize, 128);
  // bf16 bit patterns of small integers: 1.0 = 0x3f80, 2.0 = 0x4000, 3.0 = 0x4040.
  std::vector<std::vector<uint16_t>> data = {{0x3f80, 0x4040, 0x4000}, {0x4000, 0x3f80, 0x4040}};
  std::vector<absl::Status> statuses = OnEveryRank(kSize, [&](int r) {
    return group[r]->AllReduce(data[r].data(), 3, DataType::kBFloat16, ReduceOp::kMax, NoError);
  });
  for (const absl::Status& s : statuses) ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < kSize; ++r) {
    EXPECT_EQ(data[r], (std::vector<uint16_t>{0x4000, 0x4040, 0x4040}));
  }
}

TEST(ShmCollectivesTest, WaitingRankReturnsTheCheckError) {
  // Rank 1 never joins: rank 0 waits until its check fails.
  auto group = MakeGroup(2, 256);
  std::vector<float> data(4096, 1.0f);
  std::atomic<int> checks_on_peer_1{0};
  std::atomic<bool> aborted{false};
  std::thread aborter([&] {
    while (checks_on_peer_1.load() < 3) std::this_thread::yield();
    aborted = true;
  });
  absl::Status status = group[0]->AllReduce(
      data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum, [&](int peer) -> absl::Status {
        if (peer == 1) ++checks_on_peer_1;
        return aborted ? absl::AbortedError("test abort") : absl::OkStatus();
      });
  aborter.join();
  EXPECT_TRUE(absl::IsAborted(status)) << status;
}

TEST(ShmCollectivesTest, SegmentNamesAreUnlinkedOnceEveryPeerMapsThem) {
  const int before = CohortSegmentsInDevShm();
  auto group = MakeGroup(3, 256);
  EXPECT_EQ(CohortSegmentsInDevShm(), before + 3);
  std::vector<std::vector<float>> data(3, std::vector<float>(100, 1.0f));
  std::vector<absl::Status> statuses = OnEveryRank(3, [&](int r) {
    return group[r]->AllReduce(data[r].data(), 100, DataType::kFloat32, ReduceOp::kSum, NoError);
  });
  for (const absl::Status& s : statuses) ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(data[2][99], 3.0f);
  EXPECT_EQ(CohortSegmentsInDevShm(), before);
}

TEST(ShmCollectivesTest, RejectsBadOptions) {
  ShmCollectivesOptions options;
  options.rank = 2;
  options.size = 2;
  options.segment_names = {"a", "b"};
  EXPECT_TRUE(absl::IsInvalidArgument(ShmCollectives::Create(options).status()));
}

}  // namespace
}  // namespace cohort::comm

namespace cohort::comm {
namespace {

// A communicator of an older generation that never ran a collective still
// owns a linked segment; the next generation's segment of the same name
// replaces it. Destroying the old one must not unlink the new name, or the
// new generation's peers can never open it (seen in the chaos run as every
// generation timing out in its first shared-memory collective).
TEST(ShmSegmentTest, AReplacedSegmentDoesNotUnlinkItsSuccessor) {
  const std::string name = ShmSegment::Name(SelfIdentity(), "unit-replaced");
  absl::StatusOr<std::unique_ptr<ShmSegment>> older = ShmSegment::Create(name, 4096);
  ASSERT_TRUE(older.ok()) << older.status();
  absl::StatusOr<std::unique_ptr<ShmSegment>> newer = ShmSegment::Create(name, 8192);
  ASSERT_TRUE(newer.ok()) << newer.status();
  older->reset();
  absl::StatusOr<std::unique_ptr<ShmSegment>> opened = ShmSegment::Open(name, 8192);
  ASSERT_TRUE(opened.ok()) << opened.status();
  (*opened)->data()[0] = 42;
  EXPECT_EQ((*newer)->data()[0], 42);
  newer->reset();  // the owner of the live name unlinks it
  EXPECT_EQ(ShmSegment::Open(name, 8192).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace cohort::comm

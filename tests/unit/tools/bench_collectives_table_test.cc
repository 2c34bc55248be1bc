#include "tools/bench/collectives_table.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort::bench {
namespace {

using ::testing::HasSubstr;

TEST(CollectivesTableTest, BusBandwidthFollowsNcclTests) {
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(Collective::kAllReduce, 2), 1.0);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(Collective::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(Collective::kReduceScatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(Collective::kAllGather, 2), 0.5);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(Collective::kAllReduce, 1), 0.0);
  // 1 GB in 0.5 s over 4 ranks: algbw 2 GB/s, busbw 3 GB/s.
  BenchRow row = MakeRow(Collective::kAllReduce, 4, 1'000'000'000, 0.5);
  EXPECT_DOUBLE_EQ(row.algbw_gbs, 2.0);
  EXPECT_DOUBLE_EQ(row.busbw_gbs, 3.0);
}

TEST(CollectivesTableTest, SizesAndIterations) {
  EXPECT_EQ(PowerOfTwoSizes(1024, 8192), (std::vector<size_t>{1024, 2048, 4096, 8192}));
  EXPECT_EQ(PowerOfTwoSizes(8, 8), (std::vector<size_t>{8}));
  EXPECT_EQ(IterationsFor(0.01, 0.25), 25);
  EXPECT_EQ(IterationsFor(10, 0.25), 5);
  EXPECT_EQ(IterationsFor(1e-9, 0.25), 1000);
}

TEST(CollectivesTableTest, CsvRoundTripAndComparison) {
  std::vector<BenchRow> ours = {MakeRow(Collective::kAllReduce, 2, 8, 4e-6),
                                MakeRow(Collective::kAllReduce, 2, 4 << 20, 1e-3)};
  std::vector<BenchRow> theirs = {MakeRow(Collective::kAllReduce, 2, 8, 2e-6),
                                  MakeRow(Collective::kAllReduce, 2, 4 << 20, 2e-3)};
  auto parsed = FromCsv(ToCsv(ours));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[1].bytes, size_t{4} << 20);
  EXPECT_DOUBLE_EQ((*parsed)[1].seconds, 1e-3);
  const std::string table = FormatComparison("cohort", ours, "openmpi", theirs);
  EXPECT_THAT(table, HasSubstr("4 MiB"));
  EXPECT_THAT(table, HasSubstr("2.00"));  // our busbw is twice theirs at 4 MiB
  EXPECT_THAT(table, HasSubstr("0.50"));  // and our time half of theirs
  EXPECT_THAT(FormatTable("t", ours), HasSubstr("8 B"));
  EXPECT_EQ(FromCsv("bytes,seconds,algbw_gbs,busbw_gbs\n12,x,1,1\n").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cohort::bench

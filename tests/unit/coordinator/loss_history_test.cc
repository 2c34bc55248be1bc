// The coordinator's loss curve: points in step order, replaced from a step
// that is trained again, thinned to a bound keeping the first and newest.

#include "coordinator/jobs/loss_history.h"

#include "gtest/gtest.h"

namespace cohort::coordinator {
namespace {

std::vector<int64_t> Steps(const LossSeries& series) {
  std::vector<int64_t> steps;
  for (const v1::LossPoint& p : series) steps.push_back(p.step());
  return steps;
}

TEST(LossHistoryTest, PointsFromAnEarlierStepReplaceTheRunThatWasRedone) {
  LossSeries series;
  for (int s = 1; s <= 5; ++s) AddLossPoint(&series, s, 10.0 - s);
  AddLossPoint(&series, 3, 7.5);  // a recovery resumed at step 2 and trained step 3 again
  EXPECT_EQ(Steps(series), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(series.Get(2).loss(), 7.5);
}

TEST(LossHistoryTest, AFullSeriesIsThinnedKeepingTheFirstAndNewest) {
  LossSeries series;
  for (int s = 1; s <= 11; ++s) AddLossPoint(&series, s, s, /*max_points=*/10);
  EXPECT_LE(series.size(), 10);
  EXPECT_EQ(series.Get(0).step(), 1);
  EXPECT_EQ(series.Get(series.size() - 1).step(), 11);
  // Many more points stay bounded and ordered.
  for (int s = 12; s <= 5000; ++s) AddLossPoint(&series, s, s, 10);
  EXPECT_LE(series.size(), 10);
  EXPECT_GE(series.size(), 5);
  EXPECT_EQ(series.Get(0).step(), 1);
  EXPECT_EQ(series.Get(series.size() - 1).step(), 5000);
  for (int i = 1; i < series.size(); ++i) EXPECT_LT(series.Get(i - 1).step(), series.Get(i).step());
}

TEST(LossHistoryTest, RepeatedReportsAddOnlyNewerValidations) {
  LossSeries series;
  LossSeries reported;
  for (int s : {10, 20}) {
    v1::LossPoint* p = reported.Add();
    p->set_step(s);
    p->set_loss(s / 10.0);
  }
  EXPECT_TRUE(MergeNewerPoints(&series, reported));
  EXPECT_FALSE(MergeNewerPoints(&series, reported)) << "the same report again adds nothing";
  v1::LossPoint* p = reported.Add();
  p->set_step(30);
  p->set_loss(3);
  EXPECT_TRUE(MergeNewerPoints(&series, reported));
  EXPECT_EQ(Steps(series), (std::vector<int64_t>{10, 20, 30}));
}

}  // namespace
}  // namespace cohort::coordinator

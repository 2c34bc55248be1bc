#include "coordinator/jobs/loss_history.h"

namespace cohort::coordinator {
namespace {

// Keeps the first and the last point and every other one between them.
void Thin(LossSeries* series) {
  const int n = series->size();
  int kept = 1;
  for (int i = 1; i < n - 1; ++i) {
    if (i % 2 == 0) series->SwapElements(kept++, i);
  }
  series->SwapElements(kept++, n - 1);
  series->DeleteSubrange(kept, n - kept);
}

}  // namespace

void AddLossPoint(LossSeries* series, int64_t step, double loss, int max_points) {
  int keep = series->size();
  while (keep > 0 && series->Get(keep - 1).step() >= step) --keep;
  if (keep < series->size()) series->DeleteSubrange(keep, series->size() - keep);
  v1::LossPoint* point = series->Add();
  point->set_step(step);
  point->set_loss(loss);
  if (series->size() > max_points && max_points >= 2) Thin(series);
}

bool MergeNewerPoints(LossSeries* series, const LossSeries& reported, int max_points) {
  bool added = false;
  for (const v1::LossPoint& point : reported) {
    if (!series->empty() && point.step() <= series->Get(series->size() - 1).step()) continue;
    AddLossPoint(series, point.step(), point.loss(), max_points);
    added = true;
  }
  return added;
}

}  // namespace cohort::coordinator

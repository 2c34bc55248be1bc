#include "worker/train/device_optimizer.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/compute/adamw_math.h"

namespace cohort::train {

using compute::DType;

absl::StatusOr<std::unique_ptr<DeviceOptimizer>> DeviceOptimizer::Create(
    compute::Backend* backend, const GradNormPlan& plan, const model::ParameterTable& table,
    size_t begin, size_t end, const DeviceOptimizerOptions& options) {
  if (begin > end || end > table.num_params()) {
    return absl::InvalidArgumentError(absl::StrCat("DeviceOptimizer range [", begin, ", ", end,
                                                   ") outside ", table.num_params(),
                                                   " parameters"));
  }
  const std::vector<GradNormPlan::Piece> pieces = plan.Pieces(begin, end);
  std::vector<int64_t> bounds;
  bounds.reserve(2 * pieces.size());
  // A range holds each norm slot in at most one piece (only a range's two
  // ends cut pieces, and those are different slots), so adding the pieces
  // straight into the total is the host's slots-then-total order.
  for (const GradNormPlan::Piece& piece : pieces) {
    bounds.push_back(static_cast<int64_t>(piece.begin));
    bounds.push_back(static_cast<int64_t>(piece.end));
  }
  std::unique_ptr<DeviceOptimizer> optimizer(
      new DeviceOptimizer(backend, begin, end, options, WeightDecayRanges(table, begin, end)));
  ASSIGN_OR_RETURN(optimizer->pieces_, backend->Allocate(DType::kInt64, bounds.size()));
  ASSIGN_OR_RETURN(optimizer->sums_, backend->Allocate(DType::kFloat64, pieces.size()));
  ASSIGN_OR_RETURN(optimizer->scalars_, backend->Allocate(DType::kFloat64, 2));
  ASSIGN_OR_RETURN(optimizer->scalars_host_, backend->AllocateHost(DType::kFloat64, 2));
  ASSIGN_OR_RETURN(optimizer->m_, backend->Allocate(DType::kFloat32, end - begin));
  ASSIGN_OR_RETURN(optimizer->v_, backend->Allocate(DType::kFloat32, end - begin));
  if (!bounds.empty()) backend->CopyFromHost(optimizer->pieces_.span(), bounds.data());
  return optimizer;
}

DeviceOptimizer::DeviceOptimizer(compute::Backend* backend, size_t begin, size_t end,
                                 const DeviceOptimizerOptions& options,
                                 std::vector<DecayRange> ranges)
    : backend_(backend), begin_(begin), end_(end), options_(options), ranges_(std::move(ranges)) {}

void DeviceOptimizer::ResetMoments() {
  backend_->Zero(m_.span());
  backend_->Zero(v_.span());
}

absl::Status DeviceOptimizer::Enqueue(compute::TensorSpan params, compute::TensorSpan grads,
                                      double lr, int64_t t, compute::TensorSpan losses) {
  if (t < 1) return absl::InvalidArgumentError(absl::StrCat("AdamW step must be >= 1, got ", t));
  if (!std::isfinite(lr) || lr < 0.0) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW lr must be finite and >= 0, got ", lr));
  }
  backend_->SumOfSquaresPieces(sums_.span(), grads, pieces_.span());
  backend_->FinishGradNorm(scalars_.span(), sums_.span(), options_.grad_clip);
  if (!losses.empty()) backend_->SkipUpdateUnlessFinite(scalars_.span(), losses);
  const compute::AdamWScalars scalars =
      compute::AdamWScalarsFor(options_.adamw.beta1, options_.adamw.beta2, options_.adamw.eps,
                               options_.adamw.weight_decay, lr, t);
  for (const DecayRange& range : ranges_) {
    backend_->ClipAdamW(params, m_.span(), v_.span(), grads, scalars_.span(), range.begin,
                        range.end, begin_, range.decay, scalars);
  }
  backend_->CopyToHostAsync(scalars_host_.data(), scalars_.span());
  return absl::OkStatus();
}

absl::StatusOr<double> DeviceOptimizer::Norm() {
  RETURN_IF_ERROR(backend_->Synchronize());
  return static_cast<const double*>(scalars_host_.data())[0];
}

}  // namespace cohort::train

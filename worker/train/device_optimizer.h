#pragma once
// DeviceOptimizer: the end of a step for a rank whose training state stays in
// backend memory (a GPU's): the gradient norm, clipping and AdamW run as
// backend ops (backend.h, "The optimizer step on backend memory") on the
// model's arenas, with AdamW's moments in backend memory too. Nothing of the
// state crosses to the host; the host reads two numbers per step (the norm
// and the clip factor), after the update is enqueued.
//
// The norm is GradNormPlan's: the same pieces, each summed in double, added
// in order, so on the CPU backend (and the guarded test backend) every bit
// equals the host optimizer's (StepRunner's host path); a GPU sums each piece
// in a fixed tree of its own (deterministic run to run).
//
// The norm it computes is over its own range: the global norm where one rank
// holds the whole model (no data, tensor or pipeline split), which is where
// StepRunner uses it. With several ranks the norm's slots are reduced over
// the groups first, which the NCCL path brings (issue 46;
// docs/architecture.md, "GPU training").
//
// Thread-compatible, like the backend it drives.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/compute/backend.h"
#include "worker/model/parameter_table.h"
#include "worker/train/adamw.h"
#include "worker/train/grad_norm_plan.h"

namespace cohort::train {

struct DeviceOptimizerOptions {
  AdamWOptions adamw;
  // clip_grad_norm_'s max_norm; <= 0: no clipping.
  double grad_clip = 0.0;
};

class DeviceOptimizer {
 public:
  // Moments for [begin, end) of `table`'s arena in `backend` memory (not
  // zeroed: ResetMoments or a restore fills them). InvalidArgument for a
  // range outside the table; ResourceExhausted when the backend lacks the
  // memory.
  static absl::StatusOr<std::unique_ptr<DeviceOptimizer>> Create(
      compute::Backend* backend, const GradNormPlan& plan, const model::ParameterTable& table,
      size_t begin, size_t end, const DeviceOptimizerOptions& options);

  size_t begin() const { return begin_; }
  size_t end() const { return end_; }
  compute::TensorSpan m() const { return m_.span(); }
  compute::TensorSpan v() const { return v_.span(); }

  // Zero moments (a fresh start).
  void ResetMoments();
  // Enqueues the norm of `grads` over the range, the clip factor, and AdamW
  // update number `t` (>= 1) with learning rate `lr` onto `params`, the
  // gradient scaled by the clip factor on the fly (`grads` is left as it
  // was), then the norm's asynchronous copy to the host. A non-finite norm
  // leaves params and moments unchanged, and so does a non-finite value in
  // `losses` (float64 in backend memory, the step's loss sums; may be
  // empty), the norm then reading NaN. `params` and `grads` are the model's
  // arenas (backend memory, table order). InvalidArgument for t < 1 or a
  // negative or non-finite lr.
  absl::Status Enqueue(compute::TensorSpan params, compute::TensorSpan grads, double lr, int64_t t,
                       compute::TensorSpan losses = {});
  // The norm of the last Enqueue (before clipping). Waits for the backend
  // (Synchronize: the step's one wait, which also completes the caller's
  // other asynchronous copies), so its errors since the last wait surface
  // here.
  absl::StatusOr<double> Norm();

 private:
  DeviceOptimizer(compute::Backend* backend, size_t begin, size_t end,
                  const DeviceOptimizerOptions& options, std::vector<DecayRange> ranges);

  compute::Backend* const backend_;
  const size_t begin_;
  const size_t end_;
  const DeviceOptimizerOptions options_;
  const std::vector<DecayRange> ranges_;
  compute::Buffer pieces_;   // int64 (begin, end) per piece, uploaded once
  compute::Buffer sums_;     // float64, one per piece
  compute::Buffer scalars_;  // float64: the norm, the clip factor
  compute::Buffer scalars_host_;  // their host copy (AllocateHost), valid after a wait
  compute::Buffer m_, v_;    // fp32 moments of [begin, end)
};

}  // namespace cohort::train

#pragma once
// The update the single-process step benchmarks run after a backward, in
// host memory as a training session does today: clip to the global norm
// 1.0, then AdamW (lr 6e-4, weight decay 0.1, worker/train's defaults
// otherwise) over every parameter. cohort-bench-train and cohort-bench-gpu
// share it so that their optimizer times measure the same work, the work
// tools/bench/torch_train_bench.py does too.

#include <cmath>
#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "worker/model/gpt_model.h"
#include "worker/train/adamw.h"
#include "worker/train/grad_norm.h"

namespace cohort::bench {

class HostOptimizer {
 public:
  static constexpr double kLearningRate = 6e-4;
  static constexpr double kGradClip = 1.0;

  // `threads`: OpenMP threads of the norm, the clip and AdamW (0 = all cores).
  HostOptimizer(const model::GptModel& gpt, int threads)
      : n_(gpt.num_params()),
        threads_(threads),
        ranges_(train::WeightDecayRanges(gpt.table(), 0, n_)),
        adamw_{.weight_decay = 0.1, .num_threads = threads},
        m_(n_, 0.0f),
        v_(n_, 0.0f) {}

  // Clips `gpt`'s gradients and applies AdamW update number `update` (from 1)
  // to its weights (through params(): a staged model uploads them before its
  // next forward).
  absl::Status Step(model::GptModel& gpt, int update) {
    const double norm = std::sqrt(train::SumOfSquares(gpt.grads(), n_, threads_));
    train::ScaleInPlace(gpt.grads(), n_, static_cast<float>(train::ClipScale(norm, kGradClip)),
                        threads_);
    const train::AdamWSlice slice{gpt.params(), gpt.grads(), m_.data(), v_.data(), 0, n_};
    return train::AdamWUpdate(adamw_, slice, ranges_, kLearningRate, update);
  }

 private:
  const size_t n_;
  const int threads_;
  const std::vector<train::DecayRange> ranges_;
  const train::AdamWOptions adamw_;
  std::vector<float> m_, v_;  // AdamW's moments
};

}  // namespace cohort::bench

#pragma once
// AdamW (decoupled weight decay, Loshchilov & Hutter) over a flat range of
// the ParameterTable layout, with the arithmetic of torch.optim.AdamW
// (PyTorch 1.13, single-tensor path), element by element in fp32:
//
//   if decay:  p = p * (1 - lr * weight_decay)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   p = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// where t >= 1 is the number of this update (1 for the first) and the
// scalar factors are computed in double. Weight decay applies only where the
// ParameterTable says so (matrices and embeddings; never biases or
// LayerNorm parameters); WeightDecayRanges turns that into ranges for any
// flat slice. Updating a slice gives bitwise the same values as updating
// the whole arena, so a ZeRO-1 shard updates only the slice it owns.
//
// Thread-safety: reentrant; concurrent calls must not share buffers.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/model/parameter_table.h"

namespace cohort::train {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int num_threads = 0;  // OpenMP threads; 0 = all cores. Results do not depend on it.
};

// Flat elements [begin, end) of the layout and whether AdamW decays them.
struct DecayRange {
  size_t begin = 0;
  size_t end = 0;
  bool decay = false;

  friend bool operator==(const DecayRange&, const DecayRange&) = default;
};

// The decay ranges covering [begin, end) exactly, in order, adjacent tensors
// with the same flag merged. Requires begin <= end <= table.num_params().
std::vector<DecayRange> WeightDecayRanges(const model::ParameterTable& table, size_t begin,
                                          size_t end);

// One slice of the four arenas: each pointer addresses flat element `begin`
// (so for a ZeRO-1 shard, m and v may be shard-sized buffers).
struct AdamWSlice {
  float* params = nullptr;
  const float* grads = nullptr;
  float* m = nullptr;  // first moment, zero before the first update
  float* v = nullptr;  // second moment, zero before the first update
  size_t begin = 0;
  size_t count = 0;
};

// Applies update number `step` (1-based) with learning rate `lr` to the
// slice. `ranges` must tile [slice.begin, slice.begin + slice.count) in
// order (as WeightDecayRanges returns). InvalidArgument (nothing updated)
// for step < 1, a negative or non-finite lr, null buffers, or ranges that do
// not tile the slice.
absl::Status AdamWUpdate(const AdamWOptions& options, const AdamWSlice& slice,
                         absl::Span<const DecayRange> ranges, double lr, int64_t step);

}  // namespace cohort::train

#pragma once
// GradNormPlan: the global gradient L2 norm over UNIQUE parameters in any
// (dp, tp, pp) layout, with the same bits as a single process wherever the
// layout allows it.
//
// Slots. The unsharded model's gradient is described as an ordered list of
// "pieces", each summed serially in double into its own slot:
//   for each tensor (table order), each layer (per-layer tensors), and each
//   tensor-parallel shard (tensors tp splits, when tp > 1): that segment,
//   cut at every multiple of kNormChunk of its offset in the unsharded flat
//   arena (segment-relative offsets for tp-split segments, which have no
//   unsharded contiguous range).
// The norm is sqrt(sum of the slots in order). Every rank knows the whole
// list; it fills the slots of the pieces it owns and leaves the rest 0, the
// slot vectors are summed over the data group (ZeRO-1 only: without it every
// data rank holds the whole reduced gradient), the tensor group and the
// pipeline group, and each rank adds the result up in slot order. Adding
// zeros is exact, so a piece owned by one rank arrives unchanged:
//   - a single process, data parallelism with or without ZeRO-1 (shards
//     start on multiples of kNormChunk) and pipeline parallelism (stages
//     hold whole layers) all produce the single-process bits;
//   - replicated tensors count once (tensor rank 0 fills their slots), the
//     tied wte once (the first stage fills its slots);
//   - a ZeRO-1 shard boundary inside a piece (only where stages shift the
//     flat offsets) splits it into partial sums that the reduction adds.
//
// Thread-safety: immutable after construction; Fill may run concurrently on
// different slot vectors.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/model/gpt_config.h"
#include "worker/model/model_layout.h"
#include "worker/model/parameter_table.h"

namespace cohort::train {

class GradNormPlan {
 public:
  // `table` is this rank's (ParameterTable(config, layout)).
  GradNormPlan(const model::GptConfig& config, const model::ParameterTable& table);

  size_t num_slots() const { return num_slots_; }

  // Zeroes `slots` (num_slots()) and adds the squares of grads[i] for the
  // local flat offsets i in [begin, end) into the slots of their pieces,
  // skipping what this rank does not count (see above).
  void Fill(const float* grads, size_t begin, size_t end, std::vector<double>* slots,
            int threads) const;

  // sqrt of the slots' sum, in slot order.
  static double Norm(const std::vector<double>& slots);

  // What Fill sums for [begin, end): each piece of the list this rank
  // counts, cut to the range, as local flat offsets, in local order; the
  // pieces of one slot are adjacent. Fill sums each serially in double and
  // adds them into their slots; a backend that keeps the gradients sums the
  // same pieces on its own memory (DeviceOptimizer).
  struct Piece {
    size_t begin = 0;
    size_t end = 0;
    size_t slot = 0;
  };
  std::vector<Piece> Pieces(size_t begin, size_t end) const;

 private:
  // A run of this rank's local arena that is one segment of the list.
  struct Segment {
    size_t local_offset = 0;
    size_t length = 0;
    uint64_t cut_base = 0;  // offset whose kNormChunk multiples cut the segment
    size_t first_slot = 0;
  };

  std::vector<Segment> segments_;  // only those this rank counts, in local order
  size_t num_slots_ = 0;
};

}  // namespace cohort::train

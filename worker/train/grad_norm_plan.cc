#include "worker/train/grad_norm_plan.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "worker/train/grad_norm.h"

namespace cohort::train {
namespace {

using model::ParameterInfo;
using model::ShardKind;

constexpr uint64_t kChunk = kSumOfSquaresChunk;

// Pieces of a segment [base, base + length) cut at multiples of kChunk.
size_t PieceCount(uint64_t base, size_t length) {
  if (length == 0) return 0;
  return static_cast<size_t>((base + length + kChunk - 1) / kChunk - base / kChunk);
}

}  // namespace

GradNormPlan::GradNormPlan(const model::GptConfig& config, const model::ParameterTable& table) {
  const model::ModelLayout& layout = table.layout();
  const model::ParameterTable whole(config);
  const int first_layer = layout.first_layer(config);
  size_t slot = 0;
  for (const ParameterInfo& global : whole.tensors()) {
    const ParameterInfo& local = table[global.id];
    const bool split = layout.tp > 1 && global.shard != ShardKind::kReplicated;
    // Whether this rank fills the slots of the tensor's pieces it holds.
    bool counts = local.present();
    if (!split && layout.tp > 1 && layout.tp_rank != 0) counts = false;  // replicated: rank 0
    if (global.id == model::kWte && layout.pp > 1 && !layout.first_stage()) counts = false;
    const int layers = global.per_layer ? config.layers : 1;
    const int shards = split ? layout.tp : 1;
    const size_t global_length = global.LayerNumel();
    const size_t segment_length = global_length / shards;
    for (int l = 0; l < layers; ++l) {
      for (int r = 0; r < shards; ++r) {
        const uint64_t base = split ? 0 : global.offset + static_cast<uint64_t>(l) * global_length;
        const size_t pieces = PieceCount(base, segment_length);
        const int local_layer = l - (global.per_layer ? first_layer : 0);
        const bool mine = counts && (!split || r == layout.tp_rank) && local_layer >= 0 &&
                          (!global.per_layer || local_layer < local.shape[0]);
        if (mine) {
          segments_.push_back(Segment{
              .local_offset = local.offset + static_cast<size_t>(local_layer) * local.LayerNumel(),
              .length = segment_length,
              .cut_base = base,
              .first_slot = slot,
          });
        }
        slot += pieces;
      }
    }
  }
  num_slots_ = slot;
}

std::vector<GradNormPlan::Piece> GradNormPlan::Pieces(size_t begin, size_t end) const {
  std::vector<Piece> pieces;
  for (const Segment& seg : segments_) {
    const size_t lo = std::max(begin, seg.local_offset);
    const size_t hi = std::min(end, seg.local_offset + seg.length);
    size_t i = lo;
    while (i < hi) {
      const uint64_t global = seg.cut_base + (i - seg.local_offset);
      const size_t piece = static_cast<size_t>(global / kChunk - seg.cut_base / kChunk);
      const size_t piece_end = std::min<size_t>(hi, i + (kChunk - global % kChunk));
      pieces.push_back(Piece{i, piece_end, seg.first_slot + piece});
      i = piece_end;
    }
  }
  return pieces;
}

void GradNormPlan::Fill(const float* grads, size_t begin, size_t end, std::vector<double>* slots,
                        int threads) const {
  slots->assign(num_slots_, 0.0);
  // Every (piece intersected with [begin, end)) becomes one serial sum.
  const std::vector<Piece> pieces = Pieces(begin, end);
  std::vector<double> sums(pieces.size(), 0.0);
  const int64_t count = static_cast<int64_t>(pieces.size());
#pragma omp parallel for num_threads(threads > 0 ? threads : omp_get_max_threads()) \
    schedule(dynamic, 16)
  for (int64_t k = 0; k < count; ++k) {
    double sum = 0.0;
    for (size_t i = pieces[k].begin; i < pieces[k].end; ++i) {
      const double v = grads[i];
      sum += v * v;
    }
    sums[k] = sum;
  }
  // Pieces of one slot are adjacent and in order.
  for (size_t k = 0; k < pieces.size(); ++k) (*slots)[pieces[k].slot] += sums[k];
}

double GradNormPlan::Norm(const std::vector<double>& slots) {
  double total = 0.0;
  for (double s : slots) total += s;
  return std::sqrt(total);
}

}  // namespace cohort::train

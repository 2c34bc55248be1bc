// HierarchicalCommunicator's pipelined all-reduce: the local group and the
// lane, each on a UCP worker of its own, work on different pieces at once.

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "worker/comm/hierarchical_communicator.h"

namespace cohort::comm {

absl::Status HierarchicalCommunicator::RunPipelinedAllReduce(void* data, size_t count,
                                                             DataType type, ReduceOp op,
                                                             absl::Duration timeout) {
  const Deadline left(timeout);
  const size_t element = DataTypeSize(type);
  // Pieces of a whole number of local blocks (the last one may fall short
  // and is padded), about kPipelineChunkBytes each.
  const size_t locals = static_cast<size_t>(local_->size());
  const size_t chunk = std::max<size_t>(1, kPipelineChunkBytes / element / locals) * locals;
  struct Piece {
    size_t begin, count, per_rank, slice;  // elements
  };
  std::vector<Piece> pieces;
  size_t slice_elements = 0;
  for (size_t begin = 0; begin < count; begin += chunk) {
    const size_t n = std::min(chunk, count - begin);
    const size_t per_rank = (n + locals - 1) / locals;
    pieces.push_back({begin, n, per_rank, slice_elements});
    slice_elements += per_rank;
  }
  slice_.resize(slice_elements * element);
  auto* bytes = static_cast<uint8_t*>(data);
  // The local blocks of a piece: in place, or a padded copy when they do not
  // divide its count (the padding is reduced too, and dropped).
  auto blocks = [&](const Piece& piece) -> uint8_t* {
    if (piece.per_rank * locals == piece.count) return bytes + piece.begin * element;
    return padded_.data();
  };
  const Piece& last = pieces.back();
  const bool padded = last.per_rank * locals != last.count;
  if (padded) {
    padded_.resize(last.per_rank * locals * element);
    std::memcpy(padded_.data(), bytes + last.begin * element, last.count * element);
    std::memset(padded_.data() + last.count * element, 0,
                (last.per_rank * locals - last.count) * element);
  }
  auto slice_of = [&](const Piece& piece) { return slice_.data() + piece.slice * element; };

  // This thread runs the local group (reduce-scatter of piece i + 1, then
  // all-gather of piece i), a second one the lane (all-reduce of piece i):
  // the link carries one piece while shared memory reduces the next. A
  // failure on either side aborts the other, so neither waits out its
  // deadline.
  absl::Mutex mu;
  size_t reduced = 0, exchanged = 0;  // pieces done by each side
  absl::Status local_status, lane_status;
  std::thread lane_thread([&] {
    for (size_t i = 0; i < pieces.size(); ++i) {
      {
        absl::MutexLock lock(&mu);
        auto ready = [&] { return reduced > i || !local_status.ok(); };
        mu.Await(absl::Condition(&ready));
        if (!local_status.ok()) return;
      }
      absl::Status status =
          LaneError(lane_->AllReduce(slice_of(pieces[i]), pieces[i].per_rank, type, op, left()));
      absl::MutexLock lock(&mu);
      if (!status.ok()) {
        lane_status = status;
        local_->Abort(status);
        return;
      }
      exchanged = i + 1;
    }
  });
  auto local_failed = [&](const absl::Status& status) {
    absl::MutexLock lock(&mu);
    if (local_status.ok()) local_status = status;
    lane_->Abort(status);
  };
  auto reduce_scatter = [&](size_t i) {
    absl::Status status = local_->ReduceScatter(blocks(pieces[i]), slice_of(pieces[i]),
                                                pieces[i].per_rank, type, op, left());
    if (!status.ok()) {
      local_failed(status);
      return false;
    }
    absl::MutexLock lock(&mu);
    reduced = i + 1;
    return true;
  };
  bool ok = reduce_scatter(0);
  for (size_t i = 0; ok && i < pieces.size(); ++i) {
    if (i + 1 < pieces.size() && !reduce_scatter(i + 1)) break;
    {
      absl::MutexLock lock(&mu);
      auto ready = [&] { return exchanged > i || !lane_status.ok(); };
      mu.Await(absl::Condition(&ready));
      if (!lane_status.ok()) break;
    }
    absl::Status status =
        local_->AllGather(slice_of(pieces[i]), blocks(pieces[i]), pieces[i].per_rank, type, left());
    if (!status.ok()) {
      local_failed(status);
      break;
    }
  }
  lane_thread.join();
  // The first failure is the cause; the other side's is the abort it made.
  if (!lane_status.ok() && (local_status.ok() || absl::IsAborted(local_status))) {
    return lane_status;
  }
  RETURN_IF_ERROR(local_status);
  if (padded) std::memcpy(bytes + last.begin * element, padded_.data(), last.count * element);
  return absl::OkStatus();
}

}  // namespace cohort::comm

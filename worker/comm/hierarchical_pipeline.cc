// HierarchicalCommunicator's collectives in pieces, the local group and the
// lane (each on a UCP worker of its own) working on different pieces at once.

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "worker/comm/hierarchical_communicator.h"

namespace cohort::comm {

absl::Status HierarchicalCommunicator::RunPieces(size_t pieces,
                                                 absl::FunctionRef<absl::Status(size_t)> local,
                                                 absl::FunctionRef<absl::Status(size_t)> lane,
                                                 absl::FunctionRef<absl::Status(size_t)> after) {
  if (pieces == 1) {
    RETURN_IF_ERROR(local(0));
    RETURN_IF_ERROR(lane(0));
    return after(0);
  }
  // This thread runs `local` one piece ahead of the lane and `after` once
  // the lane is done with a piece; a second thread runs the lane. A failure
  // on either side aborts the other's communicator, so neither waits out
  // its deadline.
  absl::Mutex mu;
  size_t prepared = 0, exchanged = 0;  // pieces done by each side
  absl::Status local_status, lane_status;
  std::thread lane_thread([&] {
    for (size_t i = 0; i < pieces; ++i) {
      {
        absl::MutexLock lock(&mu);
        auto ready = [&] { return prepared > i || !local_status.ok(); };
        mu.Await(absl::Condition(&ready));
        if (!local_status.ok()) return;
      }
      absl::Status status = lane(i);
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
  auto prepare = [&](size_t i) {
    absl::Status status = local(i);
    if (!status.ok()) {
      local_failed(status);
      return false;
    }
    absl::MutexLock lock(&mu);
    prepared = i + 1;
    return true;
  };
  bool ok = prepare(0);
  for (size_t i = 0; ok && i < pieces; ++i) {
    if (i + 1 < pieces && !prepare(i + 1)) break;
    {
      absl::MutexLock lock(&mu);
      auto ready = [&] { return exchanged > i || !lane_status.ok(); };
      mu.Await(absl::Condition(&ready));
      if (!lane_status.ok()) break;
    }
    if (absl::Status status = after(i); !status.ok()) {
      local_failed(status);
      break;
    }
  }
  lane_thread.join();
  // The first failure is the cause; the other side's is the abort it made.
  if (!lane_status.ok() && (local_status.ok() || absl::IsAborted(local_status))) {
    return lane_status;
  }
  return local_status;
}

HierarchicalCommunicator::BlockPieces HierarchicalCommunicator::CutBlocks(size_t per_block,
                                                                          size_t element) {
  const size_t n = static_cast<size_t>(size());
  BlockPieces pieces;
  pieces.per_block = per_block;
  pieces.sub = piece_bytes_ == 0 ? per_block : std::max<size_t>(1, piece_bytes_ / element / n);
  pieces.count = (per_block + pieces.sub - 1) / pieces.sub;
  staged_.resize(n * std::min(pieces.sub, per_block) * element);
  slice_.resize(hosts_.size() * per_block * element);
  return pieces;
}

absl::Status HierarchicalCommunicator::RunAllReduce(void* data, size_t count, DataType type,
                                                    ReduceOp op, absl::Duration timeout) {
  const size_t element = DataTypeSize(type);
  if (count * element < kHierarchicalMinBytes) {
    return flat_->AllReduce(data, count, type, op, timeout);
  }
  const Deadline left(timeout);
  // Pieces of a whole number of local blocks (the last one may fall short
  // and is padded), about piece_bytes_ each. A piece is a local
  // reduce-scatter, a lane all-reduce of this rank's slice of it and a
  // local all-gather.
  const size_t locals = static_cast<size_t>(local_->size());
  const size_t target = piece_bytes_ == 0 ? count * element : piece_bytes_;
  const size_t chunk = std::max<size_t>(1, target / element / locals) * locals;
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
  RETURN_IF_ERROR(RunPieces(
      pieces.size(),
      [&](size_t i) {
        return local_->ReduceScatter(blocks(pieces[i]), slice_of(pieces[i]), pieces[i].per_rank,
                                     type, op, left());
      },
      [&](size_t i) {
        return LaneError(
            lane_->AllReduce(slice_of(pieces[i]), pieces[i].per_rank, type, op, left()));
      },
      [&](size_t i) {
        return local_->AllGather(slice_of(pieces[i]), blocks(pieces[i]), pieces[i].per_rank, type,
                                 left());
      }));
  if (padded) std::memcpy(bytes + last.begin * element, padded_.data(), last.count * element);
  return absl::OkStatus();
}

absl::Status HierarchicalCommunicator::RunOrderedPieces(const float* input, size_t count,
                                                        size_t block, float* output,
                                                        const OrderedSplit& split,
                                                        absl::Duration timeout) {
  const Deadline left(timeout);
  const size_t n = static_cast<size_t>(size());
  const size_t hosts = hosts_.size();
  // Piece p is elements [p sub, p sub + m) of every rank's block (about
  // piece_bytes_ of the group's buffer): the additions are elementwise,
  // so each piece folds in the list's order on its own. The host's ranks
  // fold it (shared memory), then the lane exchanges the hosts' partial sums
  // and folds them.
  const BlockPieces pieces = CutBlocks(block, sizeof(float));
  const size_t sub = pieces.sub;
  auto slice_of = [&](size_t p) {
    return reinterpret_cast<float*>(LaneShare(pieces, p, sizeof(float)));
  };
  // This rank's block within the caller's buffer: where the output ends.
  const size_t own = std::min(count, block * static_cast<size_t>(rank()));
  const size_t own_end = std::min(count, own + block);
  return RunPieces(
      pieces.count,
      [&](size_t p) -> absl::Status {
        const size_t m = pieces.length(p);
        ToLanes(reinterpret_cast<const uint8_t*>(input), count * sizeof(float),
                block * sizeof(float), p * sub * sizeof(float), m * sizeof(float), staged_.data());
        const auto* staged = reinterpret_cast<const float*>(staged_.data());
        const absl::Status status = local_->ReduceScatterOrdered(staged, m * n, m * hosts,
                                                                 slice_of(p), split.local, left());
        if (!absl::IsUnimplemented(status)) return status;
        // No shared memory on this host (UCX_TLS set): the same order, point
        // to point.
        ASSIGN_OR_RETURN(const float* folded, ExchangeOrdered(local_.get(), staged, m * hosts,
                                                              split.local, left, &pieces_));
        std::memcpy(slice_of(p), folded, m * hosts * sizeof(float));
        return absl::OkStatus();
      },
      [&](size_t p) -> absl::Status {
        const size_t m = pieces.length(p);
        absl::StatusOr<const float*> root =
            ExchangeOrdered(lane_.get(), slice_of(p), m, split.hosts, left, &lane_pieces_);
        if (!root.ok()) return LaneError(root.status());
        // The output may be the caller's own block of `input`: piece p is
        // written only after it was staged, and the next piece staged reads
        // other elements.
        const size_t begin = std::min(own_end, own + p * sub);
        const size_t end = std::min(own_end, begin + m);
        if (end > begin) std::memcpy(output + p * sub, *root, (end - begin) * sizeof(float));
        return absl::OkStatus();
      },
      [](size_t) { return absl::OkStatus(); });
}

absl::Status HierarchicalCommunicator::RunAllGatherRanges(void* data,
                                                          const std::vector<ByteRange>& ranges,
                                                          uint32_t tag, absl::Duration timeout) {
  size_t total = 0, longest = 0;
  for (const ByteRange& range : ranges) {
    total += range.size();
    longest = std::max(longest, range.size());
  }
  if (ranges.size() != static_cast<size_t>(size()) || total < kHierarchicalMinBytes) {
    return Communicator::AllGatherRanges(data, ranges, tag, timeout);  // on the flat group
  }
  const Deadline left(timeout);
  auto* bytes = static_cast<uint8_t*>(data);
  const int hosts = static_cast<int>(hosts_.size());
  const int locals = local_->size();
  // Piece p of every range is its bytes [p q, (p + 1) q) (empty past its
  // end): about piece_bytes_ of the group's ranges per piece.
  const size_t q = piece_bytes_ == 0
                       ? std::max<size_t>(1, longest)
                       : std::max<size_t>(64, piece_bytes_ / static_cast<size_t>(size()) / 64 * 64);
  const size_t pieces = std::max<size_t>(1, (longest + q - 1) / q);
  auto piece = [&](const ByteRange& range, size_t p) {
    return ByteRange{std::min(range.end, range.begin + p * q),
                     std::min(range.end, range.begin + (p + 1) * q)};
  };
  return RunPieces(
      pieces, [](size_t) { return absl::OkStatus(); },
      // Across hosts, each lane moves its members' ranges...
      [&](size_t p) -> absl::Status {
        const ByteRange mine = piece(ranges[rank()], p);
        for (int k = 1; k < hosts; ++k) {
          const int to = (host_ + k) % hosts;
          const int from = (host_ - k + hosts) % hosts;
          const ByteRange theirs = piece(ranges[GroupRank(from, local_index_)], p);
          RETURN_IF_ERROR(
              LaneError(lane_->SendRecv(bytes + mine.begin, mine.size(), to, bytes + theirs.begin,
                                        theirs.size(), from, tag, left())));
        }
        return absl::OkStatus();
      },
      // ...then each host shares what its lanes brought.
      [&](size_t p) -> absl::Status {
        for (int k = 1; k < locals; ++k) {
          const int to = (local_index_ + k) % locals;
          const int from = (local_index_ - k + locals) % locals;
          for (int h = 0; h < hosts; ++h) {
            const ByteRange out = piece(ranges[GroupRank(h, local_index_)], p);
            const ByteRange in = piece(ranges[GroupRank(h, from)], p);
            RETURN_IF_ERROR(local_->SendRecv(bytes + out.begin, out.size(), to, bytes + in.begin,
                                             in.size(), from, tag, left()));
          }
        }
        return absl::OkStatus();
      });
}

absl::Status HierarchicalCommunicator::RunReduceScatter(const void* input, void* output,
                                                        size_t count_per_rank, DataType type,
                                                        ReduceOp op, absl::Duration timeout) {
  const size_t element = DataTypeSize(type);
  const size_t block = count_per_rank * element;
  const size_t n = static_cast<size_t>(size());
  if (block * n < kHierarchicalMinBytes || input == nullptr) {
    return flat_->ReduceScatter(input, output, count_per_rank, type, op, timeout);
  }
  const Deadline left(timeout);
  const size_t hosts = hosts_.size();
  // Piece p is elements [p sub, p sub + m) of every rank's block: restaged
  // lane by lane, reduced on this host (this rank's share: those of its
  // lane's members), then across the hosts by the lane, whose blocks are in
  // host order (lane rank h's is GroupRank(h, l): this rank's is its own).
  const BlockPieces pieces = CutBlocks(count_per_rank, element);
  return RunPieces(
      pieces.count,
      [&](size_t p) {
        const size_t m = pieces.length(p);
        ToLanes(static_cast<const uint8_t*>(input), block * n, block, p * pieces.sub * element,
                m * element, staged_.data());
        return local_->ReduceScatter(staged_.data(), LaneShare(pieces, p, element), m * hosts, type,
                                     op, left());
      },
      [&](size_t p) {
        return LaneError(lane_->ReduceScatter(
            LaneShare(pieces, p, element), static_cast<uint8_t*>(output) + p * pieces.sub * element,
            pieces.length(p), type, op, left()));
      },
      [](size_t) { return absl::OkStatus(); });
}

absl::Status HierarchicalCommunicator::RunAllGather(const void* input, void* output,
                                                    size_t count_per_rank, DataType type,
                                                    absl::Duration timeout) {
  const size_t element = DataTypeSize(type);
  const size_t block = count_per_rank * element;
  const size_t n = static_cast<size_t>(size());
  if (block * n < kHierarchicalMinBytes || input == nullptr || output == nullptr) {
    return flat_->AllGather(input, output, count_per_rank, type, timeout);
  }
  const Deadline left(timeout);
  const size_t hosts = hosts_.size();
  // Piece p is elements [p sub, p sub + m) of every rank's block: gathered
  // across the hosts by the lane, then on this host, then put in place.
  // `input` may be this rank's block of `output`: piece p is written only
  // after the lane read it, and the lane reads other pieces meanwhile.
  const BlockPieces pieces = CutBlocks(count_per_rank, element);
  return RunPieces(
      pieces.count, [](size_t) { return absl::OkStatus(); },
      [&](size_t p) {
        return LaneError(
            lane_->AllGather(static_cast<const uint8_t*>(input) + p * pieces.sub * element,
                             LaneShare(pieces, p, element), pieces.length(p), type, left()));
      },
      [&](size_t p) -> absl::Status {
        const size_t m = pieces.length(p);
        RETURN_IF_ERROR(local_->AllGather(LaneShare(pieces, p, element), staged_.data(), m * hosts,
                                          type, left()));
        FromLanes(staged_.data(), block, p * pieces.sub * element, m * element, block * n,
                  static_cast<uint8_t*>(output));
        return absl::OkStatus();
      });
}

}  // namespace cohort::comm

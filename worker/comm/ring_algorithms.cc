#include "worker/comm/ring_algorithms.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "absl/functional/function_ref.h"
#include "common/status_macros.h"
#include "worker/comm/reduce.h"

namespace cohort::comm {
namespace {

using Handle = Channel::Handle;

int Mod(int a, int n) { return ((a % n) + n) % n; }

// The sends a ring has in flight, at most kRingSendWindow, retired in the
// order they were posted.
class SendWindow {
 public:
  bool empty() const { return count_ == 0; }
  bool full() const { return count_ == kRingSendWindow; }
  void Push(Handle handle) {
    sends_[static_cast<size_t>((head_ + count_) % kRingSendWindow)] = handle;
    ++count_;
  }
  // Retires the oldest sends that have completed, up to the first that has not.
  absl::Status Retire(Channel& channel) {
    while (count_ > 0) {
      ASSIGN_OR_RETURN(const bool done, channel.Test(&sends_[static_cast<size_t>(head_)]));
      if (!done) break;
      head_ = (head_ + 1) % kRingSendWindow;
      --count_;
    }
    return absl::OkStatus();
  }

 private:
  std::array<Handle, kRingSendWindow> sends_;
  int head_ = 0;
  int count_ = 0;
};

// Chunk and segment boundaries, in elements. Chunk c covers
// [c * chunk, min((c + 1) * chunk, count)); segment s of it the s-th
// `segment`-sized piece. Boundaries depend only on (count, n, element size),
// never on timing, which the determinism contract needs.
struct RingGeometry {
  size_t count = 0;
  size_t chunk = 0;
  size_t segment = 0;
  int segments = 0;

  RingGeometry(size_t count_in, size_t chunk_in, size_t element)
      : count(count_in), chunk(chunk_in) {
    segment = std::max<size_t>(1, std::min(chunk, kRingSegmentBytes / element));
    segments = static_cast<int>((chunk + segment - 1) / segment);
  }
  // [begin, end) of (chunk c, segment s); empty when past the end.
  void Range(int c, int s, size_t* begin, size_t* end) const {
    const size_t chunk_end = std::min(count, (static_cast<size_t>(c) + 1) * chunk);
    *begin = std::min(chunk_end, static_cast<size_t>(c) * chunk + static_cast<size_t>(s) * segment);
    *end = std::min(chunk_end, *begin + segment);
  }
};

struct RingSegment {
  const void* send = nullptr;
  size_t send_bytes = 0;
  void* recv = nullptr;
  size_t recv_bytes = 0;
};

// One pipelined pass of `steps` ring steps x `segments` segments. Operation
// j = step * segments + segment sends describe(j).send to the right
// neighbour and receives describe(j).recv from the left one; received(j) is
// called in order once operation j's receive is complete. The send of
// operation j waits for operation j - segments to be received (the data it
// forwards), except in the first step. `slot` (j % kRingRecvWindow) names a
// scratch slot free for operation j's receive.
struct RingPlan {
  int steps = 0;
  int segments = 0;
  absl::FunctionRef<RingSegment(int op, int slot)> describe;
  absl::FunctionRef<void(int op, int slot, const RingSegment& segment)> received;
};

absl::Status RunRing(Channel& channel, const RingPlan& plan) {
  const int me = channel.rank();
  const int left = channel.ring_rank(channel.ring_position() - 1);
  const int right = channel.ring_rank(channel.ring_position() + 1);
  const int total = plan.steps * plan.segments;
  std::array<Handle, kRingRecvWindow> recvs;
  std::array<RingSegment, kRingRecvWindow> pending;
  SendWindow sends;
  int next_recv = 0;
  int next_send = 0;
  int next_done = 0;
  // Until every operation is posted, received and retired: the last
  // receives can complete in the same pass as those the last sends wait on
  // (the left neighbour ran ahead), before those sends are posted, and the
  // right neighbour still waits on them.
  while (next_done < total || next_send < total || !sends.empty()) {
    while (next_recv < total && next_recv < next_done + kRingRecvWindow) {
      const int slot = next_recv % kRingRecvWindow;
      pending[slot] = plan.describe(next_recv, slot);
      recvs[slot] = Channel::kDone;
      if (pending[slot].recv_bytes > 0) {
        absl::StatusOr<Handle> h =
            channel.PostRecv(left, channel.CollectiveTag(left, static_cast<uint32_t>(next_recv)),
                             pending[slot].recv, pending[slot].recv_bytes);
        if (!h.ok()) return h.status();
        recvs[slot] = *h;
      }
      ++next_recv;
    }
    RETURN_IF_ERROR(sends.Retire(channel));
    while (next_send < total && !sends.full() &&
           (next_send < plan.segments || next_send - plan.segments < next_done)) {
      const RingSegment segment = plan.describe(next_send, -1);
      Handle handle = Channel::kDone;
      if (segment.send_bytes > 0) {
        absl::StatusOr<Handle> h =
            channel.PostSend(right, channel.CollectiveTag(me, static_cast<uint32_t>(next_send)),
                             segment.send, segment.send_bytes);
        if (!h.ok()) return h.status();
        handle = *h;
      }
      sends.Push(handle);
      ++next_send;
    }
    bool advanced = false;
    while (next_done < next_recv) {
      const int slot = next_done % kRingRecvWindow;
      absl::StatusOr<bool> done = channel.Test(&recvs[slot]);
      if (!done.ok()) return done.status();
      if (!*done) break;
      plan.received(next_done, slot, pending[slot]);
      ++next_done;
      advanced = true;
    }
    if (!advanced) RETURN_IF_ERROR(channel.Poll());
  }
  return absl::OkStatus();
}

// Waits for every handle in `handles` (kDone entries are skipped).
absl::Status WaitAll(Channel& channel, Handle* handles, int count) {
  for (int i = 0; i < count; ++i) RETURN_IF_ERROR(channel.Wait(&handles[i]));
  return absl::OkStatus();
}

}  // namespace

bool DirectFits(const Channel& channel) {
  return 2 * (channel.size() - 1) <= Channel::kMaxRequests;
}

absl::Status RingAllReduce(Channel& channel, void* data, size_t count, DataType type,
                           ReduceOp op, ScratchBuffer& scratch) {
  const int n = channel.size();
  // Chunks are numbered by ring position: any numbering all ranks share
  // works, and this one follows the ring.
  const int me = channel.ring_position();
  const size_t element = DataTypeSize(type);
  const RingGeometry geometry(count, (count + n - 1) / n, element);
  uint8_t* slots = scratch.Get(kRingRecvWindow * geometry.segment * element);
  auto* bytes = static_cast<uint8_t*>(data);
  // Steps 0..n-2 reduce-scatter: send chunk me-k, receive chunk me-k-1 into a
  // scratch slot and add it to ours. Steps n-1..2n-3 allgather: send chunk
  // me+1-k', receive chunk me-k' straight into place.
  auto describe = [&](int op_index, int slot) {
    const int step = op_index / geometry.segments;
    const int seg = op_index % geometry.segments;
    const bool reducing = step < n - 1;
    const int send_chunk = reducing ? Mod(me - step, n) : Mod(me + 1 - (step - (n - 1)), n);
    const int recv_chunk = reducing ? Mod(me - step - 1, n) : Mod(me - (step - (n - 1)), n);
    RingSegment segment;
    size_t begin, end;
    geometry.Range(send_chunk, seg, &begin, &end);
    segment.send = bytes + begin * element;
    segment.send_bytes = (end - begin) * element;
    geometry.Range(recv_chunk, seg, &begin, &end);
    segment.recv_bytes = (end - begin) * element;
    if (!reducing) {
      segment.recv = bytes + begin * element;
    } else if (slot >= 0) {
      segment.recv = slots + static_cast<size_t>(slot) * geometry.segment * element;
    }
    return segment;
  };
  auto received = [&](int op_index, int slot, const RingSegment& segment) {
    if (op_index / geometry.segments >= n - 1 || segment.recv_bytes == 0) return;
    const int step = op_index / geometry.segments;
    size_t begin, end;
    geometry.Range(Mod(me - step - 1, n), op_index % geometry.segments, &begin, &end);
    uint8_t* target = bytes + begin * element;
    ReduceInto(type, op, target, segment.recv, target, end - begin);
  };
  return RunRing(channel, RingPlan{2 * (n - 1), geometry.segments, describe, received});
}

namespace {

// One round of the direct algorithms: receives peer p's `bytes` into
// `blocks + bytes * p` and sends `send_for(p)` (`bytes` long) to every peer p.
template <typename SendFor>
absl::Status ExchangeWithEveryPeer(Channel& channel, uint8_t* blocks, size_t bytes,
                                   SendFor send_for) {
  const int n = channel.size();
  const int me = channel.rank();
  std::array<Handle, Channel::kMaxRequests> handles;
  int posted = 0;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    absl::StatusOr<Handle> h =
        channel.PostRecv(p, channel.CollectiveTag(p, 0), blocks + bytes * p, bytes);
    if (!h.ok()) return h.status();
    handles[posted++] = *h;
  }
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    absl::StatusOr<Handle> h =
        channel.PostSend(p, channel.CollectiveTag(me, 0), send_for(p), bytes);
    if (!h.ok()) return h.status();
    handles[posted++] = *h;
  }
  return WaitAll(channel, handles.data(), posted);
}

// output = blocks[0] op blocks[1] op ... op blocks[n-1], in rank order so
// every rank computes the same bits. Needs n >= 2.
void ReduceBlocksInRankOrder(DataType type, ReduceOp op, const uint8_t* blocks, int n, size_t bytes,
                             void* output, size_t count) {
  ReduceInto(type, op, blocks, blocks + bytes, output, count);
  for (int p = 2; p < n; ++p) ReduceInto(type, op, output, blocks + bytes * p, output, count);
}

}  // namespace

absl::Status DirectAllReduce(Channel& channel, void* data, size_t count, DataType type,
                             ReduceOp op, ScratchBuffer& scratch) {
  const int n = channel.size();
  const int me = channel.rank();
  const size_t bytes = count * DataTypeSize(type);
  uint8_t* inputs = scratch.Get(bytes * static_cast<size_t>(n));
  std::memcpy(inputs + bytes * me, data, bytes);
  RETURN_IF_ERROR(
      ExchangeWithEveryPeer(channel, inputs, bytes, [&](int) { return inputs + bytes * me; }));
  ReduceBlocksInRankOrder(type, op, inputs, n, bytes, data, count);
  return absl::OkStatus();
}

absl::Status RingReduceScatter(Channel& channel, const void* input, void* output,
                               size_t count_per_rank, DataType type, ReduceOp op,
                               ScratchBuffer& scratch, ScratchBuffer& work) {
  const int n = channel.size();
  // Positions along the ring; the chunk of position p is its rank's block.
  const int me = channel.ring_position();
  auto block = [&](int position) { return channel.ring_rank(position); };
  const size_t element = DataTypeSize(type);
  const RingGeometry geometry(count_per_rank * n, count_per_rank, element);
  uint8_t* slots = scratch.Get(kRingRecvWindow * geometry.segment * element);
  uint8_t* partial = work.Get(count_per_rank * n * element);
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  // Step k sends chunk me-k-1 (our input at k = 0, else the partial sum made
  // in step k-1) and receives chunk me-k-2, so rank r finishes with chunk r.
  auto describe = [&](int op_index, int slot) {
    const int step = op_index / geometry.segments;
    const int seg = op_index % geometry.segments;
    RingSegment segment;
    size_t begin, end;
    geometry.Range(block(me - step - 1), seg, &begin, &end);
    segment.send = (step == 0 ? in : partial) + begin * element;
    segment.send_bytes = (end - begin) * element;
    geometry.Range(block(me - step - 2), seg, &begin, &end);
    segment.recv_bytes = (end - begin) * element;
    if (slot >= 0) segment.recv = slots + static_cast<size_t>(slot) * geometry.segment * element;
    return segment;
  };
  auto received = [&](int op_index, int /*slot*/, const RingSegment& segment) {
    if (segment.recv_bytes == 0) return;
    const int step = op_index / geometry.segments;
    const int chunk = block(me - step - 2);
    size_t begin, end;
    geometry.Range(chunk, op_index % geometry.segments, &begin, &end);
    uint8_t* target = step == n - 2 ? out + (begin - chunk * count_per_rank) * element
                                    : partial + begin * element;
    ReduceInto(type, op, in + begin * element, segment.recv, target, end - begin);
  };
  return RunRing(channel, RingPlan{n - 1, geometry.segments, describe, received});
}

absl::Status DirectReduceScatter(Channel& channel, const void* input, void* output,
                                 size_t count_per_rank, DataType type, ReduceOp op,
                                 ScratchBuffer& scratch) {
  const int n = channel.size();
  const int me = channel.rank();
  const size_t bytes = count_per_rank * DataTypeSize(type);
  const auto* in = static_cast<const uint8_t*>(input);
  uint8_t* blocks = scratch.Get(bytes * static_cast<size_t>(n));
  std::memcpy(blocks + bytes * me, in + bytes * me, bytes);
  RETURN_IF_ERROR(
      ExchangeWithEveryPeer(channel, blocks, bytes, [&](int p) { return in + bytes * p; }));
  ReduceBlocksInRankOrder(type, op, blocks, n, bytes, output, count_per_rank);
  return absl::OkStatus();
}

absl::Status RingAllGather(Channel& channel, void* output, size_t bytes_per_rank) {
  const int n = channel.size();
  // Positions along the ring; the chunk of position p is its rank's block.
  const int me = channel.ring_position();
  auto block = [&](int position) { return channel.ring_rank(position); };
  const RingGeometry geometry(bytes_per_rank * n, bytes_per_rank, 1);
  auto* out = static_cast<uint8_t*>(output);
  auto describe = [&](int op_index, int /*slot*/) {
    const int step = op_index / geometry.segments;
    const int seg = op_index % geometry.segments;
    RingSegment segment;
    size_t begin, end;
    geometry.Range(block(me - step), seg, &begin, &end);
    segment.send = out + begin;
    segment.send_bytes = end - begin;
    geometry.Range(block(me - step - 1), seg, &begin, &end);
    segment.recv = out + begin;
    segment.recv_bytes = end - begin;
    return segment;
  };
  auto received = [](int, int, const RingSegment&) {};
  return RunRing(channel, RingPlan{n - 1, geometry.segments, describe, received});
}

absl::Status DirectAllGather(Channel& channel, void* output, size_t bytes_per_rank) {
  auto* out = static_cast<uint8_t*>(output);
  const int me = channel.rank();
  return ExchangeWithEveryPeer(channel, out, bytes_per_rank,
                               [&](int) { return out + bytes_per_rank * me; });
}

namespace {

// Whether a collective exchanging `bytes` in total takes the direct path.
bool UseDirect(const Channel& channel, size_t bytes) {
  return bytes <= kDirectMaxBytes && DirectFits(channel);
}

}  // namespace

absl::Status ChannelAllReduce(Channel& channel, void* data, size_t count, DataType type,
                              ReduceOp op, ScratchBuffer& scratch) {
  if (UseDirect(channel, count * DataTypeSize(type) * static_cast<size_t>(channel.size()))) {
    return DirectAllReduce(channel, data, count, type, op, scratch);
  }
  return RingAllReduce(channel, data, count, type, op, scratch);
}

absl::Status ChannelReduceScatter(Channel& channel, const void* input, void* output,
                                  size_t count_per_rank, DataType type, ReduceOp op,
                                  ScratchBuffer& scratch, ScratchBuffer& work) {
  if (UseDirect(channel,
                count_per_rank * DataTypeSize(type) * static_cast<size_t>(channel.size()))) {
    return DirectReduceScatter(channel, input, output, count_per_rank, type, op, scratch);
  }
  return RingReduceScatter(channel, input, output, count_per_rank, type, op, scratch, work);
}

absl::Status ChannelAllGather(Channel& channel, void* output, size_t bytes_per_rank) {
  if (UseDirect(channel, bytes_per_rank * static_cast<size_t>(channel.size()))) {
    return DirectAllGather(channel, output, bytes_per_rank);
  }
  return RingAllGather(channel, output, bytes_per_rank);
}

absl::Status Broadcast(Channel& channel, void* data, size_t bytes, int root) {
  const int n = channel.size();
  const int me = channel.rank();
  auto* buffer = static_cast<uint8_t*>(data);
  if (bytes * static_cast<size_t>(n) <= kDirectMaxBytes && DirectFits(channel)) {
    if (me != root) {
      absl::StatusOr<Handle> h =
          channel.PostRecv(root, channel.CollectiveTag(root, 0), data, bytes);
      if (!h.ok()) return h.status();
      return channel.Wait(&*h);
    }
    std::array<Handle, Channel::kMaxRequests> handles;
    int posted = 0;
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      absl::StatusOr<Handle> h = channel.PostSend(p, channel.CollectiveTag(me, 0), data, bytes);
      if (!h.ok()) return h.status();
      handles[posted++] = *h;
    }
    return WaitAll(channel, handles.data(), posted);
  }
  // Chain root -> root+1 -> ... : each rank forwards segment s as soon as it
  // has it, so the chain streams.
  const int position = Mod(me - root, n);
  const int left = Mod(me - 1, n);
  const int right = Mod(me + 1, n);
  const bool receives = position > 0;
  const bool forwards = position < n - 1;
  const int segments = static_cast<int>((bytes + kRingSegmentBytes - 1) / kRingSegmentBytes);
  auto range = [&](int s, size_t* begin) {
    *begin = static_cast<size_t>(s) * kRingSegmentBytes;
    return std::min(bytes - *begin, kRingSegmentBytes);
  };
  std::array<Handle, kRingRecvWindow> recvs;
  SendWindow sends;
  int next_recv = receives ? 0 : segments;
  int next_done = receives ? 0 : segments;
  int next_send = forwards ? 0 : segments;
  while (next_done < segments || next_send < segments || !sends.empty()) {
    while (next_recv < segments && next_recv < next_done + kRingRecvWindow) {
      size_t begin;
      const size_t length = range(next_recv, &begin);
      absl::StatusOr<Handle> h =
          channel.PostRecv(left, channel.CollectiveTag(left, static_cast<uint32_t>(next_recv)),
                           buffer + begin, length);
      if (!h.ok()) return h.status();
      recvs[next_recv % kRingRecvWindow] = *h;
      ++next_recv;
    }
    RETURN_IF_ERROR(sends.Retire(channel));
    while (next_send < segments && !sends.full() &&
           (!receives || next_send < next_done)) {
      size_t begin;
      const size_t length = range(next_send, &begin);
      absl::StatusOr<Handle> h =
          channel.PostSend(right, channel.CollectiveTag(me, static_cast<uint32_t>(next_send)),
                           buffer + begin, length);
      if (!h.ok()) return h.status();
      sends.Push(*h);
      ++next_send;
    }
    bool advanced = false;
    while (next_done < next_recv) {
      absl::StatusOr<bool> done = channel.Test(&recvs[next_done % kRingRecvWindow]);
      if (!done.ok()) return done.status();
      if (!*done) break;
      ++next_done;
      advanced = true;
    }
    if (!advanced) RETURN_IF_ERROR(channel.Poll());
  }
  return absl::OkStatus();
}

absl::Status DisseminationBarrier(Channel& channel) {
  const int n = channel.size();
  const int me = channel.rank();
  static const uint8_t kToken = 1;
  uint8_t sink = 0;
  uint32_t round = 0;
  for (int distance = 1; distance < n; distance *= 2, ++round) {
    const int to = Mod(me + distance, n);
    const int from = Mod(me - distance, n);
    absl::StatusOr<Handle> recv =
        channel.PostRecv(from, channel.CollectiveTag(from, round), &sink, 1);
    if (!recv.ok()) return recv.status();
    absl::StatusOr<Handle> send =
        channel.PostSend(to, channel.CollectiveTag(me, round), &kToken, 1);
    if (!send.ok()) return send.status();
    RETURN_IF_ERROR(channel.Wait(&*recv));
    RETURN_IF_ERROR(channel.Wait(&*send));
  }
  return absl::OkStatus();
}

}  // namespace cohort::comm

#pragma once
// Collective algorithms as plain functions over the Channel seam
// (channel.h): they move tagged messages only, so the same code runs over
// UCX in production (UcxChannel) and over threads in the unit tests
// (InMemoryChannel); call setup, deadlines and aborts are the channel
// owner's.
//
// Ring (bandwidth-optimal): the buffer is split into size() chunks, each
// chunk into segments of kRingSegmentBytes. Reduce-scatter then allgather
// run as one pipeline of 2(n-1) steps x segments: up to kRingRecvWindow
// receives are posted ahead into scratch slots and up to kRingSendWindow
// sends are in flight, so transfer and reduction overlap. Each rank sends
// and receives 2(n-1)/n of the buffer. The ring is the channel's
// (Channel::ring_position; UcxChannel groups ranks host by host, so it
// crosses each host boundary once in each direction); chunks are numbered
// by position (reduce-scatter and allgather map position p's chunk to its
// rank's block). The partial sum of chunk c starts at position c+1 and
// accumulates in ring order, so results are deterministic for a given
// (size, count, hosts), and the allgather only copies, so every rank gets
// the same bits. Exactly: with x_p the input at ring position p, the
// all-reduce's chunk c is x_{c+n-1} + (... + (x_{c+1} + x_c)), and the
// reduce-scatter's block at position b is x_b + (... + (x_{b+2} + x_{b+1}))
// (positions modulo n; each addition is the receiver's own value first).
//
// Direct (latency-optimal for small messages): every rank sends its input to
// every other rank in one round, then each reduces all inputs in rank order
// 0..n-1 (deterministic, bitwise identical everywhere). Chosen when
// count * size() * element size <= kDirectMaxBytes.
//
// Every function: OK, or the channel's errors (Aborted, Unavailable,
// DeadlineExceeded); on error outstanding requests are left for the caller's
// Channel::ReleaseAll().

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/comm/communicator.h"
#include "worker/comm/channel.h"

namespace cohort::comm {

inline constexpr size_t kRingSegmentBytes = 512 * 1024;
inline constexpr int kRingRecvWindow = 4;
inline constexpr int kRingSendWindow = 8;
// Bytes exchanged by a direct algorithm (input size times group size) at or
// below which it beats the ring: one round of latency instead of 2(n-1).
inline constexpr size_t kDirectMaxBytes = 256 * 1024;

// Scratch memory reused across calls: grows to the largest need, never
// shrinks, so steady state allocates nothing.
class ScratchBuffer {
 public:
  uint8_t* Get(size_t bytes) {
    if (buffer_.size() < bytes) buffer_.resize(bytes);
    return buffer_.data();
  }

 private:
  std::vector<uint8_t> buffer_;
};

// Whether the direct algorithms fit the request table for this group.
bool DirectFits(const Channel& channel);

absl::Status RingAllReduce(Channel& channel, void* data, size_t count, DataType type,
                           ReduceOp op, ScratchBuffer& scratch);
absl::Status DirectAllReduce(Channel& channel, void* data, size_t count, DataType type,
                             ReduceOp op, ScratchBuffer& scratch);

// Rank r ends with the reduction of block r. `work` holds size() blocks.
absl::Status RingReduceScatter(Channel& channel, const void* input, void* output,
                               size_t count_per_rank, DataType type, ReduceOp op,
                               ScratchBuffer& scratch, ScratchBuffer& work);
absl::Status DirectReduceScatter(Channel& channel, const void* input, void* output,
                                 size_t count_per_rank, DataType type, ReduceOp op,
                                 ScratchBuffer& scratch);

// `output` already holds this rank's block at rank() * bytes_per_rank.
absl::Status RingAllGather(Channel& channel, void* output, size_t bytes_per_rank);
absl::Status DirectAllGather(Channel& channel, void* output, size_t bytes_per_rank);

// The algorithm a group without shared memory uses for each collective
// (UcxCommunicator's choice): direct when the exchanged bytes are at most
// kDirectMaxBytes and DirectFits, else the ring. Need size() >= 2 and a
// non-empty buffer; ReduceScatter's `input` and `output` may not overlap.
absl::Status ChannelAllReduce(Channel& channel, void* data, size_t count, DataType type,
                              ReduceOp op, ScratchBuffer& scratch);
absl::Status ChannelReduceScatter(Channel& channel, const void* input, void* output,
                                  size_t count_per_rank, DataType type, ReduceOp op,
                                  ScratchBuffer& scratch, ScratchBuffer& work);
// `output` already holds this rank's block at rank() * bytes_per_rank.
absl::Status ChannelAllGather(Channel& channel, void* output, size_t bytes_per_rank);

// Small: the root sends to every rank. Large: a pipelined chain from the root.
absl::Status Broadcast(Channel& channel, void* data, size_t bytes, int root);

// Dissemination barrier: ceil(log2 n) rounds of one-byte messages.
absl::Status DisseminationBarrier(Channel& channel);

}  // namespace cohort::comm

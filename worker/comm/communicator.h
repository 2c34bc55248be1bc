#pragma once
// Communicator: collective and point-to-point communication among the ranks
// of one group (a whole job, or one mesh axis: a tensor group, a data group,
// pipeline neighbours). Implementations: UcxCommunicator (host memory) and
// NcclCommunicator (device memory).
//
// Thread-safety: one collective or point-to-point call at a time per
// communicator, from any thread; Abort() may be called from any thread at
// any time.
//
// Errors, the same for every call:
//   InvalidArgument     bad arguments (peer or root out of range, null buffer
//                       with count > 0, unsupported type or op for the backend)
//   DeadlineExceeded    `timeout` passed before the call completed
//   Unavailable         a peer died or became unreachable during the call
//   Aborted             Abort() was called (before or during the call); every
//                       later call fails the same way
// After any error but InvalidArgument the communicator is unusable: the
// group's generation is over and a new communicator must be built.
//
// Results: every rank of an AllReduce gets bitwise identical results, and for
// a given group size the reduction order is fixed (the determinism contract),
// so repeated runs are bitwise reproducible.

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace cohort::comm {

// Bytes [begin, end) of a buffer.
struct ByteRange {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
};

enum class DataType { kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64, kUInt8 };
enum class ReduceOp { kSum, kMax };

size_t DataTypeSize(DataType type);
const char* DataTypeName(DataType type);

// The argument checks of the host communicators, InvalidArgument naming the
// call: a null buffer with a positive count, a type of no known size, a
// point-to-point peer out of range or this rank itself.
absl::Status CheckBuffer(const void* data, size_t count, const char* call);
absl::Status CheckDataType(DataType type);
absl::Status CheckPeer(int peer, int rank, int size, const char* call);
// A broadcast root: a rank of the group of `size`.
absl::Status CheckRoot(int root, int size, const char* call);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: `data` holds `count` elements on entry and their reduction over
  // all ranks on return.
  virtual absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                                 absl::Duration timeout) = 0;
  // `input` holds size() * count_per_rank elements; `output` receives the
  // reduction of block rank() (count_per_rank elements). May not overlap.
  virtual absl::Status ReduceScatter(const void* input, void* output, size_t count_per_rank,
                                     DataType type, ReduceOp op, absl::Duration timeout) = 0;
  // `input` holds count_per_rank elements; `output` receives size() blocks,
  // rank r's at offset r * count_per_rank. `input` may alias its own block.
  virtual absl::Status AllGather(const void* input, void* output, size_t count_per_rank,
                                 DataType type, absl::Duration timeout) = 0;
  // Root's `data` is copied to every rank's `data`.
  virtual absl::Status Broadcast(void* data, size_t count, DataType type, int root,
                                 absl::Duration timeout) = 0;
  // Point to point. Messages between a pair of ranks with the same tag arrive
  // in the order sent; different tags (and different communicators) never
  // match each other. Recv needs exactly `bytes` bytes (InvalidArgument for a
  // message of another size).
  virtual absl::Status Send(const void* data, size_t bytes, int peer, uint32_t tag,
                            absl::Duration timeout) = 0;
  virtual absl::Status Recv(void* data, size_t bytes, int peer, uint32_t tag,
                            absl::Duration timeout) = 0;
  // A Send to `send_peer` and a Recv from `recv_peer` (possibly the same
  // rank), both with `tag`, in flight together and complete when both are:
  // two ranks that each send to the other at once cannot deadlock (pipeline
  // stages handing activations forward while gradients come back).
  virtual absl::Status SendRecv(const void* send_data, size_t send_bytes, int send_peer,
                                void* recv_data, size_t recv_bytes, int recv_peer, uint32_t tag,
                                absl::Duration timeout) = 0;
  virtual absl::Status Barrier(absl::Duration timeout) = 0;

  // A reduce-scatter of float32 sums in an order the caller fixes, for sums
  // whose bits must not depend on the transport (the deterministic
  // reduction, worker/train/reduction_tree.h). `input` holds `count` floats
  // cut into size() blocks of `block` (the last ones may be short or empty);
  // rank r gets its block's reduction in `output` (the block's length),
  // which may be rank r's own block of `input` (in place). Per
  // element: value[q] = rank q's input; then value[into] += value[from] for
  // each (into, from) of `merges`, in order; the result is value[0]. Float
  // addition is commutative, so each merge has one possible result and the
  // bits do not depend on who adds. Unimplemented (before any communication:
  // the communicator stays usable) where the transport has no better way
  // than the caller's own point-to-point exchange; the default.
  virtual absl::Status ReduceScatterOrdered(const float* input, size_t count, size_t block,
                                            float* output,
                                            const std::vector<std::pair<int, int>>& merges,
                                            absl::Duration timeout) {
    return absl::UnimplementedError("ReduceScatterOrdered: no transport-specific path");
  }

  // An all-gather in place of byte ranges of any length: rank r's bytes
  // [ranges[r].begin, ranges[r].end) of `data` reach every rank's `data` at
  // the same offsets (disjoint ranges, size() of them; empty ones allowed).
  // Messages travel on `tag` (point-to-point tags of this communicator).
  // The default exchanges directly with every peer (size() - 1 rounds of
  // SendRecv); a communicator that knows a cheaper route overrides it.
  virtual absl::Status AllGatherRanges(void* data, const std::vector<ByteRange>& ranges,
                                       uint32_t tag, absl::Duration timeout);

  // Makes every in-flight and later call return Aborted (with `reason` in its
  // message) promptly. Idempotent.
  virtual void Abort(const absl::Status& reason) = 0;
};

}  // namespace cohort::comm

#pragma once
// ShmCollectives: AllReduce, ReduceScatter and AllGather for a group whose
// ranks all run on one host, through POSIX shared memory that each rank maps
// from every other (shm_segment.h). Used by UcxCommunicator for large
// messages instead of sending through UCX's shared-memory FIFOs, which copy
// every byte twice (into the FIFO, out of it) and cannot overlap the copies
// with the reduction.
//
// Algorithm. The buffer is cut into size() blocks (block j is reduced by
// rank j) and each block into pieces of at most `piece_bytes`; round k
// handles piece k of every block, in one of two staging slots (round k uses
// slot k % 2, so a rank can stage round k+1 while peers still read round k).
// In a round, rank r:
//   1. waits until every peer has finished reading its slot two rounds ago;
//   2. copies its input pieces of the other blocks into its slot (for an
//      AllGather: its own piece) and publishes `staged`;
//   3. (reduce) reduces its own piece: its input, then every peer's staged
//      copy in ascending rank order, into its output (and, for AllReduce,
//      into its slot for the others) and publishes `reduced`;
//   4. (gather) copies every peer's result piece out of that peer's slot into
//      its output, and publishes `consumed`.
// Each byte is copied once into shared memory and read once by the ranks
// that need it: no second copy, and the reduction reads staged data
// directly. Only the owner of a block reduces it and everyone else copies
// the owner's bits, so all ranks get bitwise identical results, and the
// reduction order is fixed by (size, rank) alone.
//
// Synchronisation: per-rank round counters in the owner's segment header,
// written with release and read with acquire; a waiter spins briefly, then
// sleeps on the counter with a futex in short slices, calling `check`
// (abort, deadline, peer liveness) between slices. A dead peer therefore
// turns into `check`'s error, never a hang.
//
// Segments are created in Create() and peers' segments opened at the first
// call (when every peer is known to have created its own, since it is in the
// same collective). Once every peer has mapped a segment its owner unlinks
// the name, so nothing is left in /dev/shm even if the process is later
// killed.
//
// Thread-compatible: one call at a time (the communicator's contract).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/comm/shm_segment.h"

namespace cohort::comm {

struct ShmCollectivesOptions {
  int rank = 0;
  int size = 1;
  // Segment name of every group rank, in group-rank order (ShmSegment::Name).
  std::vector<std::string> segment_names{};
  // Bytes of one block's piece per round: large enough to amortise the
  // round's synchronisation, small enough that a round's staging stays in
  // the cache shared by the cores.
  size_t piece_bytes = 256 * 1024;
};

class ShmCollectives {
 public:
  // Called while waiting on group rank `peer`: OK to go on waiting, or the
  // error that ends the call (abort, deadline, that peer dead).
  using Check = absl::FunctionRef<absl::Status(int peer)>;

  // Creates this rank's segment. Errors: InvalidArgument (options),
  // Internal (shared memory could not be created).
  static absl::StatusOr<std::unique_ptr<ShmCollectives>> Create(ShmCollectivesOptions options);
  ~ShmCollectives();

  // As Communicator's calls of the same name; `check` is polled while
  // waiting for peers and its error returned. After an error the object is
  // unusable (peers' counters no longer match).
  absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp op, Check check);
  absl::Status ReduceScatter(const void* input, void* output, size_t count_per_rank,
                             DataType type, ReduceOp op, Check check);
  // `output` already holds this rank's block (at rank() * count_per_rank).
  absl::Status AllGather(void* output, size_t count_per_rank, DataType type, Check check);
  // Communicator::ReduceScatterOrdered: step 3 adds the staged pieces in
  // the order of `merges` instead of ascending rank order, writing partial
  // sums into scratch pieces (never into a peer's slot).
  absl::Status ReduceScatterOrdered(const float* input, size_t count, size_t block,
                                    float* output, const std::vector<std::pair<int, int>>& merges,
                                    Check check);

 private:
  struct Peer;
  struct Plan;
  explicit ShmCollectives(ShmCollectivesOptions options);

  absl::Status Connect(Check check);
  absl::Status Run(const Plan& plan, Check check);
  // Step 3 of an ordered reduction for the round's piece at `offset`;
  // `wait_staged(peer)` waits until that peer has staged the round.
  absl::Status ReduceOrdered(const Plan& plan, uint32_t g, size_t offset, size_t length,
                             absl::FunctionRef<absl::Status(int)> wait_staged);
  uint8_t* SlotPiece(const Peer& peer, uint32_t round, int block) const;

  const ShmCollectivesOptions options_;
  const size_t slot_bytes_;
  const size_t segment_bytes_;
  const bool spin_;
  std::unique_ptr<ShmSegment> own_;
  std::vector<Peer> peers_;  // indexed by group rank; peers_[rank] is this rank
  bool connected_ = false;
  uint32_t round_ = 0;  // rounds completed by this rank, over all calls
  std::vector<std::vector<uint8_t>> merge_scratch_;  // partial sums of an ordered reduction
};

}  // namespace cohort::comm

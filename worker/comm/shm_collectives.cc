#include "worker/comm/shm_collectives.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "worker/comm/reduce.h"

namespace cohort::comm {
namespace {

// One counter per cache line, so a rank's writes to one counter do not
// invalidate the line a peer spins on for another.
struct alignas(64) SharedCounter {
  std::atomic<uint32_t> value;
};
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex word");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "address-free across processes");

// At the start of every segment. A zero-filled segment is the initial state.
struct SharedHeader {
  SharedCounter staged;    // rounds whose inputs this rank has staged
  SharedCounter reduced;   // rounds whose own piece this rank has reduced
  SharedCounter consumed;  // rounds in which this rank has read all peers' slots
  SharedCounter sleepers;  // waiters in futex_wait on this segment's counters
  SharedCounter attached;  // peers that have mapped this segment
};
constexpr size_t kHeaderBytes = 4096;
static_assert(sizeof(SharedHeader) <= kHeaderBytes);

// How long a waiter spins before sleeping (pause instructions: roughly
// 10-50 us on current x86 cores); sleeping (a futex wait and a wake syscall
// on the other side) costs a few microseconds, a round of 256 KiB pieces
// takes tens.
constexpr int kSpinIterations = 2000;
// Longest futex sleep between checks: bounds how long Abort() or a dead
// peer takes to be noticed.
constexpr long kSleepSliceNanos = 200 * 1000;

bool Reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected) {
  timespec slice{0, kSleepSliceNanos};
  // Shared (not FUTEX_PRIVATE) futex: the word lives in a mapping that
  // other processes share.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &slice, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

SharedHeader* HeaderOf(uint8_t* base) { return reinterpret_cast<SharedHeader*>(base); }

}  // namespace

struct ShmCollectives::Peer {
  std::unique_ptr<ShmSegment> segment;  // null for this rank (own_)
  SharedHeader* header = nullptr;
  uint8_t* slots = nullptr;
};

// Where each block's input and output live for one call.
struct ShmCollectives::Plan {
  DataType type = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  size_t element_bytes = 0;
  bool reduce = false;  // steps 2-3: stage other blocks, reduce the own block
  bool gather = false;  // step 4: copy every other block's result out
  const uint8_t* input = nullptr;
  size_t input_stride = 0;  // bytes between blocks; 0: input holds the own block only
  uint8_t* output = nullptr;
  size_t output_stride = 0;  // bytes between blocks; 0: output holds the own block only
  size_t block_elements = 0;
  size_t total_elements = 0;
  // Step 3's order, when given (ReduceScatterOrdered).
  const std::vector<std::pair<int, int>>* merges = nullptr;

  size_t BlockLength(int block) const {
    const size_t begin = std::min(total_elements, block_elements * static_cast<size_t>(block));
    return std::min(block_elements, total_elements - begin);
  }
  const uint8_t* Input(int block) const {
    return input + (input_stride == 0 ? 0 : input_stride * static_cast<size_t>(block));
  }
  uint8_t* Output(int block) const {
    return output + (output_stride == 0 ? 0 : output_stride * static_cast<size_t>(block));
  }
};

namespace {

class Waiter {
 public:
  Waiter(bool spin, ShmCollectives::Check check) : spin_(spin), check_(check) {}

  // Waits until group rank `peer`'s `counter` (in its header `owner`)
  // reaches `target`.
  absl::Status Wait(int peer, SharedHeader* owner, SharedCounter& counter, uint32_t target) {
    if (Reached(counter.value.load(std::memory_order_acquire), target)) return absl::OkStatus();
    if (spin_) {
      // Counted, not timed: reading the clock can be a system call (it is
      // under some hypervisors), which would cost more than the wait.
      for (int i = 0; i < kSpinIterations; ++i) {
        if (Reached(counter.value.load(std::memory_order_acquire), target)) {
          return absl::OkStatus();
        }
        CpuRelax();
      }
    }
    for (;;) {
      RETURN_IF_ERROR(check_(peer));
      owner->sleepers.value.fetch_add(1, std::memory_order_seq_cst);
      const uint32_t seen = counter.value.load(std::memory_order_seq_cst);
      if (!Reached(seen, target)) FutexWait(&counter.value, seen);
      owner->sleepers.value.fetch_sub(1, std::memory_order_seq_cst);
      if (Reached(counter.value.load(std::memory_order_acquire), target)) return absl::OkStatus();
    }
  }

 private:
  const bool spin_;
  ShmCollectives::Check check_;
};

// Sets this rank's `counter` and wakes sleepers. seq_cst on both sides (the
// waiter raises `sleepers`, then reads the counter) so a waiter either sees
// the new value or is woken.
void Publish(SharedHeader* own, SharedCounter& counter, uint32_t value) {
  counter.value.store(value, std::memory_order_seq_cst);
  if (own->sleepers.value.load(std::memory_order_seq_cst) != 0) FutexWakeAll(&counter.value);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmCollectives>> ShmCollectives::Create(
    ShmCollectivesOptions options) {
  if (options.size < 2 || options.rank < 0 || options.rank >= options.size ||
      options.segment_names.size() != static_cast<size_t>(options.size)) {
    return absl::InvalidArgumentError(absl::StrCat("shm collectives: rank ", options.rank,
                                                   " of ", options.size, " with ",
                                                   options.segment_names.size(), " names"));
  }
  // Whole cache lines, and a multiple of every element size.
  options.piece_bytes = std::max<size_t>(64, options.piece_bytes / 64 * 64);
  RemoveStaleSegments();
  std::unique_ptr<ShmCollectives> self(new ShmCollectives(std::move(options)));
  ASSIGN_OR_RETURN(self->own_, ShmSegment::Create(self->options_.segment_names[self->options_.rank],
                                                 self->segment_bytes_));
  Peer& own = self->peers_[self->options_.rank];
  own.header = HeaderOf(self->own_->data());
  own.slots = self->own_->data() + kHeaderBytes;
  return self;
}

ShmCollectives::ShmCollectives(ShmCollectivesOptions options)
    : options_(std::move(options)),
      slot_bytes_(options_.piece_bytes * static_cast<size_t>(options_.size)),
      segment_bytes_(kHeaderBytes + 2 * slot_bytes_),
      // Spinning only pays when every rank can have a core; asked once, as
      // it costs system calls.
      spin_(static_cast<unsigned>(options_.size) <= std::thread::hardware_concurrency()),
      peers_(static_cast<size_t>(options_.size)) {}

ShmCollectives::~ShmCollectives() = default;

uint8_t* ShmCollectives::SlotPiece(const Peer& peer, uint32_t round, int block) const {
  return peer.slots + (round & 1) * slot_bytes_ + static_cast<size_t>(block) * options_.piece_bytes;
}

absl::Status ShmCollectives::Connect(Check check) {
  for (int p = 0; p < options_.size; ++p) {
    if (p == options_.rank || peers_[p].segment != nullptr) continue;
    for (;;) {
      absl::StatusOr<std::unique_ptr<ShmSegment>> segment =
          ShmSegment::Open(options_.segment_names[p], segment_bytes_);
      if (segment.ok()) {
        peers_[p].segment = std::move(*segment);
        break;
      }
      if (!absl::IsNotFound(segment.status())) return segment.status();
      // The peer is in this call, so its communicator exists; its segment
      // appears within moments. `check` bounds the wait.
      RETURN_IF_ERROR(check(p));
      absl::SleepFor(absl::Microseconds(50));
    }
    peers_[p].header = HeaderOf(peers_[p].segment->data());
    peers_[p].slots = peers_[p].segment->data() + kHeaderBytes;
    peers_[p].header->attached.value.fetch_add(1, std::memory_order_acq_rel);
  }
  connected_ = true;
  return absl::OkStatus();
}

absl::Status ShmCollectives::Run(const Plan& plan, Check check) {
  if (!connected_) RETURN_IF_ERROR(Connect(check));
  const int rank = options_.rank;
  const int size = options_.size;
  Peer& own = peers_[rank];
  Waiter waiter(spin_, check);
  const size_t piece_elements = options_.piece_bytes / plan.element_bytes;
  const size_t rounds = (plan.block_elements + piece_elements - 1) / piece_elements;
  auto piece_length = [&](int block, size_t begin) {
    const size_t length = plan.BlockLength(block);
    return begin >= length ? size_t{0} : std::min(piece_elements, length - begin);
  };
  for (size_t k = 0; k < rounds; ++k) {
    const uint32_t g = round_;
    const size_t begin = k * piece_elements;
    const size_t offset = begin * plan.element_bytes;
    // 1. Slot g % 2 was last read by peers in round g - 2.
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      RETURN_IF_ERROR(waiter.Wait(p, peers_[p].header, peers_[p].header->consumed, g - 1));
    }
    // 2. Stage what the peers need from this rank.
    if (plan.reduce) {
      for (int j = 0; j < size; ++j) {
        if (j == rank) continue;
        std::memcpy(SlotPiece(own, g, j), plan.Input(j) + offset,
                    piece_length(j, begin) * plan.element_bytes);
      }
    } else {
      std::memcpy(SlotPiece(own, g, rank), plan.Input(rank) + offset,
                  piece_length(rank, begin) * plan.element_bytes);
    }
    Publish(own.header, own.header->staged, g + 1);
    // 3. Reduce the own piece: in the caller's order, or own input, then
    // peers in ascending rank order.
    if (plan.reduce && plan.merges != nullptr) {
      RETURN_IF_ERROR(ReduceOrdered(plan, g, offset, piece_length(rank, begin), [&](int peer) {
        return waiter.Wait(peer, peers_[peer].header, peers_[peer].header->staged, g + 1);
      }));
    } else if (plan.reduce) {
      const size_t length = piece_length(rank, begin);
      uint8_t* out = plan.Output(rank) + offset;
      const uint8_t* accumulated = plan.Input(rank) + offset;
      for (int p = 0; p < size; ++p) {
        if (p == rank) continue;
        RETURN_IF_ERROR(waiter.Wait(p, peers_[p].header, peers_[p].header->staged, g + 1));
        ReduceInto(plan.type, plan.op, accumulated, SlotPiece(peers_[p], g, rank), out, length);
        accumulated = out;
      }
      if (plan.gather) {
        std::memcpy(SlotPiece(own, g, rank), out, length * plan.element_bytes);
        Publish(own.header, own.header->reduced, g + 1);
      }
    }
    // 4. Copy every peer's result piece out of its slot.
    if (plan.gather) {
      for (int p = 0; p < size; ++p) {
        if (p == rank) continue;
        SharedCounter& ready = plan.reduce ? peers_[p].header->reduced : peers_[p].header->staged;
        RETURN_IF_ERROR(waiter.Wait(p, peers_[p].header, ready, g + 1));
        std::memcpy(plan.Output(p) + offset, SlotPiece(peers_[p], g, p),
                    piece_length(p, begin) * plan.element_bytes);
      }
    }
    Publish(own.header, own.header->consumed, g + 1);
    ++round_;
  }
  // Every peer has mapped this segment: drop its name so a crash later
  // leaves nothing behind in /dev/shm.
  if (own.header->attached.value.load(std::memory_order_acquire) ==
      static_cast<uint32_t>(size - 1)) {
    own_->Unlink();
  }
  return absl::OkStatus();
}

absl::Status ShmCollectives::ReduceOrdered(const Plan& plan, uint32_t g, size_t offset,
                                           size_t length,
                                           absl::FunctionRef<absl::Status(int)> wait_staged) {
  const int rank = options_.rank;
  const size_t size = static_cast<size_t>(options_.size);
  const size_t bytes = length * plan.element_bytes;
  // Rank q's value is its piece, read in place (own input, or q's staged
  // slot) until a merge writes it; then owned[q], one of the scratch pieces.
  std::vector<uint8_t*> owned(size, nullptr);
  std::vector<bool> staged(size, false);
  if (merge_scratch_.size() < size) merge_scratch_.resize(size);
  std::vector<int> free_scratch;
  for (int i = static_cast<int>(size) - 1; i >= 0; --i) free_scratch.push_back(i);
  std::vector<int> scratch_of(size, -1);
  auto read = [&](int q) -> absl::StatusOr<const uint8_t*> {
    if (owned[q] != nullptr) return owned[q];
    if (q == rank) return plan.Input(rank) + offset;
    if (!staged[q]) {
      RETURN_IF_ERROR(wait_staged(q));
      staged[q] = true;
    }
    return SlotPiece(peers_[q], g, rank);
  };
  for (const auto& [into, from] : *plan.merges) {
    ASSIGN_OR_RETURN(const uint8_t* a, read(into));
    ASSIGN_OR_RETURN(const uint8_t* b, read(from));
    if (owned[into] == nullptr) {
      const int k = free_scratch.back();
      free_scratch.pop_back();
      std::vector<uint8_t>& piece = merge_scratch_[k];
      if (piece.size() < options_.piece_bytes) piece.resize(options_.piece_bytes);
      owned[into] = piece.data();
      scratch_of[into] = k;
    }
    ReduceInto(plan.type, ReduceOp::kSum, a, b, owned[into], length);
    if (owned[from] != nullptr) {
      free_scratch.push_back(scratch_of[from]);
      owned[from] = nullptr;
    }
  }
  ASSIGN_OR_RETURN(const uint8_t* root, read(0));
  std::memcpy(plan.Output(rank) + offset, root, bytes);
  return absl::OkStatus();
}

absl::Status ShmCollectives::ReduceScatterOrdered(const float* input, size_t count, size_t block,
                                                  float* output,
                                                  const std::vector<std::pair<int, int>>& merges,
                                                  Check check) {
  Plan plan;
  plan.type = DataType::kFloat32;
  plan.op = ReduceOp::kSum;
  plan.element_bytes = sizeof(float);
  plan.reduce = true;
  plan.total_elements = count;
  plan.block_elements = block;
  plan.input = reinterpret_cast<const uint8_t*>(input);
  plan.input_stride = block * sizeof(float);
  plan.output = reinterpret_cast<uint8_t*>(output);
  plan.output_stride = 0;
  plan.merges = &merges;
  return Run(plan, check);
}

absl::Status ShmCollectives::AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                                       Check check) {
  Plan plan;
  plan.type = type;
  plan.op = op;
  plan.element_bytes = DataTypeSize(type);
  plan.reduce = true;
  plan.gather = true;
  plan.total_elements = count;
  plan.block_elements = (count + options_.size - 1) / options_.size;
  plan.input = static_cast<const uint8_t*>(data);
  plan.input_stride = plan.block_elements * plan.element_bytes;
  plan.output = static_cast<uint8_t*>(data);
  plan.output_stride = plan.input_stride;
  return Run(plan, check);
}

absl::Status ShmCollectives::ReduceScatter(const void* input, void* output, size_t count_per_rank,
                                           DataType type, ReduceOp op, Check check) {
  Plan plan;
  plan.type = type;
  plan.op = op;
  plan.element_bytes = DataTypeSize(type);
  plan.reduce = true;
  plan.total_elements = count_per_rank * static_cast<size_t>(options_.size);
  plan.block_elements = count_per_rank;
  plan.input = static_cast<const uint8_t*>(input);
  plan.input_stride = count_per_rank * plan.element_bytes;
  // Only the own block is written: Output(rank) is `output` itself.
  plan.output = static_cast<uint8_t*>(output);
  plan.output_stride = 0;
  return Run(plan, check);
}

absl::Status ShmCollectives::AllGather(void* output, size_t count_per_rank, DataType type,
                                       Check check) {
  Plan plan;
  plan.type = type;
  plan.element_bytes = DataTypeSize(type);
  plan.gather = true;
  plan.total_elements = count_per_rank * static_cast<size_t>(options_.size);
  plan.block_elements = count_per_rank;
  plan.output = static_cast<uint8_t*>(output);
  plan.output_stride = count_per_rank * plan.element_bytes;
  plan.input = plan.output;
  plan.input_stride = plan.output_stride;
  return Run(plan, check);
}

}  // namespace cohort::comm

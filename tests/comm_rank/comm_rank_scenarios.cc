#include "tests/comm_rank/comm_rank_scenarios.h"

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/comm/hierarchical_communicator.h"
#include "worker/comm/reduce.h"
#include "worker/comm/ucx_communicator.h"
#include "worker/comm/ucx_context.h"

namespace cohort::comm_rank {
namespace {

using comm::Communicator;
using comm::DataType;
using comm::ReduceOp;
using comm::UcxCommunicator;
using comm::UcxContext;

// Every rank can compute every rank's input: element i of rank r's input
// for test `salt` is a hash of (seed, r, salt, i).
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t Draw(const RankConfig& c, int rank, uint64_t salt, size_t i) {
  return Mix(c.seed * 0x100000001b3ull ^ Mix(static_cast<uint64_t>(rank) * 1000003u + salt) ^
             (static_cast<uint64_t>(i) * 0x2545f4914f6cdd1dull));
}

// Uniform in [-1, 1).
float Uniform(const RankConfig& c, int rank, uint64_t salt, size_t i) {
  return static_cast<float>(Draw(c, rank, salt, i) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

uint64_t Fnv(const void* data, size_t bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

int Fail(const absl::Status& status, const std::string& what) {
  std::fprintf(stderr, "COMM_ERROR %s: %s\n", what.c_str(), status.ToString().c_str());
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) return kCommError;
  return kOtherError;
}

int Mismatch(const std::string& what) {
  std::fprintf(stderr, "MISMATCH %s\n", what.c_str());
  return kMismatch;
}

#define RUN_OR_FAIL(expr, what)                  \
  do {                                           \
    absl::Status status_ = (expr);               \
    if (!status_.ok()) return Fail(status_, what); \
  } while (false)

#define CHECK_STEP(expr)      \
  do {                        \
    int code_ = (expr);       \
    if (code_ != kOk) return code_; \
  } while (false)

struct Session {
  std::unique_ptr<comm::KvClient> kv;
  comm::UcxContextOptions options;  // how `context` was made (kv: the one above)
  std::unique_ptr<UcxContext> context;
  std::unique_ptr<UcxCommunicator> world;
};

absl::StatusOr<Session> Connect(const RankConfig& c, uint64_t generation) {
  Session session;
  if (c.size > 1) {
    session.kv = comm::NewCoordinatorKvClient(CoordinatorTarget::Insecure(c.kv_target),
                                              comm::KvScopeRef{c.job, generation});
  }
  comm::UcxContextOptions& options = session.options;
  options.rank = c.rank;
  options.size = c.size;
  options.kv = session.kv.get();
  options.bootstrap_timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<UcxContext>> context = UcxContext::Create(options);
  if (!context.ok()) return context.status();
  session.context = std::move(*context);
  absl::StatusOr<std::unique_ptr<UcxCommunicator>> world =
      UcxCommunicator::Create(session.context.get(), comm::UcxCommunicatorOptions{.comm_id = 1});
  if (!world.ok()) return world.status();
  session.world = std::move(*world);
  return session;
}

class Checker {
 public:
  Checker(const RankConfig& config, Communicator* comm)
      : c_(config), comm_(comm), timeout_(absl::Milliseconds(config.timeout_ms)) {}

  // Every rank must hold the same bits: gather a hash from each and compare.
  int SameEverywhere(const void* data, size_t bytes, const std::string& what) {
    const int64_t mine = static_cast<int64_t>(Fnv(data, bytes));
    std::vector<int64_t> all(static_cast<size_t>(c_.size));
    RUN_OR_FAIL(comm_->AllGather(&mine, all.data(), 1, DataType::kInt64, timeout_),
                what + " hash allgather");
    for (int r = 0; r < c_.size; ++r) {
      if (all[r] != mine) return Mismatch(absl::StrCat(what, ": rank ", r, " has other bits"));
    }
    return kOk;
  }

  int AllReduceFloat(size_t count, ReduceOp op, uint64_t salt, bool timed) {
    const std::string what = absl::StrCat("allreduce float32 ",
                                          op == ReduceOp::kSum ? "sum" : "max", " n=", count);
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = Uniform(c_, c_.rank, salt, i);
    const absl::Time start = absl::Now();
    RUN_OR_FAIL(comm_->AllReduce(data.data(), count, DataType::kFloat32, op, timeout_), what);
    const absl::Duration took = absl::Now() - start;
    for (size_t i = 0; i < count; ++i) {
      double reference = op == ReduceOp::kSum ? 0.0 : -INFINITY;
      double magnitude = 0.0;
      for (int r = 0; r < c_.size; ++r) {
        const float x = Uniform(c_, r, salt, i);
        reference = op == ReduceOp::kSum ? reference + x : std::max<double>(reference, x);
        magnitude += std::fabs(x);
      }
      const double bound = op == ReduceOp::kSum ? c_.size * FLT_EPSILON * magnitude : 0.0;
      if (std::fabs(data[i] - reference) > bound) {
        return Mismatch(absl::StrCat(what, " element ", i, ": got ", data[i], " want ", reference,
                                     " bound ", bound));
      }
    }
    CHECK_STEP(SameEverywhere(data.data(), count * sizeof(float), what));
    if (timed && c_.size > 1) {
      // A few more timed rounds on the same buffer for a bandwidth figure.
      constexpr int kRounds = 3;
      const absl::Time t0 = absl::Now();
      for (int i = 0; i < kRounds; ++i) {
        RUN_OR_FAIL(comm_->AllReduce(data.data(), count, DataType::kFloat32, op, timeout_), what);
      }
      const double seconds = absl::ToDoubleSeconds(absl::Now() - t0) / kRounds;
      const double algbw = static_cast<double>(count * sizeof(float)) / seconds / 1e9;
      std::fprintf(stderr,
                   "BANDWIDTH rank %d %s: first %.1f ms, steady %.1f ms, algbw %.2f GB/s, "
                   "busbw %.2f GB/s\n",
                   c_.rank, what.c_str(), absl::ToDoubleMilliseconds(took), seconds * 1e3, algbw,
                   algbw * 2.0 * (c_.size - 1) / c_.size);
    }
    return kOk;
  }

  // bf16 / fp16: inputs are exactly representable; each ring step rounds.
  int AllReduceHalf(size_t count, DataType type, ReduceOp op, uint64_t salt) {
    const bool bf16 = type == DataType::kBFloat16;
    const std::string what = absl::StrCat("allreduce ", comm::DataTypeName(type),
                                          op == ReduceOp::kSum ? " sum" : " max", " n=", count);
    auto to_half = [&](float x) { return bf16 ? comm::FloatToBFloat16(x) : comm::FloatToHalf(x); };
    auto to_float = [&](uint16_t h) {
      return bf16 ? comm::BFloat16ToFloat(h) : comm::HalfToFloat(h);
    };
    std::vector<uint16_t> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = to_half(Uniform(c_, c_.rank, salt, i));
    RUN_OR_FAIL(comm_->AllReduce(data.data(), count, type, op, timeout_), what);
    const double unit = bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    for (size_t i = 0; i < count; ++i) {
      double reference = op == ReduceOp::kSum ? 0.0 : -INFINITY;
      double magnitude = 0.0;
      for (int r = 0; r < c_.size; ++r) {
        const double x = to_float(to_half(Uniform(c_, r, salt, i)));
        reference = op == ReduceOp::kSum ? reference + x : std::max(reference, x);
        magnitude += std::fabs(x);
      }
      const double bound =
          op == ReduceOp::kSum ? c_.size * unit * magnitude + c_.size * std::ldexp(1.0, -24) : 0;
      if (std::fabs(to_float(data[i]) - reference) > bound) {
        return Mismatch(absl::StrCat(what, " element ", i, ": got ", to_float(data[i]), " want ",
                                     reference));
      }
    }
    return SameEverywhere(data.data(), count * 2, what);
  }

  template <typename T>
  int AllReduceInt(size_t count, DataType type, ReduceOp op, uint64_t salt) {
    const std::string what = absl::StrCat("allreduce ", comm::DataTypeName(type),
                                          op == ReduceOp::kSum ? " sum" : " max", " n=", count);
    auto value = [&](int r, size_t i) { return static_cast<T>(Draw(c_, r, salt, i)); };
    std::vector<T> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = value(c_.rank, i);
    RUN_OR_FAIL(comm_->AllReduce(data.data(), count, type, op, timeout_), what);
    for (size_t i = 0; i < count; ++i) {
      // Sums wrap: compute them in the unsigned type of the same width.
      using U = std::make_unsigned_t<T>;
      U sum = 0;
      T max = value(0, i);
      for (int r = 0; r < c_.size; ++r) {
        sum = static_cast<U>(sum + static_cast<U>(value(r, i)));
        max = std::max(max, value(r, i));
      }
      const T want = op == ReduceOp::kSum ? static_cast<T>(sum) : max;
      if (data[i] != want) return Mismatch(absl::StrCat(what, " element ", i));
    }
    return kOk;
  }

  int ReduceScatter(size_t per_rank, uint64_t salt) {
    const std::string what = absl::StrCat("reduce_scatter float32 sum per_rank=", per_rank);
    const size_t n = static_cast<size_t>(c_.size);
    std::vector<float> input(per_rank * n);
    for (size_t i = 0; i < input.size(); ++i) input[i] = Uniform(c_, c_.rank, salt, i);
    std::vector<float> output(per_rank);
    RUN_OR_FAIL(comm_->ReduceScatter(input.data(), output.data(), per_rank, DataType::kFloat32,
                                     ReduceOp::kSum, timeout_),
                what);
    for (size_t j = 0; j < per_rank; ++j) {
      const size_t i = static_cast<size_t>(c_.rank) * per_rank + j;
      double reference = 0, magnitude = 0;
      for (int r = 0; r < c_.size; ++r) {
        reference += Uniform(c_, r, salt, i);
        magnitude += std::fabs(Uniform(c_, r, salt, i));
      }
      if (std::fabs(output[j] - reference) > c_.size * FLT_EPSILON * magnitude) {
        return Mismatch(absl::StrCat(what, " element ", j));
      }
    }
    return kOk;
  }

  int AllGather(size_t per_rank, uint64_t salt) {
    const std::string what = absl::StrCat("allgather per_rank=", per_rank);
    std::vector<float> input(per_rank);
    for (size_t i = 0; i < per_rank; ++i) input[i] = Uniform(c_, c_.rank, salt, i);
    std::vector<float> output(per_rank * static_cast<size_t>(c_.size));
    RUN_OR_FAIL(
        comm_->AllGather(input.data(), output.data(), per_rank, DataType::kFloat32, timeout_),
        what);
    for (int r = 0; r < c_.size; ++r) {
      for (size_t i = 0; i < per_rank; ++i) {
        if (output[r * per_rank + i] != Uniform(c_, r, salt, i)) {
          return Mismatch(absl::StrCat(what, " block ", r, " element ", i));
        }
      }
    }
    // In place: the input is this rank's own block of the output (as ZeRO-1
    // gathers its updated shards).
    std::vector<float> gathered(output.size(), NAN);
    float* own = gathered.data() + static_cast<size_t>(c_.rank) * per_rank;
    std::copy(input.begin(), input.end(), own);
    RUN_OR_FAIL(comm_->AllGather(own, gathered.data(), per_rank, DataType::kFloat32, timeout_),
                what + " in place");
    if (std::memcmp(gathered.data(), output.data(), output.size() * sizeof(float)) != 0) {
      return Mismatch(what + " in place: other bits than into a separate output");
    }
    return kOk;
  }

  // A float sum in the order `merges` fixes, bitwise against that order
  // applied here (order "adjacent" folds neighbours first, "strided" folds
  // ranks `stride` apart first: the host-by-host order when rank r runs on
  // host r % stride). Logs whether the transport ran it or left it to the
  // caller (Unimplemented, which the caller then does point to point).
  int ReduceScatterOrdered(size_t count, const std::string& order, uint64_t salt) {
    const std::string what = absl::StrCat("ordered reduce-scatter ", order, " n=", count);
    const int n = c_.size;
    std::vector<std::pair<int, int>> merges;
    if (order == "adjacent") {
      for (int step = 1; step < n; step *= 2) {
        for (int i = 0; i + step < n; i += 2 * step) merges.emplace_back(i, i + step);
      }
    } else {
      const int stride = c_.stride;
      for (int p = 0; p < stride && p < n; ++p) {
        for (int i = p + stride; i < n; i += stride) merges.emplace_back(p, i);
      }
      for (int p = 1; p < stride && p < n; ++p) merges.emplace_back(0, p);
    }
    const size_t block = (count + static_cast<size_t>(n) - 1) / static_cast<size_t>(n);
    std::vector<float> input(count);
    for (size_t i = 0; i < count; ++i) input[i] = Uniform(c_, c_.rank, salt, i);
    const size_t begin = std::min(count, block * static_cast<size_t>(c_.rank));
    const size_t end = std::min(count, begin + block);
    std::vector<float> output(end - begin, NAN);
    const absl::Status status = comm_->ReduceScatterOrdered(input.data(), count, block,
                                                            output.data(), merges, timeout_);
    if (absl::IsUnimplemented(status)) {
      std::fprintf(stderr, "rank %d: %s: left to the caller\n", c_.rank, what.c_str());
      return kOk;
    }
    RUN_OR_FAIL(status, what);
    std::vector<float> value(static_cast<size_t>(n));
    for (size_t i = begin; i < end; ++i) {
      for (int r = 0; r < n; ++r) value[r] = Uniform(c_, r, salt, i);
      for (const auto& [into, from] : merges) value[into] += value[from];
      if (std::memcmp(&output[i - begin], &value[0], sizeof(float)) != 0) {
        return Mismatch(absl::StrCat(what, " element ", i, ": got ", output[i - begin], " want ",
                                     value[0], " (bits differ)"));
      }
    }
    // In place: the output is this rank's own block of the input (as the
    // data-parallel gradient reduction calls it).
    RUN_OR_FAIL(comm_->ReduceScatterOrdered(input.data(), count, block, input.data() + begin,
                                            merges, timeout_),
                what + " in place");
    if (std::memcmp(input.data() + begin, output.data(), output.size() * sizeof(float)) != 0) {
      return Mismatch(what + " in place: other bits than into a separate output");
    }
    std::fprintf(stderr, "rank %d: %s: exact\n", c_.rank, what.c_str());
    return kOk;
  }

  // Ranges of uneven lengths (rank r's is count + 5 r floats, a gap of 3
  // after each), gathered in place.
  int AllGatherRanges(size_t count, uint64_t salt) {
    const std::string what = absl::StrCat("allgather ranges n=", count);
    std::vector<comm::ByteRange> ranges;
    size_t at = 0;
    for (int r = 0; r < c_.size; ++r) {
      const size_t floats = count + 5 * static_cast<size_t>(r);
      ranges.push_back({at * sizeof(float), (at + floats) * sizeof(float)});
      at += floats + 3;
    }
    std::vector<float> data(at, -1.0f);
    const comm::ByteRange& own = ranges[c_.rank];
    for (size_t i = 0; i < own.size() / sizeof(float); ++i) {
      data[own.begin / sizeof(float) + i] = Uniform(c_, c_.rank, salt, i);
    }
    RUN_OR_FAIL(comm_->AllGatherRanges(data.data(), ranges, /*tag=*/7, timeout_), what);
    size_t next = 0;
    for (int r = 0; r < c_.size; ++r) {
      const size_t first = ranges[r].begin / sizeof(float);
      const size_t last = ranges[r].end / sizeof(float);
      for (size_t i = next; i < first; ++i) {
        if (data[i] != -1.0f) return Mismatch(absl::StrCat(what, " gap element ", i, " written"));
      }
      for (size_t i = first; i < last; ++i) {
        if (data[i] != Uniform(c_, r, salt, i - first)) {
          return Mismatch(absl::StrCat(what, " rank ", r, " element ", i - first));
        }
      }
      next = last;
    }
    return kOk;
  }

  int Broadcast(size_t count, uint64_t salt) {
    const int root = static_cast<int>(count % static_cast<size_t>(c_.size));
    const std::string what = absl::StrCat("broadcast n=", count, " root=", root);
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = Uniform(c_, c_.rank, salt, i);
    RUN_OR_FAIL(comm_->Broadcast(data.data(), count, DataType::kFloat32, root, timeout_), what);
    for (size_t i = 0; i < count; ++i) {
      if (data[i] != Uniform(c_, root, salt, i)) {
        return Mismatch(absl::StrCat(what, " element ", i));
      }
    }
    return kOk;
  }

 private:
  const RankConfig& c_;
  Communicator* comm_;
  const absl::Duration timeout_;
};

// For --algorithm other than flat: a HierarchicalCommunicator (or the flat
// one it falls back to) over the session's context in `*out`, its choice
// logged. False, with the reason logged, when it cannot be made.
bool ChooseAlgorithm(const RankConfig& config, Session* session,
                     std::unique_ptr<Communicator>* out) {
  if (config.algorithm == "flat") return true;
  absl::StatusOr<comm::CollectiveAlgorithm> algorithm =
      comm::ParseCollectiveAlgorithm(config.algorithm);
  if (!algorithm.ok()) {
    Fail(algorithm.status(), "--algorithm");
    return false;
  }
  absl::StatusOr<std::unique_ptr<Communicator>> made = comm::HierarchicalCommunicator::Create(
      session->context.get(), comm::UcxCommunicatorOptions{.comm_id = 2}, 3, 4, *algorithm,
      session->options);
  if (!made.ok()) {
    Fail(made.status(), "hierarchical communicator");
    return false;
  }
  *out = std::move(*made);
  const auto* split = dynamic_cast<const comm::HierarchicalCommunicator*>(out->get());
  std::fprintf(stderr, "rank %d: %s collectives over %d hosts\n", config.rank,
               split != nullptr ? "hierarchical" : "flat", split != nullptr ? split->hosts() : 1);
  return true;
}

}  // namespace

int RunCollectives(const RankConfig& config) {
  absl::StatusOr<Session> session = Connect(config, config.generation);
  if (!session.ok()) {
    Fail(session.status(), "setup");
    return kSetupFailed;
  }
  std::fprintf(stderr, "rank %d: ring position %d\n", config.rank, session->world->ring_position());
  // The checks run on the world, or on a hierarchical communicator over it
  // (its own ids; the world still carries the checker's hash exchanges).
  std::unique_ptr<Communicator> hierarchical;
  if (!ChooseAlgorithm(config, &*session, &hierarchical)) return kSetupFailed;
  Communicator* checked = hierarchical != nullptr ? hierarchical.get() : session->world.get();
  Checker check(config, checked);
  const size_t kMedium = (size_t{1} << 20) + 3;
  std::vector<size_t> sizes = {0, 1, 7, 1023};
  // The medium size: 1 Mi + 3, or max_elements when that is smaller (and
  // still above the small ones), so a test can bound its time.
  if (config.max_elements > 1023) sizes.push_back(std::min(kMedium, config.max_elements));
  if (config.max_elements > kMedium) sizes.push_back(config.max_elements);
  uint64_t salt = 0;
  for (size_t count : sizes) {
    const bool large = count > kMedium;
    CHECK_STEP(check.AllReduceFloat(count, ReduceOp::kSum, ++salt, /*timed=*/large));
    if (large) continue;  // the largest size: float sum only, to bound test time
    CHECK_STEP(check.AllReduceFloat(count, ReduceOp::kMax, ++salt, false));
    CHECK_STEP(check.AllReduceHalf(count, DataType::kBFloat16, ReduceOp::kSum, ++salt));
    CHECK_STEP(check.AllReduceHalf(count, DataType::kFloat16, ReduceOp::kSum, ++salt));
    CHECK_STEP(check.AllReduceHalf(count, DataType::kBFloat16, ReduceOp::kMax, ++salt));
    CHECK_STEP(check.AllReduceInt<int32_t>(count, DataType::kInt32, ReduceOp::kSum, ++salt));
    CHECK_STEP(check.AllReduceInt<int64_t>(count, DataType::kInt64, ReduceOp::kSum, ++salt));
    CHECK_STEP(check.AllReduceInt<int64_t>(count, DataType::kInt64, ReduceOp::kMax, ++salt));
    CHECK_STEP(check.AllReduceInt<uint8_t>(count, DataType::kUInt8, ReduceOp::kSum, ++salt));
    CHECK_STEP(check.ReduceScatter(count, ++salt));
    CHECK_STEP(check.AllGather(count, ++salt));
    CHECK_STEP(check.ReduceScatterOrdered(count, "adjacent", ++salt));
    CHECK_STEP(check.ReduceScatterOrdered(count, "strided", ++salt));
    CHECK_STEP(check.AllGatherRanges(count, ++salt));
    CHECK_STEP(check.Broadcast(count, ++salt));
  }
  RUN_OR_FAIL(session->world->Barrier(absl::Milliseconds(config.timeout_ms)), "barrier");
  std::fprintf(stderr, "rank %d: collectives ok\n", config.rank);
  return kOk;
}

int RunPointToPoint(const RankConfig& config) {
  absl::StatusOr<Session> session = Connect(config, config.generation);
  if (!session.ok()) {
    Fail(session.status(), "setup");
    return kSetupFailed;
  }
  // A second group over the same context: the world in reverse rank order.
  comm::UcxCommunicatorOptions reversed_options{.comm_id = 2};
  for (int r = config.size - 1; r >= 0; --r) reversed_options.group.push_back(r);
  absl::StatusOr<std::unique_ptr<UcxCommunicator>> reversed =
      UcxCommunicator::Create(session->context.get(), reversed_options);
  if (!reversed.ok()) {
    Fail(reversed.status(), "second communicator");
    return kSetupFailed;
  }
  UcxCommunicator& a = *session->world;
  UcxCommunicator& b = **reversed;
  const absl::Duration timeout = absl::Milliseconds(config.timeout_ms);
  const int partner = config.rank ^ 1;
  if (partner < config.size) {
    // Ordering: 200 messages with one tag, sizes varying, arrive in order.
    constexpr int kMessages = 200;
    constexpr uint32_t kTag = 7;
    for (int i = 0; i < kMessages; ++i) {
      std::vector<uint32_t> message(static_cast<size_t>(1 + i % 5), static_cast<uint32_t>(i));
      if (config.rank % 2 == 0) {
        RUN_OR_FAIL(a.Send(message.data(), message.size() * 4, partner, kTag, timeout), "send");
      } else {
        std::vector<uint32_t> got(message.size(), ~0u);
        RUN_OR_FAIL(a.Recv(got.data(), got.size() * 4, partner, kTag, timeout), "recv");
        if (got != message) return Mismatch(absl::StrCat("message ", i, " out of order"));
      }
    }
    // Isolation: the same user tag on both communicators; the sender sends
    // on b first, the receiver receives on a first. Payloads tell them apart.
    const int b_partner = config.size - 1 - partner;  // partner's rank in b
    constexpr uint32_t kSharedTag = 42;
    if (config.rank % 2 == 0) {
      const uint64_t on_b = 0xbbbbbbbbull, on_a = 0xaaaaaaaaull;
      RUN_OR_FAIL(b.Send(&on_b, 8, b_partner, kSharedTag, timeout), "send b");
      RUN_OR_FAIL(a.Send(&on_a, 8, partner, kSharedTag, timeout), "send a");
    } else {
      uint64_t got_a = 0, got_b = 0;
      RUN_OR_FAIL(a.Recv(&got_a, 8, partner, kSharedTag, timeout), "recv a");
      RUN_OR_FAIL(b.Recv(&got_b, 8, b_partner, kSharedTag, timeout), "recv b");
      if (got_a != 0xaaaaaaaaull || got_b != 0xbbbbbbbbull) {
        return Mismatch("messages crossed between communicators");
      }
    }
    // A Recv of the wrong size is InvalidArgument and leaves the
    // communicator usable.
    if (config.rank % 2 == 0) {
      const uint64_t big[2] = {1, 2};
      RUN_OR_FAIL(a.Send(big, 16, partner, 9, timeout), "send 16");
      RUN_OR_FAIL(a.Send(big, 8, partner, 10, timeout), "send 8");
    } else {
      uint64_t small = 0;
      absl::Status wrong = a.Recv(&small, 8, partner, 9, timeout);
      if (!absl::IsInvalidArgument(wrong)) {
        return Mismatch("wrong-size recv returned " + wrong.ToString());
      }
      RUN_OR_FAIL(a.Recv(&small, 8, partner, 10, timeout), "recv after wrong size");
      if (small != 1) return Mismatch("recv after wrong size");
    }
  }
  // Large messages (direct reads between ranks on one host when UCX_TLS is
  // unset): an exchange with the partner, then a ring of SendRecvs, which
  // deadlocks unless every rank serves what it receives before it waits for
  // its own send. Sizes are not multiples of the read piece.
  auto pattern = [](int from, int round, size_t i) {
    return static_cast<uint32_t>(from * 1000003 + round * 7919 + static_cast<int>(i));
  };
  constexpr size_t kLarge = (size_t{3} << 20) / 4 + 3;  // elements: 3 MiB + 12 B
  if (partner < config.size) {
    std::vector<uint32_t> out(kLarge), in(kLarge, 0);
    for (size_t i = 0; i < kLarge; ++i) out[i] = pattern(config.rank, 0, i);
    RUN_OR_FAIL(a.SendRecv(out.data(), kLarge * 4, partner, in.data(), kLarge * 4, partner, 11,
                           timeout),
                "large exchange");
    for (size_t i = 0; i < kLarge; ++i) {
      if (in[i] != pattern(partner, 0, i)) return Mismatch(absl::StrCat("large exchange at ", i));
    }
    // A large message of the wrong size fails the receive (InvalidArgument,
    // the communicator usable); the sender may learn it too.
    if (config.rank % 2 == 0) {
      absl::Status sent = a.Send(out.data(), (kLarge - 1) * 4, partner, 12, timeout);
      if (!sent.ok() && !absl::IsInvalidArgument(sent)) return Mismatch("wrong-size large send");
    } else {
      absl::Status wrong = a.Recv(in.data(), kLarge * 4, partner, 12, timeout);
      if (!absl::IsInvalidArgument(wrong)) {
        return Mismatch("wrong-size large recv returned " + wrong.ToString());
      }
    }
  }
  if (config.size > 1) {
    const int next = (config.rank + 1) % config.size;
    const int previous = (config.rank + config.size - 1) % config.size;
    std::vector<uint32_t> out(kLarge), in(kLarge, 0);
    for (int round = 1; round <= 3; ++round) {
      for (size_t i = 0; i < kLarge; ++i) out[i] = pattern(config.rank, round, i);
      RUN_OR_FAIL(a.SendRecv(out.data(), kLarge * 4, next, in.data(), kLarge * 4, previous,
                             static_cast<uint32_t>(20 + round), timeout),
                  "large ring");
      for (size_t i = 0; i < kLarge; ++i) {
        if (in[i] != pattern(previous, round, i)) {
          return Mismatch(absl::StrCat("large ring round ", round, " at ", i));
        }
      }
    }
  }
  // Both groups still work as collectives, concurrently tagged.
  float x = static_cast<float>(config.rank + 1);
  RUN_OR_FAIL(b.AllReduce(&x, 1, DataType::kFloat32, ReduceOp::kSum, timeout), "b allreduce");
  const float want = static_cast<float>(config.size * (config.size + 1) / 2);
  if (x != want) return Mismatch("b allreduce");
  RUN_OR_FAIL(a.Barrier(timeout), "barrier");
  std::fprintf(stderr, "rank %d: p2p ok\n", config.rank);
  return kOk;
}

int RunKillLoop(const RankConfig& config) {
  absl::StatusOr<Session> session = Connect(config, config.generation);
  if (!session.ok()) {
    Fail(session.status(), "setup");
    return kSetupFailed;
  }
  std::unique_ptr<Communicator> hierarchical;
  if (!ChooseAlgorithm(config, &*session, &hierarchical)) return kSetupFailed;
  Communicator* group = hierarchical != nullptr ? hierarchical.get() : session->world.get();
  std::vector<float> data(config.max_elements, 1.0f);
  const absl::Duration timeout = absl::Milliseconds(config.timeout_ms);
  for (int i = 0; i < config.iterations; ++i) {
    const absl::Time start = absl::Now();
    absl::Status status =
        group->AllReduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum, timeout);
    if (!status.ok()) {
      std::fprintf(stderr, "ERROR_AFTER_MS %.1f\n", absl::ToDoubleMilliseconds(absl::Now() - start));
      // Later calls fail at once with the same error.
      absl::Status again = group->Barrier(timeout);
      if (again.code() != status.code()) return Mismatch("later call: " + again.ToString());
      return Fail(status, absl::StrCat("allreduce ", i));
    }
    if (i == 0) std::fprintf(stderr, "rank %d: entered allreduce loop\n", config.rank);
    std::fill(data.begin(), data.end(), 1.0f);
  }
  return kOk;
}

int RunGenerations(const RankConfig& config) {
  for (uint64_t g = config.generation; g < config.generation + 2; ++g) {
    absl::StatusOr<Session> session = Connect(config, g);
    if (!session.ok()) {
    Fail(session.status(), "setup");
    return kSetupFailed;
  }
    Checker check(config, session->world.get());
    CHECK_STEP(check.AllReduceFloat(4099, ReduceOp::kSum, g, false));
    RUN_OR_FAIL(session->world->Barrier(absl::Milliseconds(config.timeout_ms)), "barrier");
    std::fprintf(stderr, "rank %d: generation %llu ok\n", config.rank,
                 static_cast<unsigned long long>(g));
  }
  return kOk;
}

}  // namespace cohort::comm_rank

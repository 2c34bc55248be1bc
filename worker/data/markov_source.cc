#include "worker/data/markov_source.h"

#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"

namespace cohort::data {
namespace {

// Salts keep the table and the streams on unrelated generator sequences.
constexpr uint64_t kTableSalt = 0x7461626c65ULL;     // "table"
constexpr uint64_t kStreamSalt = 0x73747265616dULL;  // "stream"
constexpr int64_t kMaxTableEntries = int64_t{1} << 24;

absl::Status CheckRange(const char* name, int value, int low, int high, const char* high_name) {
  if (value >= low && value <= high) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("synthetic source: ", name, " must be in [", low,
                                                 ", ", high_name, high, "], got ", value));
}

// The first `count` entries of a seeded Fisher-Yates shuffle of 0..n-1:
// `count` distinct values, uniformly chosen and ordered.
std::vector<uint16_t> DrawDistinct(int n, int count, SplitMix64* rng) {
  std::vector<uint16_t> pool(static_cast<size_t>(n));
  std::iota(pool.begin(), pool.end(), uint16_t{0});
  for (int i = 0; i < count; ++i) {
    const uint64_t j = static_cast<uint64_t>(i) + rng->Below(static_cast<uint64_t>(n - i));
    std::swap(pool[static_cast<size_t>(i)], pool[j]);
  }
  pool.resize(static_cast<size_t>(count));
  return pool;
}

}  // namespace

absl::StatusOr<MarkovSource> MarkovSource::Create(const MarkovSourceOptions& options) {
  if (absl::Status s = CheckRange("vocab_size", options.vocab_size, 1, 65536, ""); !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckRange("alphabet_size", options.alphabet_size, 1, options.vocab_size, "vocab_size=");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckRange("branching", options.branching, 1, options.alphabet_size, "alphabet_size=");
      !s.ok()) {
    return s;
  }
  if (options.order != 1 && options.order != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic source: order must be 1 or 2, got ", options.order));
  }
  const int64_t alphabet = options.alphabet_size;
  const int64_t contexts = options.order == 2 ? alphabet * alphabet : alphabet;
  const int64_t entries = contexts * options.branching;
  if (entries > kMaxTableEntries) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic source: alphabet_size^2 * branching = ", entries,
                     " transitions (order 2) exceeds the limit ", kMaxTableEntries,
                     "; use a smaller alphabet_size or branching"));
  }

  SplitMix64 rng(HashCounters(options.seed, kTableSalt));
  std::vector<uint16_t> symbol_tokens =
      DrawDistinct(options.vocab_size, options.alphabet_size, &rng);
  std::vector<uint16_t> successors;
  successors.reserve(static_cast<size_t>(entries));
  for (int64_t context = 0; context < contexts; ++context) {
    const std::vector<uint16_t> next = DrawDistinct(options.alphabet_size, options.branching, &rng);
    successors.insert(successors.end(), next.begin(), next.end());
  }
  return MarkovSource(options, std::move(symbol_tokens), std::move(successors));
}

std::span<const uint16_t> MarkovSource::Successors(int a, int b) const {
  const size_t k = static_cast<size_t>(options_.branching);
  const size_t context =
      options_.order == 1
          ? static_cast<size_t>(b)
          : static_cast<size_t>(a) * static_cast<size_t>(options_.alphabet_size) +
                static_cast<size_t>(b);
  return std::span<const uint16_t>(successors_).subspan(context * k, k);
}

MarkovSource::Stream MarkovSource::OpenStream(uint64_t stream_id) const {
  return Stream(this, HashCounters(options_.seed, kStreamSalt, stream_id));
}

std::vector<uint16_t> MarkovSource::Generate(int64_t count, uint64_t stream_id) const {
  std::vector<uint16_t> tokens(static_cast<size_t>(count < 0 ? 0 : count));
  Stream stream = OpenStream(stream_id);
  stream.Fill(tokens);
  return tokens;
}

double MarkovSource::EntropyFloorNats() const { return std::log(options_.branching); }

double MarkovSource::WindowEntropyFloorUpperBoundNats(int context_length) const {
  const double floor = EntropyFloorNats();
  if (options_.order == 1) return floor;
  if (context_length <= 0) return std::log(options_.alphabet_size);
  return floor + (std::log(options_.alphabet_size) - floor) / context_length;
}

void MarkovSource::Stream::Fill(std::span<uint16_t> out) {
  const uint64_t alphabet = static_cast<uint64_t>(source_->options_.alphabet_size);
  const uint64_t branching = static_cast<uint64_t>(source_->options_.branching);
  const uint16_t* successors = source_->successors_.data();
  const uint16_t* symbol_tokens = source_->symbol_tokens_.data();
  const int order = source_->options_.order;
  for (uint16_t& token : out) {
    int symbol;
    if (position_ < order) {
      symbol = static_cast<int>(rng_.Below(alphabet));
    } else {
      const uint64_t context =
          (order == 2 ? static_cast<uint64_t>(prev2_) * alphabet : 0) + static_cast<uint64_t>(prev1_);
      symbol = successors[context * branching + rng_.Below(branching)];
    }
    prev2_ = prev1_;
    prev1_ = symbol;
    ++position_;
    token = symbol_tokens[symbol];
  }
}

}  // namespace cohort::data

#pragma once
// MarkovSource: the synthetic training data, a seeded random sparse Markov
// chain of order 2 (or 1) whose entropy floor is known exactly. (Order 1 is
// learned within seconds by a tiny GPT; order 2 needs attention to the
// previous position and an (a, b) lookup, which takes a tiny model far
// longer.)
//
// Construction (all from the seed, with the splitmix64 generator of
// counter_rng.h so every build produces the same chain):
//   - `alphabet_size` distinct token ids are drawn from [0, vocab_size); symbol
//     s is emitted as token id symbol_tokens()[s].
//   - For every context (a, b) of two symbols (order 1: every symbol b),
//     `branching` distinct successor symbols are drawn from the alphabet.
// Generation: the first two symbols are uniform over the alphabet; then each
// next symbol is uniform over the successors of the last two.
//
// Every context's next-symbol distribution is uniform over `branching`
// values, so the conditional entropy given the last two tokens is exactly
// ln(branching) nats for every context, and so is the entropy rate of the
// stream: no predictor can reach a lower average cross-entropy. That is
// EntropyFloorNats(). A model that sees windows of T tokens predicts the
// first target of each window from one token only, so its window-averaged
// floor lies a little higher, at most WindowEntropyFloorUpperBoundNats(T).
//
// The default alphabet is small (16 symbols, 4 successors: 1024 transitions),
// so a tiny GPT learns the chain in a couple of minutes.
//
// Thread-safe: immutable after Create. A Stream is a cursor owned by one
// thread; it points into its MarkovSource, which must outlive it and must not
// be moved while it exists.

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/counter_rng.h"

namespace cohort::data {

struct MarkovSourceOptions {
  uint64_t seed = 1;
  // Token ids are < vocab_size; at most 65536 (ids are uint16).
  int vocab_size = 256;
  // Number of distinct symbols the chain uses, 1..vocab_size.
  int alphabet_size = 16;
  // Successors per context, 1..alphabet_size.
  int branching = 4;
  // Symbols of context: 2 (pairs) or 1.
  int order = 2;

  friend bool operator==(const MarkovSourceOptions&, const MarkovSourceOptions&) = default;
};

// Streams of one source are independent sequences; cohort-data writes the
// train shards from stream kTrainStream and the val shards from kValStream,
// so a worker that generates in-process with the same seed gets the same
// tokens as the files.
inline constexpr uint64_t kTrainStream = 0;
inline constexpr uint64_t kValStream = 1;

class MarkovSource {
 public:
  // Builds the chain. InvalidArgument (naming the option, its value and the
  // allowed range) for out-of-range options, or if the transition table
  // alphabet_size^2 * branching exceeds 2^24 entries.
  static absl::StatusOr<MarkovSource> Create(const MarkovSourceOptions& options);

  // A cursor over one stream of the chain.
  class Stream {
   public:
    // Writes the next out.size() tokens of the stream.
    void Fill(std::span<uint16_t> out);
    // Tokens produced so far.
    int64_t position() const { return position_; }

   private:
    friend class MarkovSource;
    Stream(const MarkovSource* source, uint64_t seed) : source_(source), rng_(seed) {}

    const MarkovSource* source_;
    SplitMix64 rng_;
    int64_t position_ = 0;
    // The last two symbols (valid once position_ >= 2).
    int prev2_ = 0;
    int prev1_ = 0;
  };

  // Stream `stream_id` from its beginning; deterministic in (seed, stream_id).
  Stream OpenStream(uint64_t stream_id) const;
  // The first `count` tokens of stream `stream_id` (count >= 0).
  std::vector<uint16_t> Generate(int64_t count, uint64_t stream_id = kTrainStream) const;

  // ln(branching): the per-token cross-entropy of the best predictor given
  // the full history (which for this chain is the last two tokens).
  double EntropyFloorNats() const;
  // Upper bound on the best achievable mean loss over the targets of a window
  // of `context_length` tokens (the first target sees one token of context):
  // ln(branching) + (ln(alphabet_size) - ln(branching)) / context_length
  // for order 2; ln(branching) for order 1.
  double WindowEntropyFloorUpperBoundNats(int context_length) const;

  const MarkovSourceOptions& options() const { return options_; }
  // Token id of each symbol; alphabet_size distinct ids < vocab_size.
  std::span<const uint16_t> symbol_tokens() const { return symbol_tokens_; }
  // Successor symbols (indices into symbol_tokens()) of context (a, b) (for
  // order 1, of b alone: a is ignored), in the order drawn; `branching`
  // distinct values.
  std::span<const uint16_t> Successors(int a, int b) const;

 private:
  MarkovSource(MarkovSourceOptions options, std::vector<uint16_t> symbol_tokens,
               std::vector<uint16_t> successors)
      : options_(options),
        symbol_tokens_(std::move(symbol_tokens)),
        successors_(std::move(successors)) {}

  MarkovSourceOptions options_;
  std::vector<uint16_t> symbol_tokens_;
  // successors_[(a * alphabet_size + b) * branching + i]; order 1: a = 0.
  std::vector<uint16_t> successors_;
};

}  // namespace cohort::data

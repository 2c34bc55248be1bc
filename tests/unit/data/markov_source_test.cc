// The synthetic source: exact entropy floor (checked empirically), seeded
// determinism, and option validation.

#include "worker/data/markov_source.h"

#include <cmath>
#include <set>
#include <vector>

#include "common/log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cohort::data {
namespace {

using ::testing::HasSubstr;

MarkovSource MakeSource(const MarkovSourceOptions& options) {
  absl::StatusOr<MarkovSource> source = MarkovSource::Create(options);
  CHECK(source.ok()) << source.status();
  return *std::move(source);
}

// Plug-in estimate of H(next | previous two) in nats over a stream, from
// (a, b) -> c counts; also returns how many distinct successors each seen
// context had at most.
struct EmpiricalEntropy {
  double nats = 0;
  int max_successors = 0;
  int contexts_seen = 0;
};

EmpiricalEntropy MeasureConditionalEntropy(const MarkovSource& source,
                                           const std::vector<uint16_t>& tokens) {
  const int alphabet = source.options().alphabet_size;
  std::vector<int> symbol_of(65536, -1);
  for (int s = 0; s < alphabet; ++s) symbol_of[source.symbol_tokens()[static_cast<size_t>(s)]] = s;
  std::vector<int64_t> triples(static_cast<size_t>(alphabet) * alphabet * alphabet, 0);
  for (size_t i = 2; i < tokens.size(); ++i) {
    const int a = symbol_of[tokens[i - 2]];
    const int b = symbol_of[tokens[i - 1]];
    const int c = symbol_of[tokens[i]];
    CHECK(a >= 0 && b >= 0 && c >= 0) << "token outside the alphabet at " << i;
    ++triples[(static_cast<size_t>(a) * alphabet + b) * alphabet + c];
  }
  EmpiricalEntropy result;
  const double total = static_cast<double>(tokens.size() - 2);
  for (int context = 0; context < alphabet * alphabet; ++context) {
    const int64_t* row = &triples[static_cast<size_t>(context) * alphabet];
    int64_t context_count = 0;
    int successors = 0;
    for (int c = 0; c < alphabet; ++c) {
      context_count += row[c];
      successors += row[c] > 0 ? 1 : 0;
    }
    if (context_count == 0) continue;
    ++result.contexts_seen;
    result.max_successors = std::max(result.max_successors, successors);
    for (int c = 0; c < alphabet; ++c) {
      if (row[c] == 0) continue;
      const double n = static_cast<double>(row[c]);
      result.nats -= n / total * std::log(n / static_cast<double>(context_count));
    }
  }
  return result;
}

TEST(MarkovSourceTest, EmpiricalConditionalEntropyMatchesTheFloor) {
  // 2M tokens over 16^2 contexts x 4 successors: ~2000 draws per transition.
  // The plug-in estimator is biased low by about (K-1) * contexts / (2N)
  // = 3 * 256 / 4e6 ~ 2e-4 nats and its spread is smaller still, so 5e-3 is
  // a safe bound that a wrong chain (e.g. a non-uniform choice, or branching
  // off by one: ln 3 vs ln 4 differ by 0.29) cannot meet.
  const MarkovSource source = MakeSource({.seed = 42});
  EXPECT_DOUBLE_EQ(source.EntropyFloorNats(), std::log(4.0));
  const std::vector<uint16_t> tokens = source.Generate(2'000'000);
  const EmpiricalEntropy measured = MeasureConditionalEntropy(source, tokens);
  std::printf(
      "entropy floor ln(4) = %.6f, empirical H(c|a,b) = %.6f over %zu tokens, "
      "%d contexts seen\n",
      source.EntropyFloorNats(), measured.nats, tokens.size(), measured.contexts_seen);
  EXPECT_NEAR(measured.nats, source.EntropyFloorNats(), 5e-3);
  EXPECT_EQ(measured.max_successors, 4);
}

TEST(MarkovSourceTest, FloorHoldsForOtherShapes) {
  const MarkovSource source =
      MakeSource({.seed = 3, .vocab_size = 1000, .alphabet_size = 8, .branching = 3});
  const std::vector<uint16_t> tokens = source.Generate(2'000'000);
  const EmpiricalEntropy measured = MeasureConditionalEntropy(source, tokens);
  std::printf("entropy floor ln(3) = %.6f, empirical = %.6f\n", source.EntropyFloorNats(),
              measured.nats);
  EXPECT_NEAR(measured.nats, std::log(3.0), 5e-3);
  EXPECT_EQ(measured.max_successors, 3);
}

TEST(MarkovSourceTest, OrderOneDependsOnTheLastTokenOnly) {
  const MarkovSource source =
      MakeSource({.seed = 9, .alphabet_size = 16, .branching = 4, .order = 1});
  EXPECT_DOUBLE_EQ(source.EntropyFloorNats(), std::log(4.0));
  EXPECT_DOUBLE_EQ(source.WindowEntropyFloorUpperBoundNats(64), std::log(4.0));
  const std::vector<uint16_t> tokens = source.Generate(1'000'000);
  std::vector<int> symbol_of(65536, -1);
  for (size_t s = 0; s < source.symbol_tokens().size(); ++s) {
    symbol_of[source.symbol_tokens()[s]] = static_cast<int>(s);
  }
  // H(c | b) from bigram counts equals ln 4: the previous token alone fixes
  // the successor set.
  std::vector<int64_t> pairs(16 * 16, 0);
  for (size_t i = 1; i < tokens.size(); ++i) {
    ++pairs[static_cast<size_t>(symbol_of[tokens[i - 1]]) * 16 + symbol_of[tokens[i]]];
  }
  double nats = 0;
  for (int b = 0; b < 16; ++b) {
    int64_t row = 0;
    for (int c = 0; c < 16; ++c) row += pairs[b * 16 + c];
    for (int c = 0; c < 16; ++c) {
      const double n = static_cast<double>(pairs[b * 16 + c]);
      if (n > 0) nats -= n / (tokens.size() - 1.0) * std::log(n / static_cast<double>(row));
    }
  }
  EXPECT_NEAR(nats, std::log(4.0), 5e-3);
  EXPECT_TRUE(absl::IsInvalidArgument(
      MarkovSource::Create({.seed = 1, .order = 3}).status()));
}

TEST(MarkovSourceTest, BranchingOneIsDeterministicGivenTwoTokens) {
  const MarkovSource source = MakeSource({.seed = 5, .alphabet_size = 6, .branching = 1});
  EXPECT_DOUBLE_EQ(source.EntropyFloorNats(), 0.0);
  const EmpiricalEntropy measured = MeasureConditionalEntropy(source, source.Generate(10'000));
  EXPECT_DOUBLE_EQ(measured.nats, 0.0);
  EXPECT_EQ(measured.max_successors, 1);
}

TEST(MarkovSourceTest, SymbolsAreDistinctIdsInsideTheVocabulary) {
  const MarkovSource source = MakeSource({.seed = 9, .vocab_size = 50, .alphabet_size = 20});
  std::set<uint16_t> ids(source.symbol_tokens().begin(), source.symbol_tokens().end());
  EXPECT_EQ(ids.size(), 20u);
  EXPECT_LT(*ids.rbegin(), 50);
  for (int a = 0; a < 20; ++a) {
    for (int b = 0; b < 20; ++b) {
      const std::span<const uint16_t> next = source.Successors(a, b);
      ASSERT_EQ(next.size(), 4u);
      std::set<uint16_t> distinct(next.begin(), next.end());
      ASSERT_EQ(distinct.size(), 4u) << a << "," << b;
      ASSERT_LT(*distinct.rbegin(), 20);
    }
  }
  // The mapping is seeded, not the identity.
  const MarkovSource other = MakeSource({.seed = 10, .vocab_size = 50, .alphabet_size = 20});
  EXPECT_FALSE(std::equal(source.symbol_tokens().begin(), source.symbol_tokens().end(),
                          other.symbol_tokens().begin()));
}

TEST(MarkovSourceTest, SameSeedSameStreamDifferentSeedDifferentStream) {
  const std::vector<uint16_t> a = MakeSource({.seed = 1}).Generate(100'000);
  const std::vector<uint16_t> b = MakeSource({.seed = 1}).Generate(100'000);
  const std::vector<uint16_t> c = MakeSource({.seed = 2}).Generate(100'000);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), c.size());
  int64_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == c[i] ? 1 : 0;
  // Unrelated streams over different alphabets agree rarely.
  EXPECT_LT(same, 20'000);
}

TEST(MarkovSourceTest, StreamsAreIndependentAndChunkingDoesNotMatter) {
  const MarkovSource source = MakeSource({.seed = 1});
  const std::vector<uint16_t> whole = source.Generate(10'000, kTrainStream);
  EXPECT_NE(whole, source.Generate(10'000, kValStream));
  MarkovSource::Stream stream = source.OpenStream(kTrainStream);
  std::vector<uint16_t> pieces(10'000);
  std::span<uint16_t> rest(pieces);
  for (size_t chunk : {1u, 1u, 5u, 993u, 9000u}) {
    stream.Fill(rest.first(chunk));
    rest = rest.subspan(chunk);
  }
  EXPECT_EQ(stream.position(), 10'000);
  EXPECT_EQ(pieces, whole);
}

TEST(MarkovSourceTest, OutputIsPinnedAcrossBuilds) {
  // The data of a job must not change when the code is rebuilt elsewhere;
  // this pins the generator (no std:: distributions involved).
  const MarkovSource source = MakeSource({.seed = 1});
  const std::vector<uint16_t> head = source.Generate(12);
  EXPECT_THAT(head,
              ::testing::ElementsAre(106, 237, 238, 100, 100, 104, 172, 218, 218, 100, 18, 237));
}

TEST(MarkovSourceTest, WindowFloorBoundLiesBetweenFloorAndUniform) {
  const MarkovSource source = MakeSource({.seed = 1});
  EXPECT_NEAR(source.WindowEntropyFloorUpperBoundNats(64),
              std::log(4.0) + (std::log(16.0) - std::log(4.0)) / 64, 1e-12);
}

TEST(MarkovSourceTest, RejectsOutOfRangeOptions) {
  struct Case {
    MarkovSourceOptions options;
    const char* message;
  };
  const Case cases[] = {
      {{.vocab_size = 0}, "vocab_size must be in [1, 65536], got 0"},
      {{.vocab_size = 70000}, "vocab_size must be in [1, 65536], got 70000"},
      {{.vocab_size = 10, .alphabet_size = 11},
       "alphabet_size must be in [1, vocab_size=10], got 11"},
      {{.alphabet_size = 0}, "alphabet_size must be in [1, vocab_size=256], got 0"},
      {{.alphabet_size = 4, .branching = 5}, "branching must be in [1, alphabet_size=4], got 5"},
      {{.branching = 0}, "branching must be in [1, alphabet_size=16], got 0"},
      {{.vocab_size = 65536, .alphabet_size = 5000, .branching = 4}, "exceeds the limit"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<MarkovSource> source = MarkovSource::Create(c.options);
    EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(source.status().message(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace cohort::data

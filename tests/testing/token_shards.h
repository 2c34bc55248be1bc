#pragma once
// The tokens of the shards a test wrote (cohort-data's output), read back
// through the loader's own TokenDataset. Header-only, for tests that link
// the data library (the cohort_testing library does not).

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/data/token_dataset.h"

namespace cohort::testing {

// All tokens of the shards matching `pattern`, in shard order; a failure
// (and nothing) when they cannot be opened.
inline std::vector<uint16_t> ReadShardTokens(const std::string& pattern) {
  absl::StatusOr<data::TokenDataset> dataset = data::TokenDataset::OpenGlob(pattern);
  EXPECT_TRUE(dataset.ok()) << pattern << ": " << dataset.status();
  if (!dataset.ok()) return {};
  std::vector<uint16_t> tokens;
  for (int i = 0; i < dataset->num_shards(); ++i) {
    tokens.insert(tokens.end(), dataset->shard(i).begin(), dataset->shard(i).end());
  }
  return tokens;
}

}  // namespace cohort::testing

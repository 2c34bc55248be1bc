// Fuzz target: token shard files (worker/data/token_shard.h) as a worker
// maps them for data.shards, and the batch sampler reading what they hold.
//
// The input is the whole file: it is written to one path per process (on
// tmpfs when there is one), then TokenShard::Open maps it. Header ints [3]
// and [4] (bytes 12..19), which Open ignores, choose the sampler's context
// length (1..64), global batch (1..8) and vocabulary bound.
//
// Checks, besides the sanitizers: errors are proper statuses with the codes
// token_shard.h documents; a shard that opens is exactly 1024 + 2 * count
// bytes with the documented header and its tokens are the file's bytes;
// TokenDataset::OpenFiles agrees; the sampler's windows stay inside the shard
// and hold its tokens.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "worker/data/batch_sampler.h"
#include "worker/data/token_dataset.h"
#include "worker/data/token_shard.h"

namespace cohort::fuzz {
namespace {

const std::string& ShardPath() {
  static const std::string* path = [] {
    auto* p = new std::string(ScratchPath("shard") + ".bin");
    std::atexit([] { ::unlink(ShardPath().c_str()); });
    return p;
  }();
  return *path;
}

void WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  Require(fd >= 0, "cannot create the shard file");
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    Require(n > 0, "cannot write the shard file");
    data += n;
    size -= static_cast<size_t>(n);
  }
  ::close(fd);
}

int32_t HeaderInt(const uint8_t* data, size_t size, int index) {
  uint32_t value = 0;
  for (int i = 3; i >= 0; --i) {
    const size_t at = static_cast<size_t>(index) * 4 + static_cast<size_t>(i);
    value = (value << 8) | (at < size ? data[at] : 0);
  }
  return static_cast<int32_t>(value);
}

void CheckOpenError(const absl::Status& status) {
  CheckHandlerError(status, "TokenShard::Open");
  const absl::StatusCode code = status.code();
  Require(code == absl::StatusCode::kDataLoss || code == absl::StatusCode::kInvalidArgument,
          "TokenShard::Open of a readable file failed with an undocumented code");
}

void SampleFrom(const data::TokenDataset& dataset, const uint8_t* data, size_t size) {
  const uint32_t knobs = static_cast<uint32_t>(HeaderInt(data, size, 3));
  data::SamplerOptions options;
  options.seed = static_cast<uint32_t>(HeaderInt(data, size, 4));
  options.context_length = 1 + static_cast<int>(knobs & 63);
  options.global_batch_size = 1 + static_cast<int>((knobs >> 6) & 7);
  options.max_token_id = (knobs >> 9) & 1 ? static_cast<int>((knobs >> 10) & 0xFFFF) : -1;
  absl::StatusOr<data::BatchSampler> sampler = data::BatchSampler::Create(dataset, options);
  if (!sampler.ok()) {
    CheckHandlerError(sampler.status(), "BatchSampler::Create");
    Require(sampler.status().code() == absl::StatusCode::kInvalidArgument,
            "BatchSampler::Create failed with a code other than INVALID_ARGUMENT");
    return;
  }
  const int t = options.context_length;
  const int b = options.global_batch_size;
  std::vector<int32_t> inputs(static_cast<size_t>(b * t)), targets(static_cast<size_t>(b * t));
  const std::span<const uint16_t> tokens = dataset.shard(0);
  for (int64_t step = 0; step < 3; ++step) {
    const absl::Status filled = sampler->Fill(Step(step), 0, b, inputs.data(), targets.data());
    Require(filled.ok(), "BatchSampler::Fill of a whole batch failed");
    for (int j = 0; j < b; ++j) {
      const data::SampleLocation at = sampler->Locate(Step(step), j);
      Require(at.shard == 0 && at.offset >= 0 &&
                  at.offset + t + 1 <= static_cast<int64_t>(tokens.size()),
              "a sample's window leaves its shard");
      for (int i = 0; i < t; ++i) {
        const size_t k = static_cast<size_t>(j * t + i);
        Require(inputs[k] == tokens[static_cast<size_t>(at.offset + i)] &&
                    targets[k] == tokens[static_cast<size_t>(at.offset + i + 1)],
                "a sample does not hold its window's tokens");
        if (options.max_token_id >= 0) {
          Require(inputs[k] <= options.max_token_id && targets[k] <= options.max_token_id,
                  "a sample holds a token id above max_token_id");
        }
      }
    }
  }
}

}  // namespace
}  // namespace cohort::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  cohort::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort;
  using fuzz::Require;
  const std::string& path = fuzz::ShardPath();
  fuzz::WriteFile(path, data, size);

  absl::StatusOr<data::TokenShard> shard = data::TokenShard::Open(path);
  absl::StatusOr<data::TokenDataset> dataset = data::TokenDataset::OpenFiles({path});
  Require(shard.ok() == dataset.ok(), "TokenDataset::OpenFiles and TokenShard::Open disagree");
  if (!shard.ok()) {
    fuzz::CheckOpenError(shard.status());
    Require(shard.status() == dataset.status(),
            "TokenDataset::OpenFiles reports another error than TokenShard::Open");
    return 0;
  }
  // What the format says a valid shard is.
  Require(size >= static_cast<size_t>(data::kShardHeaderBytes),
          "a shard shorter than its header opened");
  Require(fuzz::HeaderInt(data, size, 0) == data::kShardMagic, "a shard with a wrong magic opened");
  Require(fuzz::HeaderInt(data, size, 1) == data::kShardVersion,
          "a shard of another version opened");
  const int32_t count = fuzz::HeaderInt(data, size, 2);
  Require(count >= 0 && shard->size() == count, "the shard's size is not its header's count");
  Require(size == static_cast<size_t>(data::kShardHeaderBytes) + 2 * static_cast<size_t>(count),
          "a shard whose length does not match its count opened");
  Require(std::memcmp(shard->tokens().data(), data + data::kShardHeaderBytes,
                      static_cast<size_t>(count) * 2) == 0,
          "the shard's tokens are not the file's bytes");
  Require(dataset->num_shards() == 1 && dataset->total_tokens() == count,
          "TokenDataset::OpenFiles holds other tokens than the shard");
  uint16_t max_id = 0;
  for (uint16_t token : shard->tokens()) max_id = std::max(max_id, token);
  Require(dataset->MaxTokenId() == max_id, "TokenDataset::MaxTokenId is not the largest token");
  fuzz::SampleFrom(*dataset, data, size);
  return 0;
}

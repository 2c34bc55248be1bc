#include "tools/data/synthetic_shards.h"

#include <algorithm>
#include <vector>

namespace cohort::datatool {
namespace {

constexpr int64_t kChunkTokens = 1 << 20;

absl::Status AppendStream(const data::MarkovSource& source, uint64_t stream_id, int64_t count,
                          SplitWriter* writer) {
  data::MarkovSource::Stream stream = source.OpenStream(stream_id);
  std::vector<uint16_t> chunk;
  for (int64_t done = 0; done < count;) {
    chunk.resize(static_cast<size_t>(std::min(kChunkTokens, count - done)));
    stream.Fill(chunk);
    if (absl::Status s = writer->Append(chunk); !s.ok()) return s;
    done += static_cast<int64_t>(chunk.size());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SyntheticShardsSummary> WriteSyntheticShards(const SyntheticShardsOptions& options) {
  absl::StatusOr<data::MarkovSource> source = data::MarkovSource::Create(options.source);
  if (!source.ok()) return source.status();
  absl::StatusOr<SplitWriter> writer =
      SplitWriter::Create({.output_dir = options.output_dir,
                           .total_tokens = options.tokens,
                           .val_fraction = options.val_fraction,
                           .shard_tokens = options.shard_tokens,
                           .replace_existing = options.replace_existing,
                           .progress = options.progress});
  if (!writer.ok()) return writer.status();
  const int64_t train_tokens = writer->train_tokens();
  const int64_t val_tokens = writer->val_tokens();
  if (absl::Status s = AppendStream(*source, data::kTrainStream, train_tokens, &*writer); !s.ok()) {
    return s;
  }
  if (absl::Status s = AppendStream(*source, data::kValStream, val_tokens, &*writer); !s.ok()) {
    return s;
  }
  absl::StatusOr<SplitSummary> split = writer->Finish();
  if (!split.ok()) return split.status();
  return SyntheticShardsSummary{.split = *std::move(split),
                                .entropy_floor_nats = source->EntropyFloorNats()};
}

}  // namespace cohort::datatool

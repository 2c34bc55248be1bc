#include "tools/data/split_writer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace cohort::datatool {

absl::StatusOr<SplitWriter> SplitWriter::Create(SplitOptions options) {
  if (options.total_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("total token count must be >= 0, got ", options.total_tokens));
  }
  if (!(options.val_fraction >= 0.0 && options.val_fraction < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("val_fraction must be in [0, 1), got ", options.val_fraction));
  }
  const int64_t val_tokens = std::clamp<int64_t>(
      std::llround(static_cast<double>(options.total_tokens) * options.val_fraction), 0,
      options.total_tokens);
  absl::StatusOr<ShardSetWriter> train =
      ShardSetWriter::Create({.output_dir = options.output_dir,
                              .prefix = "train",
                              .shard_tokens = options.shard_tokens,
                              .replace_existing = options.replace_existing});
  if (!train.ok()) return train.status();
  std::optional<ShardSetWriter> val;
  if (options.val_fraction > 0.0) {
    absl::StatusOr<ShardSetWriter> writer =
        ShardSetWriter::Create({.output_dir = options.output_dir,
                                .prefix = "val",
                                .shard_tokens = options.shard_tokens,
                                .replace_existing = options.replace_existing});
    if (!writer.ok()) return writer.status();
    val = *std::move(writer);
  }
  const int64_t train_tokens = options.total_tokens - val_tokens;
  return SplitWriter(std::move(options), train_tokens, *std::move(train), std::move(val));
}

absl::Status SplitWriter::Append(std::span<const uint16_t> tokens) {
  const int64_t size = static_cast<int64_t>(tokens.size());
  if (size > options_.total_tokens - done_) {
    return absl::FailedPreconditionError(
        absl::StrCat("appending ", size, " tokens after ", done_, " exceeds the announced total ",
                     options_.total_tokens, " (did an input grow while being read?)"));
  }
  const int64_t to_train = std::clamp<int64_t>(train_tokens_ - done_, 0, size);
  if (to_train > 0) {
    if (absl::Status s = train_.Append(tokens.first(static_cast<size_t>(to_train))); !s.ok()) {
      return s;
    }
  }
  if (to_train < size) {
    // val_ exists: val_tokens() > 0 implies val_fraction > 0.
    if (absl::Status s = val_->Append(tokens.subspan(static_cast<size_t>(to_train))); !s.ok()) {
      return s;
    }
  }
  done_ += size;
  if (options_.progress) options_.progress(done_, options_.total_tokens);
  return absl::OkStatus();
}

absl::StatusOr<SplitSummary> SplitWriter::Finish() {
  if (done_ != options_.total_tokens) {
    return absl::FailedPreconditionError(
        absl::StrCat("only ", done_, " of the announced ", options_.total_tokens,
                     " tokens were appended (did an input shrink while being read?)"));
  }
  SplitSummary summary;
  absl::StatusOr<ShardSetSummary> train = train_.Finish();
  if (!train.ok()) return train.status();
  summary.train = *std::move(train);
  if (val_.has_value()) {
    absl::StatusOr<ShardSetSummary> val = val_->Finish();
    if (!val.ok()) return val.status();
    summary.val = *std::move(val);
  }
  return summary;
}

}  // namespace cohort::datatool

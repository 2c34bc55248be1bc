#include "worker/data/token_dataset.h"

#include <glob.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace cohort::data {

absl::StatusOr<TokenDataset> TokenDataset::OpenGlob(std::string_view pattern) {
  const std::string pattern_string(pattern);
  glob_t matches{};
  const int rc = ::glob(pattern_string.c_str(), 0, nullptr, &matches);
  std::vector<std::string> paths;
  if (rc == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i) paths.emplace_back(matches.gl_pathv[i]);
  }
  ::globfree(&matches);
  if (rc == GLOB_NOMATCH || (rc == 0 && paths.empty())) {
    return absl::NotFoundError(absl::StrCat("no token shard matches ", pattern_string));
  }
  if (rc == GLOB_ABORTED) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read a directory of shard pattern ", pattern_string));
  }
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("glob(", pattern_string, ") failed with code ", rc));
  }
  // glob sorts by the locale's collation; byte order is the same on every host.
  std::sort(paths.begin(), paths.end());
  return OpenFiles(paths);
}

absl::StatusOr<TokenDataset> TokenDataset::OpenFiles(const std::vector<std::string>& paths) {
  if (paths.empty()) return absl::InvalidArgumentError("a token dataset needs at least one shard");
  TokenDataset dataset;
  for (const std::string& path : paths) {
    absl::StatusOr<TokenShard> shard = TokenShard::Open(path);
    if (!shard.ok()) return shard.status();
    dataset.files_.push_back(std::make_unique<TokenShard>(*std::move(shard)));
    dataset.views_.push_back(dataset.files_.back()->tokens());
    dataset.names_.push_back(path);
  }
  return dataset;
}

TokenDataset TokenDataset::FromMemory(std::vector<std::vector<uint16_t>> shards,
                                      std::string_view name) {
  TokenDataset dataset;
  dataset.memory_ = std::move(shards);
  for (size_t i = 0; i < dataset.memory_.size(); ++i) {
    dataset.views_.emplace_back(dataset.memory_[i]);
    dataset.names_.push_back(absl::StrCat(std::string(name), "[", i, "]"));
  }
  return dataset;
}

TokenDataset TokenDataset::FromTokens(std::vector<uint16_t> tokens, std::string_view name) {
  std::vector<std::vector<uint16_t>> shards;
  shards.push_back(std::move(tokens));
  return FromMemory(std::move(shards), name);
}

absl::StatusOr<TokenDataset::Split> TokenDataset::HoldOutTail(TokenDataset whole,
                                                              double fraction) {
  if (!(fraction > 0.0 && fraction < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("held-out fraction must be in (0, 1), got ", fraction));
  }
  const int64_t total = whole.total_tokens();
  const int64_t held = static_cast<int64_t>(static_cast<double>(total) * fraction);
  int64_t cut = total - held;  // first held-out token, in dataset order
  auto owner = std::make_shared<const TokenDataset>(std::move(whole));
  Split split;
  split.kept.owner_ = owner;
  split.held_out.owner_ = owner;
  for (int i = 0; i < owner->num_shards(); ++i) {
    const std::span<const uint16_t> view = owner->shard(i);
    const int64_t size = static_cast<int64_t>(view.size());
    const int64_t in_kept = std::clamp<int64_t>(cut, 0, size);
    cut -= in_kept;
    if (in_kept > 0) {
      split.kept.views_.push_back(view.first(static_cast<size_t>(in_kept)));
      split.kept.names_.push_back(owner->shard_name(i));
    }
    if (in_kept < size) {
      split.held_out.views_.push_back(view.subspan(static_cast<size_t>(in_kept)));
      split.held_out.names_.push_back(
          in_kept == 0 ? owner->shard_name(i)
                       : absl::StrCat(owner->shard_name(i), " from token ", in_kept));
    }
  }
  return split;
}

int64_t TokenDataset::total_tokens() const {
  int64_t total = 0;
  for (const std::span<const uint16_t>& view : views_) total += static_cast<int64_t>(view.size());
  return total;
}

absl::Status TokenDataset::CheckTokenIds(int max_token_id, absl::string_view kind) const {
  for (int i = 0; i < num_shards(); ++i) {
    const std::span<const uint16_t> tokens = shard(i);
    const auto bad = std::find_if(tokens.begin(), tokens.end(), [&](uint16_t token) {
      return static_cast<int>(token) > max_token_id;
    });
    if (bad != tokens.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kind, " ", shard_name(i), ": token ", bad - tokens.begin(), " has id ", *bad,
                       ", larger than the model's largest id ", max_token_id,
                       " (is the data tokenized for a bigger vocabulary?)"));
    }
  }
  return absl::OkStatus();
}

uint16_t TokenDataset::MaxTokenId() const {
  uint16_t max_id = 0;
  for (const std::span<const uint16_t>& view : views_) {
    for (const uint16_t token : view) max_id = std::max(max_id, token);
  }
  return max_id;
}

}  // namespace cohort::data

#include "coordinator/checkpoints/checkpoint_store.h"

#include <limits>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"

namespace cohort::coordinator {

std::string PendingName(const PendingCheckpoint& pending) {
  return absl::StrCat("job ", pending.job.value(), " step ", pending.step.value(), " generation ",
                      pending.generation.value());
}

absl::Status VerifyChunk(const v1::CheckpointManifest& manifest, const v1::TensorInfo& tensor,
                         const v1::ChunkInfo& chunk, std::string_view bytes) {
  if (bytes.size() != chunk.bytes()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint of job ", manifest.job_id(), " step ", manifest.step(), ": tensor ",
        tensor.name(), " chunk ", chunk.index(), " holds ", bytes.size(), " bytes, expected ",
        chunk.bytes()));
  }
  const uint32_t crc = Crc32c(bytes);
  if (crc != chunk.crc32c()) {
    return absl::DataLossError(absl::StrFormat(
        "checkpoint of job %s step %d: tensor %s chunk %u is corrupt (crc32c %08x, expected "
        "%08x)",
        manifest.job_id(), manifest.step(), tensor.name(), chunk.index(), crc, chunk.crc32c()));
  }
  return absl::OkStatus();
}

// --- InMemoryCheckpointStore ---

class InMemoryCheckpointStore::Reader : public CheckpointReader {
 public:
  Reader(v1::CheckpointManifest manifest,
         std::map<std::pair<std::string, uint32_t>, std::shared_ptr<const std::string>> chunks)
      : manifest_(std::move(manifest)), chunks_(std::move(chunks)) {}
  const v1::CheckpointManifest& manifest() const override { return manifest_; }
  absl::StatusOr<ChunkBytes> ReadChunk(const v1::TensorInfo& tensor,
                                       const v1::ChunkInfo& chunk) override {
    auto it = chunks_.find({tensor.name(), chunk.index()});
    if (it == chunks_.end()) {
      return absl::DataLossError(absl::StrCat("checkpoint of job ", manifest_.job_id(), " step ",
                                              manifest_.step(), ": tensor ", tensor.name(),
                                              " chunk ", chunk.index(), " is missing"));
    }
    if (absl::Status s = VerifyChunk(manifest_, tensor, chunk, *it->second); !s.ok()) return s;
    return ChunkBytes(*it->second, it->second);
  }

 private:
  const v1::CheckpointManifest manifest_;
  const std::map<std::pair<std::string, uint32_t>, std::shared_ptr<const std::string>> chunks_;
};

absl::Status InMemoryCheckpointStore::BeginPending(const PendingCheckpoint& pending) {
  absl::MutexLock lock(&mu_);
  pending_.insert(pending);
  return absl::OkStatus();
}

absl::Status InMemoryCheckpointStore::PutChunk(const PendingCheckpoint& pending,
                                               const std::string& tensor, const Box& box,
                                               std::string_view bytes) {
  absl::MutexLock lock(&mu_);
  chunks_[ChunkKey{pending, tensor, box.start}] = std::make_shared<const std::string>(bytes);
  return absl::OkStatus();
}

absl::Status InMemoryCheckpointStore::Commit(const v1::CheckpointManifest& manifest) {
  absl::MutexLock lock(&mu_);
  const PendingCheckpoint key{JobId(manifest.job_id()), Step(manifest.step()),
                              Generation(manifest.generation())};
  auto old = manifests_.find({manifest.job_id(), manifest.step()});
  if (old != manifests_.end() && old->second.generation() != manifest.generation()) {
    const PendingCheckpoint replaced{key.job, key.step, Generation(old->second.generation())};
    std::erase_if(chunks_, [&](const auto& entry) { return std::get<0>(entry.first) == replaced; });
  }
  manifests_[{manifest.job_id(), manifest.step()}] = manifest;
  pending_.erase(key);
  return absl::OkStatus();
}

absl::Status InMemoryCheckpointStore::DropPending(const PendingCheckpoint& pending) {
  absl::MutexLock lock(&mu_);
  std::erase_if(chunks_, [&](const auto& entry) { return std::get<0>(entry.first) == pending; });
  pending_.erase(pending);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PendingCheckpoint>> InMemoryCheckpointStore::ListPending() {
  absl::MutexLock lock(&mu_);
  std::vector<PendingCheckpoint> out;
  for (const PendingCheckpoint& key : pending_) out.push_back(key);
  return out;
}

absl::StatusOr<std::vector<v1::CheckpointManifest>> InMemoryCheckpointStore::List(
    const JobId& job) {
  absl::MutexLock lock(&mu_);
  std::vector<v1::CheckpointManifest> out;
  for (const auto& [key, manifest] : manifests_) {
    if (key.first == job.value()) out.push_back(manifest);
  }
  std::reverse(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> InMemoryCheckpointStore::Open(
    const JobId& job, std::optional<Step> step) {
  absl::MutexLock lock(&mu_);
  const v1::CheckpointManifest* found = nullptr;
  for (const auto& [key, manifest] : manifests_) {
    if (key.first == job.value() && (!step.has_value() || key.second == step->value())) {
      found = &manifest;
    }
  }
  if (found == nullptr) {
    return absl::NotFoundError(!step.has_value()
                                   ? absl::StrCat("job ", job.value(), " has no checkpoint")
                                   : absl::StrCat("job ", job.value(),
                                                  " has no checkpoint at step ", step->value()));
  }
  const PendingCheckpoint key{job, Step(found->step()), Generation(found->generation())};
  std::map<std::pair<std::string, uint32_t>, std::shared_ptr<const std::string>> chunks;
  for (const v1::TensorInfo& tensor : found->tensors()) {
    for (const v1::ChunkInfo& chunk : tensor.chunks()) {
      auto it = chunks_.find(ChunkKey{
          key, tensor.name(),
          std::vector<int64_t>(chunk.box().start().begin(), chunk.box().start().end())});
      if (it != chunks_.end()) chunks[{tensor.name(), chunk.index()}] = it->second;
    }
  }
  return std::make_unique<Reader>(*found, std::move(chunks));
}

absl::Status InMemoryCheckpointStore::Delete(const JobId& job, Step step) {
  absl::MutexLock lock(&mu_);
  auto it = manifests_.find({job.value(), step.value()});
  if (it == manifests_.end()) {
    return absl::NotFoundError(
        absl::StrCat("job ", job.value(), " has no checkpoint at step ", step.value()));
  }
  const PendingCheckpoint key{job, step, Generation(it->second.generation())};
  manifests_.erase(it);
  std::erase_if(chunks_, [&](const auto& entry) { return std::get<0>(entry.first) == key; });
  return absl::OkStatus();
}

std::optional<Step> InMemoryCheckpointStore::NewestStep(const JobId& job) const {
  absl::MutexLock lock(&mu_);
  auto it = manifests_.lower_bound({job.value(), std::numeric_limits<int64_t>::max()});
  if (it == manifests_.begin()) return std::nullopt;
  --it;
  if (it->first.first != job.value()) return std::nullopt;
  return Step(it->first.second);
}

void CommittedIndex::Add(const JobId& job, Step step) {
  absl::MutexLock lock(&mu_);
  steps_[job].insert(step);
}

void CommittedIndex::Remove(const JobId& job, Step step) {
  absl::MutexLock lock(&mu_);
  auto it = steps_.find(job);
  if (it == steps_.end()) return;
  it->second.erase(step);
  if (it->second.empty()) steps_.erase(it);
}

std::optional<Step> CommittedIndex::Newest(const JobId& job) const {
  absl::MutexLock lock(&mu_);
  auto it = steps_.find(job);
  if (it == steps_.end()) return std::nullopt;
  return *it->second.rbegin();
}

size_t InMemoryCheckpointStore::chunk_count() const {
  absl::MutexLock lock(&mu_);
  return chunks_.size();
}

}  // namespace cohort::coordinator

#include "worker/checkpoint/checkpoint_writer.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace cohort::checkpoint {
namespace {

size_t KindIndex(StateKind kind) { return static_cast<size_t>(kind); }

}  // namespace

CheckpointWriter::CheckpointWriter(client::CheckpointClient* client, const model::GptConfig& config,
                                   const model::ParameterTable& table,
                                   CheckpointWriterOptions options)
    : client_(client),
      options_(std::move(options)),
      range_(WriteRange(table, options_.position)),
      pieces_(PlanSave(table, options_.position, options_.max_chunk_elements)),
      catalog_(Catalog(config)),
      fingerprint_(ModelFingerprint(config)) {}

CheckpointWriter::~CheckpointWriter() {
  if (uploader_.joinable()) uploader_.join();
}

absl::StatusOr<absl::Duration> CheckpointWriter::Save(Step step, const StateView& state) {
  if (state.optimizer.begin > range_.begin || state.optimizer.end < range_.end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer range [", state.optimizer.begin, ", ", state.optimizer.end,
        ") does not hold the write range [", range_.begin, ", ", range_.end, ")"));
  }
  const absl::Time start = absl::Now();
  if (uploader_.joinable()) uploader_.join();  // at most one in flight
  const size_t n = range_.end - range_.begin;
  const size_t moment_offset = range_.begin - state.optimizer.begin;
  snapshot_.resize(3 * n);
  std::memcpy(snapshot_.data(), state.params + range_.begin, n * sizeof(float));
  std::memcpy(snapshot_.data() + n, state.adam_m + moment_offset, n * sizeof(float));
  std::memcpy(snapshot_.data() + 2 * n, state.adam_v + moment_offset, n * sizeof(float));
  const absl::Duration blocked = absl::Now() - start;
  uploader_ = std::thread([this, step] { Upload(step, snapshot_.data(), nullptr); });
  return blocked;
}

absl::StatusOr<absl::Duration> CheckpointWriter::SaveDrained(Step step, const float* snapshot,
                                                             ArenaRange covers,
                                                             std::function<absl::Status()> ready) {
  if (covers.begin != range_.begin || covers.end != range_.end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the snapshot covers [", covers.begin, ", ", covers.end, ") where this rank writes [",
        range_.begin, ", ", range_.end, ")"));
  }
  const absl::Time start = absl::Now();
  if (uploader_.joinable()) uploader_.join();  // at most one in flight
  const absl::Duration blocked = absl::Now() - start;
  uploader_ = std::thread(
      [this, step, snapshot, ready = std::move(ready)] { Upload(step, snapshot, ready); });
  return blocked;
}

void CheckpointWriter::Upload(Step step, const float* data,
                              const std::function<absl::Status()>& ready) {
  const absl::Time start = absl::Now();
  if (ready) {
    if (absl::Status drained = ready(); !drained.ok()) {
      UploadResult result;
      result.step = step;
      result.status = absl::Status(drained.code(), absl::StrCat("the state's snapshot did not "
                                                                "reach the host: ",
                                                                drained.message()));
      result.duration = absl::Now() - start;
      Record(result);
      return;
    }
  }
  const size_t n = range_.end - range_.begin;
  std::vector<client::UploadChunk> chunks;
  chunks.reserve(pieces_.size());
  for (const SavePiece& piece : pieces_) {
    const float* base = data + KindIndex(piece.kind) * n;
    chunks.push_back(client::UploadChunk{piece.tensor, piece.box, base + (piece.arena_offset - range_.begin),
                                 piece.count * sizeof(float)});
  }
  v1::UploadHeader header;
  header.set_job_id(options_.job_id);
  header.set_generation(options_.generation.value());
  header.set_step(step.value());
  const RankPosition& p = options_.position;
  header.mutable_layout()->set_data_parallel(p.shape.data);
  header.mutable_layout()->set_tensor_parallel(p.shape.tensor);
  header.mutable_layout()->set_pipeline_parallel(p.shape.pipeline);
  header.mutable_layout()->set_zero1(options_.zero1);
  header.set_writer(options_.writer);
  header.set_writers(static_cast<uint32_t>(p.shape.world()));
  for (const v1::TensorInfo& t : catalog_) *header.add_tensors() = t;
  v1::UploadEnd end;
  end.set_chunks(static_cast<uint32_t>(chunks.size()));
  if (options_.writer == 0) (*end.mutable_objects())["model"] = fingerprint_;

  UploadResult result;
  result.step = step;
  absl::Duration backoff = absl::Milliseconds(500);
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<v1::UploadResponse> response =
        client_->Upload(header, chunks, end, options_.upload_timeout);
    if (response.ok()) {
      result.committed = response->committed();
      break;
    }
    result.status = response.status();
    if (absl::IsAlreadyExists(result.status)) {  // a retry after the commit went through
      result.status = absl::OkStatus();
      break;
    }
    if (!absl::IsResourceExhausted(result.status) || attempt >= options_.busy_retries) break;
    absl::SleepFor(backoff);
    backoff *= 2;
  }
  result.bytes = bytes_per_checkpoint();
  result.duration = absl::Now() - start;
  Record(result);
}

void CheckpointWriter::Record(const UploadResult& result) {
  if (result.status.ok()) {
    LOG(INFO) << "checkpoint of job " << options_.job_id << " step " << result.step << ": writer "
              << options_.writer << " uploaded " << pieces_.size() << " chunks, " << result.bytes
              << " bytes in " << absl::FormatDuration(absl::Trunc(result.duration, absl::Milliseconds(1)))
              << (result.committed ? " and committed it" : "");
  } else {
    LOG(WARNING) << "checkpoint of job " << options_.job_id << " step " << result.step
                 << " not saved by writer " << options_.writer << ": " << result.status;
  }
  if (options_.on_result) options_.on_result(result);
  absl::MutexLock lock(&mu_);
  (result.status.ok() ? ok_ : failed_) += 1;
  last_ = result;
}

UploadResult CheckpointWriter::Wait() {
  if (uploader_.joinable()) uploader_.join();
  absl::MutexLock lock(&mu_);
  return last_.value_or(UploadResult{});
}

int64_t CheckpointWriter::uploads_ok() const {
  absl::MutexLock lock(&mu_);
  return ok_;
}

int64_t CheckpointWriter::uploads_failed() const {
  absl::MutexLock lock(&mu_);
  return failed_;
}

std::optional<UploadResult> CheckpointWriter::last_result() const {
  absl::MutexLock lock(&mu_);
  return last_;
}

}  // namespace cohort::checkpoint

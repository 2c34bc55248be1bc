#include "coordinator/service/checkpoints_service.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/log.h"

namespace cohort::coordinator {
namespace {

absl::Status RequireJobId(const std::string& job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: must not be empty");
  return absl::OkStatus();
}

// Counts a stream against its cap for as long as the guard lives.
class StreamSlot {
 public:
  StreamSlot(std::atomic<int>* active, int max) : active_(active) {
    acquired_ = active_->fetch_add(1) < max;
  }
  ~StreamSlot() { active_->fetch_sub(1); }
  bool acquired() const { return acquired_; }

 private:
  std::atomic<int>* active_;
  bool acquired_ = false;
};

}  // namespace

// One writer's Upload stream. Reads one message at a time; between reads,
// store work runs on the executor, so reactions never overlap and the state
// below needs no lock. Deletes itself in OnDone.
class UploadReactor : public grpc::ServerReadReactor<v1::UploadRequest> {
 public:
  UploadReactor(CheckpointsService* service, v1::UploadResponse* response)
      : service_(service),
        response_(response),
        slot_(&service->uploads_active_, service->limits_.max_uploads),
        start_(absl::Now()) {
    service_->metrics_->SetCheckpointStreams("upload", service_->uploads_active_.load());
    if (!slot_.acquired()) {
      Fail(absl::ResourceExhaustedError(absl::StrCat(
          "more than ", service_->limits_.max_uploads,
          " checkpoint uploads are in progress (limit: --max_checkpoint_uploads); retry later")));
      return;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Fail(absl::InvalidArgumentError("the upload stream ended before its UploadEnd"));
      return;
    }
    switch (request_.part_case()) {
      case v1::UploadRequest::kHeader:
        return OnHeader();
      case v1::UploadRequest::kChunk:
        return OnChunk();
      case v1::UploadRequest::kData:
        return OnData();
      case v1::UploadRequest::kEnd:
        return OnEnd();
      default:
        Fail(absl::InvalidArgumentError("an UploadRequest with no part set"));
    }
  }

  void OnDone() override {
    service_->metrics_->SetCheckpointStreams("upload", service_->uploads_active_.load() - 1);
    delete this;
  }

 private:
  void OnHeader() {
    if (writer_ != nullptr) return Fail(absl::InvalidArgumentError("a second UploadHeader"));
    service_->executor_->Schedule([this, header = request_.header()] {
      absl::StatusOr<std::unique_ptr<CheckpointUploads::Writer>> writer =
          service_->uploads_->Begin(header);
      if (!writer.ok()) return Fail(writer.status());
      writer_ = std::move(*writer);
      StartRead(&request_);
    });
  }

  void OnChunk() {
    if (writer_ == nullptr) return Fail(absl::InvalidArgumentError("a chunk before the header"));
    if (in_chunk_) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("chunk of ", request_.chunk().tensor(), " begins before the previous one (",
                       chunk_.tensor(), ") received its ", chunk_.bytes(), " bytes")));
    }
    chunk_ = request_.chunk();
    if (static_cast<int64_t>(chunk_.bytes()) > service_->limits_.max_chunk_bytes) {
      return Fail(absl::ResourceExhaustedError(absl::StrCat(
          "chunk.bytes: a chunk of ", chunk_.tensor(), " has ", chunk_.bytes(),
          " bytes, over the limit of ", service_->limits_.max_chunk_bytes,
          " (--max_checkpoint_chunk_bytes)")));
    }
    if (chunk_.bytes() == 0) return Fail(absl::InvalidArgumentError("chunk.bytes: must be > 0"));
    in_chunk_ = true;
    buffer_.clear();
    buffer_.reserve(chunk_.bytes());
    StartRead(&request_);
  }

  void OnData() {
    if (!in_chunk_) return Fail(absl::InvalidArgumentError("data outside a chunk"));
    const std::string& data = request_.data();
    if (buffer_.size() + data.size() > chunk_.bytes()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "chunk of ", chunk_.tensor(), ": more data than its ", chunk_.bytes(), " bytes")));
    }
    buffer_.append(data);
    if (buffer_.size() < chunk_.bytes()) return StartRead(&request_);
    in_chunk_ = false;
    service_->executor_->Schedule([this] {
      absl::Status stored = writer_->AddChunk(chunk_, buffer_);
      if (!stored.ok()) return Fail(stored);
      service_->metrics_->CheckpointTransfer("upload", static_cast<int64_t>(buffer_.size()));
      buffer_.clear();
      StartRead(&request_);
    });
  }

  void OnEnd() {
    if (writer_ == nullptr) return Fail(absl::InvalidArgumentError("UploadEnd before the header"));
    if (in_chunk_) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("UploadEnd inside the chunk of ", chunk_.tensor())));
    }
    service_->executor_->Schedule([this, end = request_.end()] {
      const absl::Time begin = absl::Now();
      absl::StatusOr<bool> committed = writer_->End(end);
      if (!committed.ok()) return Fail(committed.status());
      if (*committed) service_->metrics_->CheckpointCommitted(absl::Now() - begin);
      response_->set_chunks_stored(writer_->chunks_stored());
      response_->set_committed(*committed);
      Finish(absl::OkStatus());
    });
  }

  void Fail(const absl::Status& status) {
    if (!status.ok()) {
      LOG(INFO) << "checkpoint upload"
                << (writer_ != nullptr ? absl::StrCat(" of ", PendingName(writer_->key())) : "")
                << " failed: " << status;
    }
    Finish(status);
  }

  void Finish(const absl::Status& status) {
    service_->metrics_->ObserveRpc("Checkpoints.Upload", StatusCodeLabel(status),
                                   absl::Now() - start_);
    grpc::ServerReadReactor<v1::UploadRequest>::Finish(ToGrpcStatus(status));
  }

  CheckpointsService* const service_;
  v1::UploadResponse* const response_;
  StreamSlot slot_;
  const absl::Time start_;
  v1::UploadRequest request_;
  std::unique_ptr<CheckpointUploads::Writer> writer_;
  v1::ChunkHeader chunk_;
  bool in_chunk_ = false;
  std::string buffer_;
};

// Streams chunks one at a time: read and verify (on the executor), then the
// chunk's header and its bytes in pieces, each write after the previous one
// completed. Deletes itself in OnDone.
class DownloadReactor : public grpc::ServerWriteReactor<v1::DownloadResponse> {
 public:
  DownloadReactor(CheckpointsService* service, const v1::DownloadRequest& request)
      : service_(service),
        request_(request),
        slot_(&service->downloads_active_, service->limits_.max_downloads),
        start_(absl::Now()) {
    service_->metrics_->SetCheckpointStreams("download", service_->downloads_active_.load());
    if (!slot_.acquired()) {
      Finish(absl::ResourceExhaustedError(absl::StrCat(
          "more than ", service_->limits_.max_downloads,
          " checkpoint downloads are in progress (limit: --max_checkpoint_downloads); retry later")));
      return;
    }
    service_->executor_->Schedule([this] { Open(); });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(absl::CancelledError("the client went away"));
    if (offset_ < bytes_.size()) return WriteNextPiece();
    service_->executor_->Schedule([this] { SendNextChunk(); });
  }

  void OnDone() override {
    service_->metrics_->SetCheckpointStreams("download", service_->downloads_active_.load() - 1);
    delete this;
  }

 private:
  void Open() {
    if (absl::Status s = RequireJobId(request_.job_id()); !s.ok()) return Finish(s);
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
        service_->store_->Open(JobId(request_.job_id()), request_.step());
    if (!reader.ok()) return Finish(reader.status());
    reader_ = std::move(*reader);
    const v1::CheckpointManifest& manifest = reader_->manifest();
    std::map<std::string, const v1::TensorInfo*> by_name;
    for (const v1::TensorInfo& t : manifest.tensors()) by_name[t.name()] = &t;
    if (request_.chunks().empty()) {
      for (const v1::TensorInfo& t : manifest.tensors()) {
        for (const v1::ChunkInfo& c : t.chunks()) todo_.push_back({&t, &c});
      }
    } else {
      for (const v1::ChunkRef& ref : request_.chunks()) {
        auto it = by_name.find(ref.tensor());
        if (it == by_name.end()) {
          return Finish(absl::NotFoundError(absl::StrCat(
              "chunks: checkpoint of job ", manifest.job_id(), " step ", manifest.step(),
              " has no tensor \"", ref.tensor(), "\"")));
        }
        if (ref.index() >= static_cast<uint32_t>(it->second->chunks_size())) {
          return Finish(absl::NotFoundError(absl::StrCat(
              "chunks: tensor ", ref.tensor(), " has ", it->second->chunks_size(),
              " chunks, no chunk ", ref.index())));
        }
        todo_.push_back({it->second, &it->second->chunks(static_cast<int>(ref.index()))});
      }
    }
    SendNextChunk();
  }

  void SendNextChunk() {
    if (next_ == todo_.size()) return Finish(absl::OkStatus());
    const auto [tensor, chunk] = todo_[next_++];
    absl::StatusOr<std::string> bytes = reader_->ReadChunk(*tensor, *chunk);
    if (!bytes.ok()) {
      LOG(WARNING) << "checkpoint download: " << bytes.status();
      return Finish(bytes.status());
    }
    bytes_ = std::move(*bytes);
    offset_ = 0;
    service_->metrics_->CheckpointTransfer("download", static_cast<int64_t>(bytes_.size()));
    response_.Clear();
    response_.mutable_chunk()->set_tensor(tensor->name());
    *response_.mutable_chunk()->mutable_info() = *chunk;
    StartWrite(&response_);
  }

  void WriteNextPiece() {
    const size_t n = std::min(service_->limits_.download_piece_bytes, bytes_.size() - offset_);
    response_.Clear();
    response_.set_data(bytes_.data() + offset_, n);
    offset_ += n;
    StartWrite(&response_);
  }

  void Finish(const absl::Status& status) {
    service_->metrics_->ObserveRpc("Checkpoints.Download", StatusCodeLabel(status),
                                   absl::Now() - start_);
    grpc::ServerWriteReactor<v1::DownloadResponse>::Finish(ToGrpcStatus(status));
  }

  CheckpointsService* const service_;
  const v1::DownloadRequest request_;
  StreamSlot slot_;
  const absl::Time start_;
  std::unique_ptr<CheckpointReader> reader_;
  std::vector<std::pair<const v1::TensorInfo*, const v1::ChunkInfo*>> todo_;
  size_t next_ = 0;
  std::string bytes_;
  size_t offset_ = 0;
  v1::DownloadResponse response_;
};

CheckpointsService::CheckpointsService(CheckpointUploads* uploads, CheckpointStore* store,
                                       BlockingExecutor* executor, CoordinatorMetrics* metrics,
                                       CheckpointsServiceLimits limits)
    : uploads_(uploads), store_(store), executor_(executor), metrics_(metrics), limits_(limits) {}

grpc::ServerReadReactor<v1::UploadRequest>* CheckpointsService::Upload(
    grpc::CallbackServerContext* context, v1::UploadResponse* response) {
  return new UploadReactor(this, response);
}

grpc::ServerWriteReactor<v1::DownloadResponse>* CheckpointsService::Download(
    grpc::CallbackServerContext* context, const v1::DownloadRequest* request) {
  return new DownloadReactor(this, *request);
}

namespace {

// Runs `work` on the executor and finishes the unary call with its status.
template <typename Work>
grpc::ServerUnaryReactor* RunUnary(grpc::CallbackServerContext* context,
                                   BlockingExecutor* executor, CoordinatorMetrics* metrics,
                                   const char* method, Work work) {
  auto* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  executor->Schedule([reactor, metrics, method, start, work = std::move(work)]() mutable {
    const absl::Status status = work();
    metrics->ObserveRpc(method, StatusCodeLabel(status), absl::Now() - start);
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* CheckpointsService::List(grpc::CallbackServerContext* context,
                                                   const v1::ListCheckpointsRequest* request,
                                                   v1::ListCheckpointsResponse* response) {
  return RunUnary(context, executor_, metrics_, "Checkpoints.List", [this, request, response] {
    if (absl::Status s = RequireJobId(request->job_id()); !s.ok()) return s;
    absl::StatusOr<std::vector<v1::CheckpointManifest>> listed =
        store_->List(JobId(request->job_id()));
    if (!listed.ok()) return listed.status();
    for (const v1::CheckpointManifest& m : *listed) {
      v1::CheckpointSummary* summary = response->add_checkpoints();
      summary->set_step(m.step());
      summary->set_generation(m.generation());
      *summary->mutable_layout() = m.layout();
      summary->set_total_bytes(m.total_bytes());
      summary->set_committed_unix_ms(m.committed_unix_ms());
      summary->set_tensors(m.tensors_size());
      int chunks = 0;
      for (const v1::TensorInfo& t : m.tensors()) chunks += t.chunks_size();
      summary->set_chunks(chunks);
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CheckpointsService::GetManifest(grpc::CallbackServerContext* context,
                                                          const v1::GetManifestRequest* request,
                                                          v1::CheckpointManifest* response) {
  return RunUnary(context, executor_, metrics_, "Checkpoints.GetManifest",
                  [this, request, response] {
                    if (absl::Status s = RequireJobId(request->job_id()); !s.ok()) return s;
                    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
                        store_->Open(JobId(request->job_id()), request->step());
                    if (!reader.ok()) return reader.status();
                    *response = (*reader)->manifest();
                    return absl::OkStatus();
                  });
}

grpc::ServerUnaryReactor* CheckpointsService::Delete(grpc::CallbackServerContext* context,
                                                     const v1::DeleteCheckpointRequest* request,
                                                     v1::DeleteCheckpointResponse* response) {
  return RunUnary(context, executor_, metrics_, "Checkpoints.Delete", [this, request] {
    if (absl::Status s = RequireJobId(request->job_id()); !s.ok()) return s;
    if (request->step() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("step: must be a checkpoint's step (>= 0), got ", request->step()));
    }
    absl::Status deleted = store_->Delete(JobId(request->job_id()), request->step());
    if (deleted.ok()) {
      LOG(INFO) << "deleted the checkpoint of job " << request->job_id() << " step "
                << request->step() << " on request";
    }
    return deleted;
  });
}

}  // namespace cohort::coordinator

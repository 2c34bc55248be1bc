// Longer than the ~600 lines docs/conventions.md asks for: the Checkpoints
// service's two stream reactors (the upload, about 270 lines, and the
// chunked download, about 250) and its unary calls share the stream-slot and
// reactor-lifetime classes defined here; moving a reactor out would give
// those a header of their own for the sake of one other file.

#include "coordinator/service/checkpoints_service.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <utility>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/crc32c.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/raw_bytes_message.h"
#include "coordinator/checkpoints/upload_framing.h"
#include "grpcpp/impl/codegen/proto_utils.h"

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

// Executor work of a reactor that must outlive neither it nor its OnDone:
// OnDone may come (after a cancellation) while a store call still runs, so
// whichever of the two ends last deletes the reactor. Thread-safe.
class ReactorLifetime {
 public:
  // Runs `work` on `executor`; `self` is deleted after it if OnDone came.
  template <typename Reactor>
  void Run(BlockingExecutor* executor, Reactor* self, std::function<void()> work) {
    {
      absl::MutexLock lock(&mu_);
      ++running_;
    }
    executor->Schedule([this, self, work = std::move(work)] {
      work();
      bool destroy = false;
      {
        absl::MutexLock lock(&mu_);
        destroy = --running_ == 0 && done_;
      }
      if (destroy) delete self;
    });
  }
  // From OnDone: true if the reactor may be deleted now.
  bool Done() {
    absl::MutexLock lock(&mu_);
    done_ = true;
    return running_ == 0;
  }

 private:
  absl::Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// One writer's Upload stream. Messages are read one at a time; a chunk
// whose bytes are complete is stored on the executor while the next one is
// received, with at most kChunksInFlight being stored, so the network and
// the store overlap and memory stays bounded (kChunksInFlight + 1 chunks).
// A store that completes may start the next read from the executor, so the
// next reaction can begin while the one that scheduled the store is still
// returning: a reaction touches the read state (request_, framing_,
// buffer_) only before it publishes its store under mu_. What executor work
// shares with reactions is under mu_. Deleted after OnDone (see
// ReactorLifetime).
//
// Messages arrive raw: a `data` message (nearly every byte of a checkpoint)
// is copied once, from gRPC's slices into the chunk buffer, its CRC computed
// piecewise on the way (common/raw_bytes_message.h); the others are parsed
// with protobuf.
class UploadReactor : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  static constexpr int kChunksInFlight = 2;

  UploadReactor(CheckpointsService* service, grpc::ByteBuffer* response,
                StreamLimiter::Lease lease, WorkerIdentity identity)
      : service_(service),
        response_(response),
        slot_(&service->uploads_active_, service->limits_.max_uploads),
        start_(absl::Now()),
        lease_(std::move(lease)),
        identity_(std::move(identity)),
        framing_(service->limits_.max_chunk_bytes) {
    service_->metrics_->SetCheckpointStreams("upload", service_->uploads_active_.load());
    if (!slot_.acquired()) {
      Fail(absl::ResourceExhaustedError(absl::StrCat(
          "more than ", service_->limits_.max_uploads,
          " checkpoint uploads are in progress (limit: --max_checkpoint_uploads); retry later")));
      return;
    }
    StartRead(&raw_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Fail(absl::InvalidArgumentError("the upload stream ended before its UploadEnd"));
      return;
    }
    if (std::optional<BytesFieldView> data =
            BytesFieldView::Of(raw_, v1::UploadRequest::kDataFieldNumber)) {
      return OnData(*data);
    }
    if (!grpc::SerializationTraits<v1::UploadRequest>::Deserialize(&raw_, &request_).ok()) {
      return Fail(absl::InvalidArgumentError("an UploadRequest that does not parse"));
    }
    switch (request_.part_case()) {
      case v1::UploadRequest::kHeader:
        return OnHeader();
      case v1::UploadRequest::kChunk:
        return OnChunk();
      case v1::UploadRequest::kData:
        return OnData(request_.data());
      case v1::UploadRequest::kEnd:
        return OnEnd();
      default:
        Fail(absl::InvalidArgumentError("an UploadRequest with no part set"));
    }
  }

  void OnDone() override {
    service_->metrics_->SetCheckpointStreams("upload", service_->uploads_active_.load() - 1);
    if (lifetime_.Done()) delete this;
  }

 private:
  void OnHeader() {
    if (absl::Status framed = framing_.OnHeader(); !framed.ok()) return Fail(framed);
    lifetime_.Run(service_->executor_, this, [this, header = request_.header()] {
      if (service_->participant_ != nullptr) {
        absl::Status allowed = service_->participant_(identity_, JobId(header.job_id()),
                                                      Generation(header.generation()));
        if (!allowed.ok()) return Fail(allowed);
      }
      absl::StatusOr<std::unique_ptr<CheckpointUploads::Writer>> writer =
          service_->uploads_->Begin(header);
      if (!writer.ok()) return Fail(writer.status());
      writer_ = std::move(*writer);
      StartRead(&raw_);
    });
  }

  void OnChunk() {
    if (absl::Status framed = framing_.OnChunk(request_.chunk()); !framed.ok()) {
      return Fail(framed);
    }
    const v1::ChunkHeader& chunk = framing_.chunk();
    buffer_ = TakeBuffer();
    if (!buffer_->Reset(chunk.bytes())) {
      buffer_.reset();
      return Fail(absl::ResourceExhaustedError(
          absl::StrCat("chunk.bytes: no memory for a chunk of ", chunk.bytes(), " bytes")));
    }
    StartRead(&raw_);
  }

  // `data`: a BytesFieldView, or the bytes of a parsed message.
  template <typename Data>
  void OnData(const Data& data) {
    absl::StatusOr<bool> complete = framing_.OnData(data.size());
    if (!complete.ok()) return Fail(complete.status());
    buffer_->Append(data);
    if (!*complete) return StartRead(&raw_);
    // Captured before the store can complete: once it has, the next read
    // may be started from the executor and the next reaction reuses framing_
    // and buffer_ while this one is still returning.
    auto store = [this, chunk = framing_.chunk(), bytes = std::move(buffer_)] {
      const absl::Status stored = writer_->AddChunk(chunk, bytes->view(), bytes->crc32c);
      if (stored.ok()) {
        service_->metrics_->CheckpointTransfer("upload", static_cast<int64_t>(bytes->size));
      }
      absl::Status fail;
      bool read = false, end = false;
      {
        absl::MutexLock lock(&mu_);
        spare_.push_back(bytes);  // its memory serves the next chunk
        --storing_;
        if (!stored.ok() && failure_.ok()) failure_ = stored;
        if (!failure_.ok()) {
          // Finish once nothing is being stored, with the first failure.
          if (storing_ == 0 && !failure_reported_) {
            failure_reported_ = true;
            fail = failure_;
          }
        } else {
          end = storing_ == 0 && pending_end_.has_value();
          read = !end && waiting_to_read_;
          if (read) waiting_to_read_ = false;
        }
      }
      if (!fail.ok()) return Fail(fail);
      if (end) return RunEnd();
      if (read) StartRead(&raw_);
    };
    bool read_now = false;
    {
      absl::MutexLock lock(&mu_);
      ++storing_;
      read_now = storing_ < kChunksInFlight;
      waiting_to_read_ = !read_now;
      // Scheduled (and counted by lifetime_) before an earlier store can
      // start the next read, whose reaction may end the call.
      lifetime_.Run(service_->executor_, this, std::move(store));
    }
    if (read_now) StartRead(&raw_);
  }

  void OnEnd() {
    if (absl::Status framed = framing_.OnEnd(); !framed.ok()) return Fail(framed);
    bool now = false;
    {
      absl::MutexLock lock(&mu_);
      pending_end_ = request_.end();
      now = storing_ == 0 && failure_.ok();
    }
    // Otherwise the last chunk's completion calls RunEnd (or fails).
    if (now) RunEnd();
  }

  // One chunk's bytes as they arrive, and their CRC-32C so far. Not a
  // std::string: growing one would zero the memory first, a pass over every
  // byte for nothing.
  struct ChunkBuffer {
    std::unique_ptr<char[]> data;
    size_t capacity = 0;
    size_t size = 0;
    uint32_t crc32c = 0;

    // False when the memory cannot be had: no exception may leave a
    // reactor (the call would never finish, its slots never freed).
    bool Reset(size_t bytes) {
      if (bytes > capacity) {
        data.reset(new (std::nothrow) char[bytes]);
        capacity = data != nullptr ? bytes : 0;
        if (data == nullptr) return false;
      }
      size = 0;
      crc32c = 0;
      return true;
    }
    void Append(const BytesFieldView& piece) {
      crc32c = piece.CopyAndExtendCrc32c(data.get() + size, crc32c);
      size += piece.size();
    }
    void Append(const std::string& piece) {
      std::memcpy(data.get() + size, piece.data(), piece.size());
      crc32c = Crc32cExtend(crc32c, piece.data(), piece.size());
      size += piece.size();
    }
    std::string_view view() const { return std::string_view(data.get(), size); }
  };

  // A chunk buffer: a spare one (paged in already) when there is one.
  std::shared_ptr<ChunkBuffer> TakeBuffer() {
    absl::MutexLock lock(&mu_);
    if (spare_.empty()) return std::make_shared<ChunkBuffer>();
    std::shared_ptr<ChunkBuffer> buffer = std::move(spare_.back());
    spare_.pop_back();
    return buffer;
  }

  // Ends the writer on the executor; every chunk is stored by now.
  void RunEnd() {
    v1::UploadEnd end;
    {
      absl::MutexLock lock(&mu_);
      end = *pending_end_;
    }
    lifetime_.Run(service_->executor_, this, [this, end] {
      const absl::Time begin = absl::Now();
      absl::StatusOr<bool> committed = writer_->End(end);
      if (!committed.ok()) return Fail(committed.status());
      if (*committed) service_->metrics_->CheckpointCommitted(absl::Now() - begin);
      v1::UploadResponse response;
      response.set_chunks_stored(writer_->chunks_stored());
      response.set_committed(*committed);
      bool own_buffer = false;
      if (!grpc::SerializationTraits<v1::UploadResponse>::Serialize(response, response_,
                                                                    &own_buffer)
               .ok()) {
        return Fail(absl::InternalError("cannot serialize the UploadResponse"));
      }
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

  // Finishes the call once; later calls do nothing.
  void Finish(const absl::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    service_->metrics_->ObserveRpc("Checkpoints.Upload", StatusCodeLabel(status),
                                   absl::Now() - start_);
    grpc::ServerReadReactor<grpc::ByteBuffer>::Finish(ToGrpcStatus(status));
  }

  CheckpointsService* const service_;
  grpc::ByteBuffer* const response_;
  StreamSlot slot_;
  const absl::Time start_;
  StreamLimiter::Lease lease_;  // this client's stream slot
  const WorkerIdentity identity_;  // who the client certificate may act as
  ReactorLifetime lifetime_;
  // Reactions only (they never overlap); writer_ is set before any executor
  // work that uses it is scheduled.
  grpc::ByteBuffer raw_;
  v1::UploadRequest request_;  // raw_ parsed, unless it was data
  std::unique_ptr<CheckpointUploads::Writer> writer_;
  UploadFraming framing_;
  std::shared_ptr<ChunkBuffer> buffer_;
  // Shared by reactions and executor work.
  absl::Mutex mu_;
  int storing_ ABSL_GUARDED_BY(mu_) = 0;
  bool waiting_to_read_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool failure_reported_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<v1::UploadEnd> pending_end_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<ChunkBuffer>> spare_ ABSL_GUARDED_BY(mu_);  // at most kChunksInFlight
};

// Streams chunks in the requested order. Up to kReadAhead chunks are read
// and verified on the executor at once, ahead of the one being sent, so disk
// reads overlap each other (a single O_DIRECT read leaves the disk idle while
// its bytes are copied and checked) and the network; memory stays bounded
// (kReadAhead + 1 chunks). A chunk is sent as its header, then its bytes in
// pieces, each write after the previous one completed. Data messages are
// raw: their slices refer to the chunk read from the store and hold a
// reference to it until gRPC lets go (common/raw_bytes_message.h).
// Deleted after OnDone (see ReactorLifetime).
class DownloadReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  static constexpr size_t kReadAhead = 3;

  DownloadReactor(CheckpointsService* service, const v1::DownloadRequest& request,
                  StreamLimiter::Lease lease)
      : service_(service),
        request_(request),
        slot_(&service->downloads_active_, service->limits_.max_downloads),
        start_(absl::Now()),
        lease_(std::move(lease)) {
    service_->metrics_->SetCheckpointStreams("download", service_->downloads_active_.load());
    if (!slot_.acquired()) {
      Finish(absl::ResourceExhaustedError(absl::StrCat(
          "more than ", service_->limits_.max_downloads,
          " checkpoint downloads are in progress (limit: --max_checkpoint_downloads); retry later")));
      return;
    }
    lifetime_.Run(service_->executor_, this, [this] { Open(); });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(absl::CancelledError("the client went away"));
    if (offset_ < current_.size()) return WriteNextPiece();
    std::optional<Read> next;
    bool done = false;
    {
      absl::MutexLock lock(&mu_);
      done = next_send_ == todo_.size();
      if (!done) {
        next = TakeNextLocked();
        if (!next) sending_ = false;  // its read will send it
      }
    }
    if (done) return Finish(absl::OkStatus());
    if (next) Send(*std::move(next));
  }

  void OnDone() override {
    service_->metrics_->SetCheckpointStreams("download", service_->downloads_active_.load() - 1);
    if (lifetime_.Done()) delete this;
  }

 private:
  struct Read {
    const v1::TensorInfo* tensor = nullptr;
    const v1::ChunkInfo* chunk = nullptr;
    absl::StatusOr<ChunkBytes> bytes;
  };

  void Open() {
    if (absl::Status s = RequireJobId(request_.job_id()); !s.ok()) return Finish(s);
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
        service_->store_->Open(JobId(request_.job_id()), StepOrNewest(request_.step()));
    if (!reader.ok()) return Finish(reader.status());
    reader_ = std::move(*reader);
    const v1::CheckpointManifest& manifest = reader_->manifest();
    std::map<std::string, const v1::TensorInfo*> by_name;
    for (const v1::TensorInfo& t : manifest.tensors()) by_name[t.name()] = &t;
    std::vector<std::pair<const v1::TensorInfo*, const v1::ChunkInfo*>> todo;
    if (request_.chunks().empty()) {
      for (const v1::TensorInfo& t : manifest.tensors()) {
        for (const v1::ChunkInfo& c : t.chunks()) todo.push_back({&t, &c});
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
        todo.push_back({it->second, &it->second->chunks(static_cast<int>(ref.index()))});
      }
    }
    if (todo.empty()) return Finish(absl::OkStatus());
    absl::MutexLock lock(&mu_);
    todo_ = std::move(todo);
    ScheduleReadsLocked();
  }

  // Starts reads until kReadAhead chunks are read or being read ahead of the
  // next one to send. Each is counted by lifetime_ before it is scheduled.
  void ScheduleReadsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (next_read_ < todo_.size() && next_read_ - next_send_ < kReadAhead && !finished_) {
      const size_t index = next_read_++;
      lifetime_.Run(service_->executor_, this, [this, index] { ReadOne(index); });
    }
  }

  // Executor thread: reads chunk `index` and sends it at once if it is the
  // next one and nothing is being sent.
  void ReadOne(size_t index) {
    const v1::TensorInfo* tensor;
    const v1::ChunkInfo* chunk;
    {
      absl::MutexLock lock(&mu_);
      std::tie(tensor, chunk) = todo_[index];
    }
    Read read{tensor, chunk, reader_->ReadChunk(*tensor, *chunk)};
    std::optional<Read> send;
    {
      absl::MutexLock lock(&mu_);
      ready_.emplace(index, std::move(read));
      if (!sending_ && !finished_) {
        send = TakeNextLocked();
        if (send) sending_ = true;
      }
    }
    if (send) Send(*std::move(send));
  }

  // The next chunk to send if its read is complete; schedules the reads
  // that its removal makes room for.
  std::optional<Read> TakeNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = ready_.find(next_send_);
    if (it == ready_.end()) return std::nullopt;
    Read read = std::move(it->second);
    ready_.erase(it);
    ++next_send_;
    ScheduleReadsLocked();
    return read;
  }

  // Writes the header of `read`'s chunk; its bytes follow in OnWriteDone.
  // Only one Send (and its writes) runs at a time (sending_).
  void Send(Read read) {
    if (!read.bytes.ok()) {
      LOG(WARNING) << "checkpoint download: " << read.bytes.status();
      return Finish(read.bytes.status());
    }
    current_ = *std::move(read.bytes);
    offset_ = 0;
    service_->metrics_->CheckpointTransfer("download", static_cast<int64_t>(current_.size()));
    v1::DownloadResponse header;
    header.mutable_chunk()->set_tensor(read.tensor->name());
    *header.mutable_chunk()->mutable_info() = *read.chunk;
    message_.Clear();
    bool own = false;
    if (!grpc::SerializationTraits<v1::DownloadResponse>::Serialize(header, &message_, &own).ok()) {
      return Finish(absl::InternalError("cannot serialize a DownloadResponse"));
    }
    StartWrite(&message_);
  }

  void WriteNextPiece() {
    const size_t n = std::min(service_->limits_.download_piece_bytes, current_.size() - offset_);
    // Each message's slice keeps the chunk alive for as long as gRPC holds it.
    auto* hold = new ChunkBytes(current_);
    message_ = BytesFieldMessage(
        v1::DownloadResponse::kDataFieldNumber, current_.data() + offset_, n,
        [](void* held) { delete static_cast<ChunkBytes*>(held); }, hold);
    offset_ += n;
    StartWrite(&message_);
  }

  // Finishes the call once; later calls do nothing.
  void Finish(const absl::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    service_->metrics_->ObserveRpc("Checkpoints.Download", StatusCodeLabel(status),
                                   absl::Now() - start_);
    grpc::ServerWriteReactor<grpc::ByteBuffer>::Finish(ToGrpcStatus(status));
  }

  CheckpointsService* const service_;
  const v1::DownloadRequest request_;
  StreamSlot slot_;
  const absl::Time start_;
  StreamLimiter::Lease lease_;  // this client's stream slot
  ReactorLifetime lifetime_;
  std::unique_ptr<CheckpointReader> reader_;  // set before any read is scheduled
  // The sender's state: one chunk is sent at a time, by reactions or by the
  // read that completes while nothing is being sent, never both (sending_).
  ChunkBytes current_;
  size_t offset_ = 0;
  grpc::ByteBuffer message_;  // the one being written
  absl::Mutex mu_;
  // Written once before the first read is scheduled.
  std::vector<std::pair<const v1::TensorInfo*, const v1::ChunkInfo*>> todo_ ABSL_GUARDED_BY(mu_);
  size_t next_read_ ABSL_GUARDED_BY(mu_) = 0;          // todo_ index of the next read to start
  size_t next_send_ ABSL_GUARDED_BY(mu_) = 0;          // todo_ index of the next chunk to send
  std::map<size_t, Read> ready_ ABSL_GUARDED_BY(mu_);  // reads done, not yet sent
  bool sending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

CheckpointsService::CheckpointsService(CheckpointUploads* uploads, CheckpointStore* store,
                                       BlockingExecutor* executor, CoordinatorMetrics* metrics,
                                       const CallGate* gate, CheckpointsServiceLimits limits,
                                       ParticipantCheck participant)
    : uploads_(uploads),
      store_(store),
      executor_(executor),
      metrics_(metrics),
      gate_(gate),
      limits_(limits),
      participant_(std::move(participant)) {}

grpc::ServerReadReactor<grpc::ByteBuffer>* CheckpointsService::Upload(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  absl::StatusOr<StreamLimiter::Lease> lease =
      gate_->AdmitStream(*context, "Checkpoints.Upload", Access::kWorker);
  if (!lease.ok()) return new RejectedReader<grpc::ByteBuffer>(lease.status());
  return new UploadReactor(this, response, *std::move(lease), gate_->IdentityOf(*context));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* CheckpointsService::Download(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request) {
  absl::StatusOr<StreamLimiter::Lease> lease =
      gate_->AdmitStream(*context, "Checkpoints.Download", Access::kWorkerOrRead);
  if (!lease.ok()) return new RejectedWriter<grpc::ByteBuffer>(lease.status());
  grpc::ByteBuffer copy(*raw_request);  // refers to the same slices
  v1::DownloadRequest request;
  if (!grpc::SerializationTraits<v1::DownloadRequest>::Deserialize(&copy, &request).ok()) {
    return new RejectedWriter<grpc::ByteBuffer>(
        absl::InvalidArgumentError("a DownloadRequest that does not parse"));
  }
  return new DownloadReactor(this, request, *std::move(lease));
}

namespace {

// Admits the call, runs `work` on the executor and finishes the unary call
// with its status.
template <typename Work>
grpc::ServerUnaryReactor* RunUnary(grpc::CallbackServerContext* context, const CallGate* gate,
                                   Access access, BlockingExecutor* executor,
                                   CoordinatorMetrics* metrics, const char* method, Work work) {
  if (absl::Status admitted = gate->Admit(*context, method, access); !admitted.ok()) {
    return CallGate::Refuse(context, admitted);
  }
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
  return RunUnary(context, gate_, Access::kWorkerOrRead, executor_, metrics_, "Checkpoints.List", [this, request, response] {
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
  return RunUnary(context, gate_, Access::kWorkerOrRead, executor_, metrics_, "Checkpoints.GetManifest",
                  [this, request, response] {
                    if (absl::Status s = RequireJobId(request->job_id()); !s.ok()) return s;
                    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
                        store_->Open(JobId(request->job_id()), StepOrNewest(request->step()));
                    if (!reader.ok()) return reader.status();
                    *response = (*reader)->manifest();
                    return absl::OkStatus();
                  });
}

grpc::ServerUnaryReactor* CheckpointsService::Delete(grpc::CallbackServerContext* context,
                                                     const v1::DeleteCheckpointRequest* request,
                                                     v1::DeleteCheckpointResponse* response) {
  return RunUnary(context, gate_, Access::kAdmin, executor_, metrics_, "Checkpoints.Delete", [this, request] {
    if (absl::Status s = RequireJobId(request->job_id()); !s.ok()) return s;
    if (request->step() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("step: must be a checkpoint's step (>= 0), got ", request->step()));
    }
    absl::Status deleted = store_->Delete(JobId(request->job_id()), Step(request->step()));
    if (deleted.ok()) {
      LOG(INFO) << "deleted the checkpoint of job " << request->job_id() << " step "
                << request->step() << " on request";
    }
    return deleted;
  });
}

}  // namespace cohort::coordinator

#include "client/checkpoint_client.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cohort/v1/checkpoints.grpc.pb.h"
#include "common/box_proto.h"
#include "common/crc32c.h"
#include "common/grpc_status.h"
#include "common/raw_bytes_message.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace cohort::client {
namespace {

void Prepare(grpc::ClientContext* context, absl::Duration timeout, bool wait_for_ready) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::microseconds(absl::ToInt64Microseconds(timeout)));
  context->set_wait_for_ready(wait_for_ready);
}

// A raw (ByteBuffer) call through the generic stub, one operation at a time
// on a private completion queue: as blocking as a generated sync stream, and
// with the same flow control. Finish must end every call.
class RawCall {
 public:
  RawCall(grpc::GenericStub* stub, grpc::ClientContext* context, const char* method)
      : context_(context), call_(stub->PrepareCall(context, method, &queue_)) {
    call_->StartCall(nullptr);
    ok_ = Wait();
  }
  ~RawCall() {
    if (!finished_) {
      context_->TryCancel();
      Finish();
    }
  }

  // Each returns false once the call has failed or (Read) the stream ended;
  // Finish says which.
  bool Write(const grpc::ByteBuffer& message) {
    if (!ok_) return false;
    call_->Write(message, nullptr);
    return ok_ = Wait();
  }
  template <typename Message>
  bool WriteMessage(const Message& message) {
    grpc::ByteBuffer buffer;
    bool own = false;
    if (!grpc::SerializationTraits<Message>::Serialize(message, &buffer, &own).ok()) {
      return ok_ = false;
    }
    return Write(buffer);
  }
  bool WritesDone() {
    if (!ok_) return false;
    call_->WritesDone(nullptr);
    return ok_ = Wait();
  }
  bool Read(grpc::ByteBuffer* message) {
    if (!ok_) return false;
    call_->Read(message, nullptr);
    return ok_ = Wait();
  }
  grpc::Status Finish() {
    grpc::Status status;
    call_->Finish(&status, nullptr);
    Wait();
    finished_ = true;
    queue_.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (queue_.Next(&tag, &ok)) {
    }
    return status;
  }

 private:
  // The only operation outstanding is the one whose event comes next.
  bool Wait() {
    void* tag = nullptr;
    bool ok = false;
    return queue_.Next(&tag, &ok) && ok;
  }

  grpc::ClientContext* const context_;
  grpc::CompletionQueue queue_;  // outlives call_
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  bool ok_ = false;
  bool finished_ = false;
};

// Thread-safe: the stub is; each call has its own context.
class GrpcCheckpointClient final : public CheckpointClient {
 public:
  GrpcCheckpointClient(std::shared_ptr<grpc::Channel> channel, bool wait_for_ready)
      : stub_(v1::Checkpoints::NewStub(channel)),
        generic_(std::move(channel)),
        wait_for_ready_(wait_for_ready) {}

  // Sent raw, so that chunk bytes go from the caller's memory to the socket
  // without protobuf copies (the wire format is the generated code's;
  // common/raw_bytes_message.h).
  absl::StatusOr<v1::UploadResponse> Upload(const v1::UploadHeader& header,
                                            const std::vector<UploadChunk>& chunks,
                                            const v1::UploadEnd& end,
                                            absl::Duration timeout) override {
    grpc::ClientContext context;
    Prepare(&context, timeout, wait_for_ready_);
    RawCall call(&generic_, &context, "/cohort.v1.Checkpoints/Upload");
    v1::UploadRequest request;
    *request.mutable_header() = header;
    bool ok = call.WriteMessage(request);
    for (size_t i = 0; ok && i < chunks.size(); ++i) {
      const UploadChunk& chunk = chunks[i];
      request.Clear();
      v1::ChunkHeader* h = request.mutable_chunk();
      h->set_tensor(chunk.tensor);
      BoxToProto(chunk.box, h->mutable_box());
      h->set_bytes(chunk.bytes);
      h->set_crc32c(Crc32c(chunk.data, chunk.bytes));
      ok = call.WriteMessage(request);
      const char* bytes = static_cast<const char*>(chunk.data);
      for (size_t at = 0; ok && at < chunk.bytes; at += kUploadPieceBytes) {
        ok = call.Write(BytesFieldMessage(v1::UploadRequest::kDataFieldNumber, bytes + at,
                                     std::min(kUploadPieceBytes, chunk.bytes - at)));
      }
    }
    if (ok) {
      request.Clear();
      *request.mutable_end() = end;
      ok = call.WriteMessage(request);
    }
    // A failed operation means the server finished the call (with the
    // reason) or the connection broke; Finish reports which.
    grpc::ByteBuffer reply;
    ok = ok && call.WritesDone() && call.Read(&reply);
    const grpc::Status status = call.Finish();
    const std::string what = absl::StrCat("upload of job ", header.job_id(), " step ",
                                          header.step(), " writer ", header.writer());
    if (!status.ok()) return FromGrpcStatus(status, what);
    v1::UploadResponse response;
    if (!ok ||
        !grpc::SerializationTraits<v1::UploadResponse>::Deserialize(&reply, &response).ok()) {
      return absl::InternalError(absl::StrCat(what, ": the coordinator's reply does not parse"));
    }
    return response;
  }

  absl::StatusOr<v1::CheckpointManifest> GetManifest(const std::string& job_id, int64_t step,
                                                     absl::Duration timeout) override {
    grpc::ClientContext context;
    Prepare(&context, timeout, wait_for_ready_);
    v1::GetManifestRequest request;
    request.set_job_id(job_id);
    request.set_step(step);
    v1::CheckpointManifest manifest;
    grpc::Status status = stub_->GetManifest(&context, request, &manifest);
    if (!status.ok()) return FromGrpcStatus(status);
    return manifest;
  }

  // Received raw, like Upload is sent: a data message is copied once, from
  // gRPC's slices into the chunk's placement or else the chunk buffer, its
  // CRC computed on the way.
  using CheckpointClient::Download;
  absl::Status Download(const std::string& job_id, int64_t step,
                        const std::vector<v1::ChunkRef>& refs, const ChunkPlacement& place,
                        const ChunkCallback& on_chunk, absl::Duration timeout) override {
    grpc::ClientContext context;
    Prepare(&context, timeout, wait_for_ready_);
    RawCall call(&generic_, &context, "/cohort.v1.Checkpoints/Download");
    v1::DownloadRequest request;
    request.set_job_id(job_id);
    request.set_step(step);
    for (const v1::ChunkRef& ref : refs) *request.add_chunks() = ref;
    const bool ok = call.WriteMessage(request) && call.WritesDone();
    v1::DownloadResponse response;
    v1::DownloadChunk current;
    bool in_chunk = false;
    std::unique_ptr<char[]> buffer;
    size_t capacity = 0, size = 0;
    char* bytes = nullptr;  // where the current chunk goes: `buffer` or its placement
    uint32_t crc = 0;
    absl::Status failure;
    auto where = [&] {
      return absl::StrCat("tensor ", current.tensor(), " chunk ", current.info().index());
    };
    grpc::ByteBuffer received;
    while (ok && failure.ok()) {
      if (!call.Read(&received)) break;  // the stream ended; Finish says how
      std::optional<BytesFieldView> data =
          BytesFieldView::Of(received, v1::DownloadResponse::kDataFieldNumber);
      if (!data) {
        if (!grpc::SerializationTraits<v1::DownloadResponse>::Deserialize(&received, &response)
                 .ok()) {
          failure = absl::InternalError("download: a DownloadResponse that does not parse");
          break;
        }
      }
      if (!data && response.has_chunk()) {
        if (in_chunk) {
          failure = absl::DataLossError(absl::StrCat(where(), " ended early"));
          break;
        }
        current = response.chunk();
        bytes = place ? static_cast<char*>(place(current.tensor(), current.info())) : nullptr;
        if (bytes == nullptr && current.info().bytes() > capacity) {
          capacity = current.info().bytes();
          buffer.reset(new char[capacity]);
        }
        if (bytes == nullptr) bytes = buffer.get();
        size = 0;
        crc = 0;
        in_chunk = true;
      } else if (in_chunk) {
        const size_t n = data ? data->size() : response.data().size();
        if (size + n > current.info().bytes()) {
          failure = absl::DataLossError(absl::StrCat(where(), " is too long"));
          break;
        }
        if (data) {
          crc = data->CopyAndExtendCrc32c(bytes + size, crc);
        } else {
          std::memcpy(bytes + size, response.data().data(), n);
          crc = Crc32cExtend(crc, response.data().data(), n);
        }
        size += n;
      } else {
        failure = absl::InternalError("download: data outside a chunk");
        break;
      }
      if (in_chunk && size == current.info().bytes()) {
        in_chunk = false;
        if (crc != current.info().crc32c()) {
          failure = absl::DataLossError(absl::StrCat("checkpoint of job ", job_id, " step ", step,
                                                     ": ", where(),
                                                     " arrived corrupt (crc32c mismatch)"));
        } else {
          failure = on_chunk(current.tensor(), current.info(), std::string_view(bytes, size));
        }
      }
    }
    if (!failure.ok()) context.TryCancel();
    const grpc::Status status = call.Finish();
    if (!failure.ok()) return failure;
    if (!status.ok()) return FromGrpcStatus(status);
    if (in_chunk) return absl::DataLossError(absl::StrCat(where(), " was cut short"));
    return absl::OkStatus();
  }

  absl::StatusOr<v1::ListCheckpointsResponse> List(const std::string& job_id,
                                                   absl::Duration timeout) override {
    grpc::ClientContext context;
    Prepare(&context, timeout, wait_for_ready_);
    v1::ListCheckpointsRequest request;
    request.set_job_id(job_id);
    v1::ListCheckpointsResponse response;
    grpc::Status status = stub_->List(&context, request, &response);
    if (!status.ok()) return FromGrpcStatus(status);
    return response;
  }

  absl::Status Delete(const std::string& job_id, int64_t step, absl::Duration timeout) override {
    grpc::ClientContext context;
    Prepare(&context, timeout, wait_for_ready_);
    v1::DeleteCheckpointRequest request;
    request.set_job_id(job_id);
    request.set_step(step);
    v1::DeleteCheckpointResponse response;
    return FromGrpcStatus(stub_->Delete(&context, request, &response));
  }

 private:
  std::unique_ptr<v1::Checkpoints::Stub> stub_;
  grpc::GenericStub generic_;
  const bool wait_for_ready_;
};

}  // namespace

std::unique_ptr<CheckpointClient> NewGrpcCheckpointClient(std::shared_ptr<grpc::Channel> channel,
                                                          bool wait_for_ready) {
  return std::make_unique<GrpcCheckpointClient>(std::move(channel), wait_for_ready);
}

std::unique_ptr<CheckpointClient> NewGrpcCheckpointClient(const CoordinatorTarget& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxReceiveMessageSize(64 << 20);  // manifests of very large models
  return NewGrpcCheckpointClient(target.NewChannel(args), /*wait_for_ready=*/true);
}

}  // namespace cohort::client

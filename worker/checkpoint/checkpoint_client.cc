#include "worker/checkpoint/checkpoint_client.h"

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

namespace cohort::checkpoint {
namespace {

void Prepare(grpc::ClientContext* context, absl::Duration timeout, bool wait_for_ready) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::microseconds(absl::ToInt64Microseconds(timeout)));
  context->set_wait_for_ready(wait_for_ready);
}

// Thread-safe: the stub is; each call has its own context.
class GrpcCheckpointClient final : public CheckpointClient {
 public:
  GrpcCheckpointClient(std::shared_ptr<grpc::Channel> channel, bool wait_for_ready)
      : stub_(v1::Checkpoints::NewStub(channel)),
        generic_(std::move(channel)),
        wait_for_ready_(wait_for_ready) {}

  // Sent raw through the generic stub, so that chunk bytes go from the
  // caller's memory to the socket without protobuf copies (the wire format is
  // the generated code's; common/raw_bytes_message.h). One operation at a
  // time on a private completion queue: the call is as blocking as a
  // generated ClientWriter, and its flow control the same.
  absl::StatusOr<v1::UploadResponse> Upload(const v1::UploadHeader& header,
                                            const std::vector<UploadChunk>& chunks,
                                            const v1::UploadEnd& end,
                                            absl::Duration timeout) override {
    grpc::ClientContext context;
    Prepare(&context, timeout, wait_for_ready_);
    grpc::CompletionQueue queue;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
        generic_.PrepareCall(&context, "/cohort.v1.Checkpoints/Upload", &queue);
    // Each operation is the only one outstanding, so the next event is its.
    auto wait = [&queue] {
      void* tag = nullptr;
      bool ok = false;
      return queue.Next(&tag, &ok) && ok;
    };
    auto write = [&](const grpc::ByteBuffer& message) {
      call->Write(message, nullptr);
      return wait();
    };
    auto write_message = [&](const v1::UploadRequest& request) {
      grpc::ByteBuffer message;
      bool own = false;
      return grpc::SerializationTraits<v1::UploadRequest>::Serialize(request, &message, &own)
                 .ok() &&
             write(message);
    };
    call->StartCall(nullptr);
    bool ok = wait();
    v1::UploadRequest request;
    if (ok) {
      *request.mutable_header() = header;
      ok = write_message(request);
    }
    for (size_t i = 0; ok && i < chunks.size(); ++i) {
      const UploadChunk& chunk = chunks[i];
      request.Clear();
      v1::ChunkHeader* h = request.mutable_chunk();
      h->set_tensor(chunk.tensor);
      BoxToProto(chunk.box, h->mutable_box());
      h->set_bytes(chunk.bytes);
      h->set_crc32c(Crc32c(chunk.data, chunk.bytes));
      ok = write_message(request);
      const char* bytes = static_cast<const char*>(chunk.data);
      for (size_t at = 0; ok && at < chunk.bytes; at += kUploadPieceBytes) {
        ok = write(BytesFieldMessage(v1::UploadRequest::kDataFieldNumber, bytes + at,
                                     std::min(kUploadPieceBytes, chunk.bytes - at)));
      }
    }
    if (ok) {
      request.Clear();
      *request.mutable_end() = end;
      ok = write_message(request);
    }
    // A failed operation means the server finished the call (with the
    // reason) or the connection broke; Finish reports which.
    grpc::ByteBuffer reply;
    if (ok) {
      call->WritesDone(nullptr);
      ok = wait();
    }
    if (ok) {
      call->Read(&reply, nullptr);
      ok = wait();
    }
    grpc::Status status;
    call->Finish(&status, nullptr);
    wait();
    queue.Shutdown();
    void* tag = nullptr;
    bool drained_ok = false;
    while (queue.Next(&tag, &drained_ok)) {
    }
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
  // gRPC's slices into the chunk buffer, its CRC computed on the way.
  absl::Status Download(const std::string& job_id, int64_t step,
                        const std::vector<v1::ChunkRef>& refs, const ChunkCallback& on_chunk,
                        absl::Duration timeout) override {
    grpc::ClientContext context;
    Prepare(&context, timeout, wait_for_ready_);
    grpc::CompletionQueue queue;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
        generic_.PrepareCall(&context, "/cohort.v1.Checkpoints/Download", &queue);
    auto wait = [&queue] {
      void* tag = nullptr;
      bool ok = false;
      return queue.Next(&tag, &ok) && ok;
    };
    v1::DownloadRequest request;
    request.set_job_id(job_id);
    request.set_step(step);
    for (const v1::ChunkRef& ref : refs) *request.add_chunks() = ref;
    grpc::ByteBuffer message;
    bool own = false;
    if (!grpc::SerializationTraits<v1::DownloadRequest>::Serialize(request, &message, &own).ok()) {
      return absl::InternalError("cannot serialize a DownloadRequest");
    }
    call->StartCall(nullptr);
    bool ok = wait();
    if (ok) {
      call->Write(message, nullptr);
      ok = wait();
    }
    if (ok) {
      call->WritesDone(nullptr);
      ok = wait();
    }
    v1::DownloadResponse response;
    v1::DownloadChunk current;
    bool in_chunk = false;
    std::unique_ptr<char[]> bytes;
    size_t capacity = 0, size = 0;
    uint32_t crc = 0;
    absl::Status failure;
    auto where = [&] {
      return absl::StrCat("tensor ", current.tensor(), " chunk ", current.info().index());
    };
    grpc::ByteBuffer received;
    while (ok && failure.ok()) {
      call->Read(&received, nullptr);
      if (!wait()) break;  // the stream ended; Finish says how
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
        if (current.info().bytes() > capacity) {
          capacity = current.info().bytes();
          bytes.reset(new char[capacity]);
        }
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
          crc = data->CopyAndExtendCrc32c(bytes.get() + size, crc);
        } else {
          std::memcpy(bytes.get() + size, response.data().data(), n);
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
          failure = on_chunk(current.tensor(), current.info(), std::string_view(bytes.get(), size));
        }
      }
    }
    if (!failure.ok()) context.TryCancel();
    grpc::Status status;
    call->Finish(&status, nullptr);
    wait();
    queue.Shutdown();
    void* tag = nullptr;
    bool drained_ok = false;
    while (queue.Next(&tag, &drained_ok)) {
    }
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

}  // namespace cohort::checkpoint

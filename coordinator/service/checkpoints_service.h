#pragma once
// gRPC glue for cohort.v1.Checkpoints (callback API). Uploads feed
// CheckpointUploads; reads go to the CheckpointStore. Every store call runs
// on a BlockingExecutor, never on a gRPC thread. An upload stream holds at
// most 3 chunks in memory and a download stream 4 (the one being sent and
// those read ahead), and the number of concurrent streams is capped, which
// bounds the coordinator's memory: (3 x max_uploads + 4 x max_downloads) x
// max_chunk_bytes.

#include <atomic>
#include <functional>

#include "cohort/v1/checkpoints.grpc.pb.h"
#include "coordinator/checkpoints/checkpoint_store.h"
#include "coordinator/checkpoints/checkpoint_uploads.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/membership/worker_identity.h"
#include "coordinator/service/blocking_executor.h"
#include "coordinator/service/call_gate.h"

namespace cohort::coordinator {

struct CheckpointsServiceLimits {
  int max_uploads = 64;    // concurrent Upload streams
  int max_downloads = 64;  // concurrent Download streams
  int64_t max_chunk_bytes = 64 << 20;
  // Bytes per `data` message sent; clients must accept messages this large
  // (Cohort's do: 64 MiB).
  size_t download_piece_bytes = 1 << 20;
};

// Whether a caller may act as a participant of a job generation
// (Coordinator::CheckParticipant): an upload's header must name a
// generation the caller's certificate is a member or donor of.
using ParticipantCheck =
    std::function<absl::Status(const WorkerIdentity&, const JobId&, Generation)>;

// Thread-safe.
// Upload and Download are registered raw (ByteBuffer messages) to move chunk
// bytes without protobuf copies; their wire format is unchanged.
class CheckpointsService final
    : public v1::Checkpoints::WithRawCallbackMethod_Upload<
          v1::Checkpoints::WithRawCallbackMethod_Download<v1::Checkpoints::CallbackService>> {
 public:
  // Every pointer must outlive the service.
  CheckpointsService(CheckpointUploads* uploads, CheckpointStore* store,
                     BlockingExecutor* executor, CoordinatorMetrics* metrics,
                     const CallGate* gate, CheckpointsServiceLimits limits = {},
                     ParticipantCheck participant = nullptr);

  grpc::ServerReadReactor<grpc::ByteBuffer>* Upload(grpc::CallbackServerContext* context,
                                                    grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* context,
                                 const v1::ListCheckpointsRequest* request,
                                 v1::ListCheckpointsResponse* response) override;
  grpc::ServerUnaryReactor* GetManifest(grpc::CallbackServerContext* context,
                                        const v1::GetManifestRequest* request,
                                        v1::CheckpointManifest* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Download(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* context,
                                   const v1::DeleteCheckpointRequest* request,
                                   v1::DeleteCheckpointResponse* response) override;

  int active_uploads() const { return uploads_active_.load(); }
  int active_downloads() const { return downloads_active_.load(); }

 private:
  friend class UploadReactor;
  friend class DownloadReactor;

  CheckpointUploads* const uploads_;
  CheckpointStore* const store_;
  BlockingExecutor* const executor_;
  CoordinatorMetrics* const metrics_;
  const CallGate* const gate_;
  const CheckpointsServiceLimits limits_;
  const ParticipantCheck participant_;  // null: not checked
  std::atomic<int> uploads_active_{0};
  std::atomic<int> downloads_active_{0};
};

}  // namespace cohort::coordinator

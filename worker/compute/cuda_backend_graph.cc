// CudaBackend (cuda_backend_impl.h): captured op sequences as CUDA graphs
// (backend.h, "Captured op sequences"). The backend's stream is captured in
// thread-local mode, so only this thread's calls are checked against the
// capture; the calls a capture may not hold never reach CUDA while one is
// open (ForbidInCapture), so a forbidden call fails the capture with its
// name instead of invalidating it with cudaErrorStreamCaptureUnsupported.
// What the captured ops bake in stays put for a capture's life or makes it
// stale: the cuBLASLt and cuBLAS workspaces are fixed for the backend's
// life, cuDNN's plans and workspace are made at a shape's first pass (which
// a caller runs directly: capture_cache.h), and scratch that grows, or a
// working copy attached or freed, moves the backend's memory generation.

#include "worker/compute/cuda_backend_impl.h"

namespace cohort::compute::cuda_impl {
namespace {

class CudaGraph final : public CapturedOps {
 public:
  CudaGraph(const void* owner, uint64_t generation, cudaGraphExec_t exec)
      : owner_(owner), generation_(generation), exec_(exec) {}
  // The executable graph is the process's (its context), not the backend's
  // stream's: it may be destroyed from any thread.
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  const void* owner() const { return owner_; }
  uint64_t generation() const { return generation_; }
  cudaGraphExec_t exec() const { return exec_; }

 private:
  const void* owner_;
  uint64_t generation_;
  cudaGraphExec_t exec_;
};

}  // namespace

bool CudaBackend::ForbidInCapture(const char* call) {
  if (!capturing_) return false;
  if (capture_failure_.ok()) {
    capture_failure_ = absl::FailedPreconditionError(
        absl::StrCat(call, " during a capture on CUDA device ", options_.device_index,
                     " (a CUDA graph cannot hold it)"));
  }
  return true;
}

absl::Status CudaBackend::BeginCapture() {
  if (capturing_) return absl::FailedPreconditionError("BeginCapture: a capture is open");
  if (!Begin()) return error_;  // pending: Synchronize's to report
  const cudaError_t began = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
  if (began != cudaSuccess) {
    cudaGetLastError();  // a refused capture is not the device's failure
    return absl::InternalError(absl::StrCat("cudaStreamBeginCapture on CUDA device ",
                                            options_.device_index, ": ", CudaErrorText(began)));
  }
  capturing_ = true;
  capture_failure_ = absl::OkStatus();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CapturedOps>> CudaBackend::EndCapture() {
  if (!capturing_) return absl::FailedPreconditionError("EndCapture without an open capture");
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  // What went wrong while capturing is the capture's, not a failure of ops
  // that ran (none ran): taken here, so the backend is as usable as before
  // BeginCapture (which refused to start with a failure pending). A fault of
  // the device itself is sticky and shows again at the next call.
  absl::Status failure = std::exchange(capture_failure_, absl::OkStatus());
  absl::Status op_failure = std::exchange(error_, absl::OkStatus());
  if (failure.ok()) failure = std::move(op_failure);
  if (failure.ok() && ended != cudaSuccess) {
    failure = absl::InternalError(absl::StrCat("cudaStreamEndCapture on CUDA device ",
                                               options_.device_index, ": ", CudaErrorText(ended)));
  }
  cudaGetLastError();  // an invalidated capture's error is not sticky
  if (!failure.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return failure;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);  // the executable graph keeps what it needs
  if (instantiated != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(absl::StrCat("cudaGraphInstantiate on CUDA device ",
                                            options_.device_index, ": ",
                                            CudaErrorText(instantiated)));
  }
  return std::make_unique<CudaGraph>(this, memory_generation_, exec);
}

absl::Status CudaBackend::Replay(const CapturedOps& ops) {
  const auto* graph = dynamic_cast<const CudaGraph*>(&ops);
  CHECK(graph != nullptr && graph->owner() == this) << "Replay of another backend's capture";
  if (ForbidInCapture("Replay")) return absl::FailedPreconditionError("Replay in a capture");
  if (graph->generation() != memory_generation_) {
    return absl::FailedPreconditionError(
        absl::StrCat("a stale CUDA graph: the backend's scratch or working copy on CUDA device ",
                     options_.device_index, " moved since it was captured"));
  }
  // Skipped while a failure is pending, like every op (Synchronize reports it).
  if (!Begin()) return absl::OkStatus();
  Check(cudaGraphLaunch(graph->exec(), stream_), "cudaGraphLaunch");
  return absl::OkStatus();
}

}  // namespace cohort::compute::cuda_impl

// CudaBackend::CopyToHostSide (backend.h): a device-to-host copy on a second
// stream, so that draining a checkpoint's snapshot (worker/train/device_snapshot.h)
// runs beside the next steps instead of in front of them. The side stream
// waits for an event recorded on the step's stream at the call, which orders
// the copy after every op issued before it (the snapshot's CopyWithin) and
// after nothing issued later; the handle waits on a second event recorded
// after the copy. Only the copy engine and PCIe are shared with the step,
// which on a GPU moves little else over them once its state stays on the
// device.

#include <utility>

#include "worker/compute/cuda_backend_impl.h"

namespace cohort::compute::cuda_impl {
namespace {

class CudaSideCopy final : public SideCopy {
 public:
  // `done` recorded after the copy; or a failure known at the call.
  CudaSideCopy(int device, cudaEvent_t done) : device_(device), done_(done) {}
  explicit CudaSideCopy(absl::Status failed) : failed_(std::move(failed)) {}
  ~CudaSideCopy() override {
    // The destination is written until the copy ends: never leave it
    // running behind a handle that is gone.
    if (done_ != nullptr) {
      cudaSetDevice(device_);
      cudaEventSynchronize(done_);
      cudaEventDestroy(done_);
    }
  }

  absl::Status Wait() override {
    if (!failed_.ok() || done_ == nullptr) return failed_;
    // Any thread: cudaEventSynchronize is thread-safe, and the device is
    // made current on this one first.
    cudaError_t error = cudaSetDevice(device_);
    if (error == cudaSuccess) error = cudaEventSynchronize(done_);
    if (error != cudaSuccess) {
      return absl::InternalError(absl::StrCat("a side copy to the host on CUDA device ", device_,
                                              ": ", CudaErrorText(error)));
    }
    return absl::OkStatus();
  }

 private:
  int device_ = 0;
  cudaEvent_t done_ = nullptr;
  absl::Status failed_;
};

}  // namespace

std::unique_ptr<SideCopy> CudaBackend::CopyToHostSide(void* dst, TensorSpan src) {
  // A second stream's copy cannot be part of a graph of this stream.
  if (ForbidInCapture("CopyToHostSide")) {
    return std::make_unique<CudaSideCopy>(
        absl::FailedPreconditionError("CopyToHostSide during a capture"));
  }
  // A failure pending on the step's stream means the source may hold
  // anything: the copy reports it (and leaves it pending for Synchronize).
  if (!Begin()) return std::make_unique<CudaSideCopy>(error_);
  if (src.numel == 0) return std::make_unique<CudaSideCopy>(absl::OkStatus());
  auto failed = [&](cudaError_t error, const char* what) {
    return std::make_unique<CudaSideCopy>(absl::InternalError(absl::StrCat(
        what, " for a side copy on CUDA device ", options_.device_index, ": ",
        CudaErrorText(error))));
  };
  cudaError_t error = cudaSuccess;
  if (side_stream_ == nullptr) {
    // Non-blocking: the legacy default stream, which other libraries may
    // use, does not order it.
    error = cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking);
    if (error != cudaSuccess) {
      side_stream_ = nullptr;
      return failed(error, "cudaStreamCreateWithFlags");
    }
  }
  cudaEvent_t issued = nullptr;
  cudaEvent_t done = nullptr;
  error = cudaEventCreateWithFlags(&issued, cudaEventDisableTiming);
  if (error != cudaSuccess) return failed(error, "cudaEventCreateWithFlags");
  error = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (error == cudaSuccess) error = cudaEventRecord(issued, stream_);
  if (error == cudaSuccess) error = cudaStreamWaitEvent(side_stream_, issued, 0);
  if (error == cudaSuccess) {
    error = cudaMemcpyAsync(dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, side_stream_);
  }
  if (error == cudaSuccess) error = cudaEventRecord(done, side_stream_);
  // Destroying a recorded event that a stream waits on is allowed: CUDA
  // releases it once the wait is satisfied.
  cudaEventDestroy(issued);
  if (error != cudaSuccess) {
    if (done != nullptr) {
      cudaStreamSynchronize(side_stream_);  // nothing of it may still run
      cudaEventDestroy(done);
    }
    return failed(error, "enqueueing the copy");
  }
  return std::make_unique<CudaSideCopy>(options_.device_index, done);
}

}  // namespace cohort::compute::cuda_impl

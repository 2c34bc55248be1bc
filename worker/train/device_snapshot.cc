#include "worker/train/device_snapshot.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/compute/gpu_launch_plan.h"

namespace cohort::train {

absl::StatusOr<std::unique_ptr<DeviceSnapshot>> DeviceSnapshot::Create(compute::Backend* backend,
                                                                       size_t count) {
  if (count == 0) return absl::InvalidArgumentError("a device snapshot of no elements");
  ASSIGN_OR_RETURN(compute::Buffer device,
                   backend->Allocate(compute::DType::kFloat32, 3 * count));
  ASSIGN_OR_RETURN(compute::Buffer host,
                   backend->AllocateHost(compute::DType::kFloat32, 3 * count));
  return std::unique_ptr<DeviceSnapshot>(
      new DeviceSnapshot(backend, count, std::move(device), std::move(host)));
}

uint64_t DeviceSnapshot::DeviceBytes(size_t count) {
  return compute::gpu_plan::AlignUp(3 * count * sizeof(float));
}

absl::Status DeviceSnapshot::Take(compute::TensorSpan params, compute::TensorSpan m,
                                  compute::TensorSpan v) {
  for (const auto& [span, what] : {std::pair{params, "weights"}, std::pair{m, "first moments"},
                                   std::pair{v, "second moments"}}) {
    if (span.dtype != compute::DType::kFloat32 || span.numel != count_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the snapshot's ", what, ": ", span.numel, " ", compute::DTypeName(span.dtype),
          " elements where it holds ", count_, " float32"));
    }
  }
  // The previous drain may still read the buffer; its result went to the
  // checkpoint that waited for it (or to nobody, if none did).
  Wait().IgnoreError();
  const compute::TensorSpan buffer = device_.span();
  backend_->CopyWithin(buffer.Slice(0, count_), params);
  backend_->CopyWithin(buffer.Slice(count_, count_), m);
  backend_->CopyWithin(buffer.Slice(2 * count_, count_), v);
  std::unique_ptr<compute::SideCopy> drain = backend_->CopyToHostSide(host_.data(), buffer);
  absl::MutexLock lock(&mu_);
  drain_ = std::move(drain);
  drained_ = absl::OkStatus();
  return absl::OkStatus();
}

absl::Status DeviceSnapshot::Wait() {
  absl::MutexLock lock(&mu_);
  if (drain_ != nullptr) {
    drained_ = drain_->Wait();
    drain_.reset();
  }
  return drained_;
}

}  // namespace cohort::train

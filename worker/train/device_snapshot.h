#pragma once
// DeviceSnapshot: a checkpoint's copy of training state that lives in
// backend memory (the device-resident step: weights and AdamW moments on the
// GPU), taken between two steps with device-to-device copies and drained to
// page-locked host memory beside the steps that follow
// (Backend::CopyToHostSide). A checkpoint then stalls training for the time
// it takes to enqueue the copies, not for the state's trip over PCIe
// (about 60 ms for GPT-2 124M's 1.5 GB at 25 GB/s), and the host never
// reads the live state while a step may write it.
//
// The host copy is laid out as CheckpointWriter uploads it: the weights of
// `count` elements, then the first and the second moment of the same
// elements, back to back, fp32 (CheckpointWriter::SaveDrained).
//
// Thread-safety: Take on the training thread (the backend's), Wait and
// host() on any thread; Take waits for the previous drain before it
// overwrites the buffers.

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/compute/backend.h"

namespace cohort::train {

class DeviceSnapshot {
 public:
  // Backend memory and page-locked host memory for three arrays of `count`
  // fp32 elements. ResourceExhausted as the backend's Allocate and
  // AllocateHost; InvalidArgument for count 0.
  static absl::StatusOr<std::unique_ptr<DeviceSnapshot>> Create(compute::Backend* backend,
                                                                size_t count);
  // The backend memory Create takes for `count`, rounded as a device
  // allocator rounds it (TrainingSession::EstimateDeviceBytes).
  static uint64_t DeviceBytes(size_t count);

  // Copies `params`, `m` and `v` (backend memory, `count` fp32 elements
  // each) into the backend buffer after every op issued so far (the last
  // update), then starts their drain to the host. Waits first for the
  // previous drain, if one is still running. InvalidArgument for spans of
  // another size or dtype.
  absl::Status Take(compute::TensorSpan params, compute::TensorSpan m, compute::TensorSpan v);
  // Blocks until the last Take's drain is done and returns its status
  // (that of every later call too, until the next Take); OK when nothing
  // was taken.
  absl::Status Wait();
  // The drained copy (3 x count floats); complete once Wait returned OK.
  const float* host() const { return static_cast<const float*>(host_.data()); }
  size_t count() const { return count_; }

 private:
  DeviceSnapshot(compute::Backend* backend, size_t count, compute::Buffer device,
                 compute::Buffer host)
      : backend_(backend), count_(count), device_(std::move(device)), host_(std::move(host)) {}

  compute::Backend* const backend_;
  const size_t count_;
  const compute::Buffer device_;
  const compute::Buffer host_;
  absl::Mutex mu_;
  std::unique_ptr<compute::SideCopy> drain_ ABSL_GUARDED_BY(mu_);
  absl::Status drained_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cohort::train

// GptModel::TrainMicroBatch: the device-resident step's forward and backward
// of one micro-batch, the backend's ops of both run as one captured unit
// where the backend captures (compute/capture_cache.h), everything the host
// does around them outside it (the contract is gpt_model.h's).
#include "worker/model/gpt_model.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace cohort::model {

using compute::TensorSpan;

absl::Status GptModel::TrainMicroBatch(const MicroBatchPass& pass, compute::CaptureCache* graphs) {
  const ModelLayout& lay = layout();
  if (staging_ == nullptr || !gradients_stay_ || lay.tp != 1 || lay.pp != 1) {
    return absl::FailedPreconditionError(
        "TrainMicroBatch runs the device-resident step: a staged model of one rank whose "
        "gradients stay on the backend");
  }
  if (pass.loss_sum.empty()) {
    return absl::InvalidArgumentError("TrainMicroBatch needs a loss sum in backend memory");
  }
  if (!std::isfinite(pass.loss_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss_scale must be finite, got ", pass.loss_scale));
  }
  // The host's part before the ops, outside any capture: the checks, the
  // weights the host wrote (gradients it wrote are zeroed below), the
  // tokens (asynchronously, from the caller's AllocateHost arrays into the
  // slot's device copy, which a replay reads), and the loss gradient (a
  // synchronous upload, only when it changes). Everything that varies
  // between micro-batches of one shape is then in the buffers the ops read.
  RETURN_IF_ERROR(BeginForward(pass.slot, pass.inputs, pass.targets, pass.B, pass.T,
                               /*deferred=*/true));
  Slot& slot = slots_[pass.slot];
  slot.B = pass.B;  // BeginBackward's books: the slot is forwarded (below)
  slot.T = pass.T;
  absl::StatusOr<TensorSpan> dlosses = BeginBackward(pass.slot, pass.loss_scale);
  if (!dlosses.ok()) {
    slot.B = 0;  // nothing ran: the slot holds no forward
    return dlosses.status();
  }
  // The addresses and shapes the ops bake in: the slot's activations, token
  // and loss-gradient spans follow from (slot, B, T); the loss sum is the
  // caller's. The weights, gradients and scratch are fixed for the model's
  // life, and the backend refuses a replay whose own memory moved.
  const compute::CaptureKey key = {static_cast<uint64_t>(pass.slot), static_cast<uint64_t>(pass.B),
                                   static_cast<uint64_t>(pass.T),
                                   reinterpret_cast<uintptr_t>(pass.loss_sum.data)};
  const absl::Status ran = graphs->Run(key, [&]() -> absl::Status {
    RETURN_IF_ERROR(ForwardOps(slot, pass.B, pass.T, pass.loss_sum));
    ZeroGradOps();
    return BackwardOps(slot, *dlosses);
  });
  if (!ran.ok()) {
    slot.B = 0;  // an abandoned pass leaves the slot undefined (set_cancel)
    return ran;
  }
  KeepGradientsOnBackend();
  return absl::OkStatus();
}

}  // namespace cohort::model

// TrainingSession::EstimateDeviceBytes (training_session.h): the backend
// memory a session takes, reserved at once when it is built, so a job too
// large for its GPU fails there, naming the bytes, and not in a step.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/status_macros.h"
#include "worker/compute/gpu_launch_plan.h"
#include "worker/model/gpt_model.h"
#include "worker/model/parameter_table.h"
#include "worker/train/device_snapshot.h"
#include "worker/train/grad_norm_plan.h"
#include "worker/train/gradient_tree.h"
#include "worker/train/reduction_tree.h"
#include "worker/train/training_session.h"

namespace cohort::train {
namespace {

uint64_t Aligned(uint64_t bytes) {
  return compute::gpu_plan::AlignUp(static_cast<size_t>(std::max<uint64_t>(bytes, 1)));
}

}  // namespace

bool TrainingSession::RunsDeviceResident(bool host_memory, int dp,
                                         const model::ModelLayout& layout,
                                         const TrainingSessionOptions& options) {
  // StepRunner::QualifiesForDevice, from what a session knows before it has
  // a runner: one rank holding the whole model, the tied parts folded per
  // micro-batch, no previous version kept (and with one data rank no
  // optimizer mirror).
  return !host_memory && dp == 1 && layout.tp == 1 && layout.pp == 1 &&
         options.tie_per_micro_batch.value_or(true) && !options.state_versions.keep_previous;
}

absl::StatusOr<uint64_t> TrainingSession::EstimateDeviceBytes(
    const TrainingConfig& config, const model::ModelLayout& layout, int dp,
    compute::Backend& backend, const TrainingSessionOptions& options) {
  if (backend.host_memory()) return uint64_t{0};
  model::ModelOptions model_options;
  model_options.max_micro_batch = config.micro_batch_size;
  model_options.layout = layout;
  model_options.activation_slots = ActivationSlotsFor(config, layout);
  // Scratch first: it settles the backend's attention, which sets the size
  // of the activations' attention state.
  ASSIGN_OR_RETURN(const size_t scratch,
                   backend.ScratchBytes(model::GptModel::PassShapeFor(
                       config.model, layout, config.micro_batch_size)));
  uint64_t bytes = scratch + model::GptModel::BackendBytes(config.model, backend, model_options,
                                                           compute::gpu_plan::kDeviceAlignment);
  if (!RunsDeviceResident(false, dp, layout, options)) return bytes;
  // The device-resident step's own (step_runner_device.cc): the gradient
  // tree's buffers, the moments, the norm's pieces and sums, its two
  // scalars, each micro-batch's loss sum; and the weights' working copy.
  const model::ParameterTable table(config.model, layout);
  const uint64_t n = table.num_params();
  const int leaves = config.micro_batches_per_step();
  const LeafRange range = LeafRangesOf(config.shares()).front();
  bytes += static_cast<uint64_t>(GradientTree::BuffersNeeded(leaves, range)) *
           Aligned(n * sizeof(float));
  bytes += 2 * Aligned(n * sizeof(float));
  const uint64_t pieces = GradNormPlan(config.model, table).Pieces(0, n).size();
  bytes += Aligned(2 * pieces * sizeof(int64_t)) + Aligned(pieces * sizeof(double)) +
           Aligned(2 * sizeof(double));
  bytes += Aligned(static_cast<uint64_t>(leaves) * sizeof(double));
  bytes += backend.ParamCopyBytes(n, model::GptModel::WeightCopyBlocks(table));
  // One rank's update range is the whole arena.
  if (options.checkpoint_snapshot) bytes += DeviceSnapshot::DeviceBytes(n);
  return bytes;
}

}  // namespace cohort::train

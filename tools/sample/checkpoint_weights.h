#pragma once
// The model of a committed checkpoint, for sampling on the CPU: its shape
// from the fingerprint the writers store beside it (manifest objects
// "model", written by checkpoint::ModelFingerprint), its weights from the
// "param/*" tensors, whatever (dp, tp, pp) layout wrote them. The chunks are
// downloaded and copied into a whole-model ParameterTable arena by
// checkpoint::LoadCheckpoint (worker/checkpoint/checkpoint_loader.h, the
// re-sharding loader training restores with; here for the one-rank layout
// and no optimizer state), so memory is the model's own arenas plus the
// chunks in flight.
//
// Thread-compatible.

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/checkpoint_client.h"
#include "cohort/v1/checkpoints.pb.h"
#include "worker/compute/backend.h"
#include "worker/model/gpt_config.h"
#include "worker/model/gpt_model.h"
#include "worker/model/parameter_table.h"

namespace cohort::sample {

// The config of a fingerprint as ModelFingerprint writes it: "layers=L
// heads=H width=C vocab=V padded_vocab=Vp context=T", parsed by
// cohort::ParseModelFingerprint (common/gpt2_hf_layout.h, whose errors it
// returns) and checked as a GptConfig (InvalidArgument naming the field).
absl::StatusOr<model::GptConfig> ParseModelFingerprint(absl::string_view fingerprint);

// The config of the model `manifest` holds. FailedPrecondition when it has
// no "model" object or the object cannot be parsed (the message gives
// ParseModelFingerprint's reason).
absl::StatusOr<model::GptConfig> CheckpointModelConfig(const v1::CheckpointManifest& manifest);

// OK when `manifest` holds exactly the weights of `table` (a whole-model
// table): a float32 "param/<name>" tensor of global shape
// ParameterInfo::global_shape for each table entry, and no other "param/"
// tensor. FailedPrecondition naming the first tensor that is missing, of
// another shape or dtype, or unknown.
absl::Status CheckWeightTensors(const v1::CheckpointManifest& manifest,
                                const model::ParameterTable& table);

// A whole model on `backend` (which must outlive it), for forward passes of
// one sequence (max_micro_batch 1), holding the weights of checkpoint
// `manifest`. The tensors are checked (CheckWeightTensors) before any model
// memory is allocated. Errors: those of CheckpointModelConfig and
// CheckWeightTensors; GptModel::Create's (ResourceExhausted when the model
// does not fit); LoadCheckpoint's (DataLoss for a corrupt chunk or chunks
// that leave weights uncovered, naming the tensor; the client's errors).
// `timeout` bounds the whole download.
absl::StatusOr<std::unique_ptr<model::GptModel>> LoadCheckpointModel(
    client::CheckpointClient& client, const v1::CheckpointManifest& manifest,
    compute::Backend* backend, absl::Duration timeout);

}  // namespace cohort::sample

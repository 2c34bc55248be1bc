#include "tools/sample/checkpoint_weights.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/checkpoint/checkpoint_loader.h"
#include "worker/checkpoint/shard_plan.h"
#include "worker/model/initial_weights.h"

namespace cohort::sample {
namespace {

// The manifest object ModelFingerprint's text is stored under
// (worker/checkpoint/checkpoint_writer.cc).
constexpr char kModelObject[] = "model";

std::string Where(const v1::CheckpointManifest& manifest) {
  return absl::StrCat("the checkpoint of job ", manifest.job_id(), " step ", manifest.step());
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<model::GptConfig> ParseModelFingerprint(absl::string_view fingerprint) {
  ASSIGN_OR_RETURN(const GptShape shape, cohort::ParseModelFingerprint(fingerprint));
  model::GptConfig config = model::GptConfigOf(shape);
  if (absl::Status valid = config.Validate(); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model fingerprint \"", fingerprint, "\": ", valid.message()));
  }
  return config;
}

absl::StatusOr<model::GptConfig> CheckpointModelConfig(const v1::CheckpointManifest& manifest) {
  auto it = manifest.objects().find(kModelObject);
  if (it == manifest.objects().end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Where(manifest), " does not say which model it holds (no \"", kModelObject,
                     "\" object, which checkpoint writers store)"));
  }
  absl::StatusOr<model::GptConfig> config = ParseModelFingerprint(it->second);
  if (!config.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Where(manifest), ": ", config.status().message()));
  }
  return config;
}

absl::Status CheckWeightTensors(const v1::CheckpointManifest& manifest,
                                const model::ParameterTable& table) {
  const std::string prefix =
      absl::StrCat(checkpoint::StateKindPrefix(checkpoint::StateKind::kParam), "/");
  std::map<std::string, const v1::TensorInfo*> weights;
  for (const v1::TensorInfo& tensor : manifest.tensors()) {
    if (!absl::StartsWith(tensor.name(), prefix)) continue;
    if (table.Find(std::string_view(tensor.name()).substr(prefix.size())) == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(Where(manifest), " holds tensor ", tensor.name(),
                       ", which is not a weight of the model it names"));
    }
    weights[tensor.name()] = &tensor;
  }
  for (const model::ParameterInfo& info : table.tensors()) {
    const std::string name = prefix + info.name;
    auto it = weights.find(name);
    if (it == weights.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(Where(manifest), " has no tensor ", name, ", which the model needs"));
    }
    const v1::TensorInfo& tensor = *it->second;
    const std::vector<int64_t> shape(tensor.global_shape().begin(), tensor.global_shape().end());
    if (shape != info.global_shape) {
      return absl::FailedPreconditionError(
          absl::StrCat(Where(manifest), ": tensor ", name, " has shape ", ShapeText(shape),
                       ", the model it names needs ", ShapeText(info.global_shape)));
    }
    if (tensor.dtype() != v1::TENSOR_DTYPE_FLOAT32) {
      return absl::FailedPreconditionError(absl::StrCat(Where(manifest), ": tensor ", name, " is ",
                                                        v1::TensorDType_Name(tensor.dtype()),
                                                        "; sampling reads float32 weights"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<model::GptModel>> LoadCheckpointModel(
    client::CheckpointClient& client, const v1::CheckpointManifest& manifest,
    compute::Backend* backend, absl::Duration timeout) {
  ASSIGN_OR_RETURN(const model::GptConfig config, CheckpointModelConfig(manifest));
  // Before allocating: the weights the fingerprint implies must be there,
  // so a fingerprint alone cannot make this allocate an arbitrary amount.
  RETURN_IF_ERROR(CheckWeightTensors(manifest, model::ParameterTable(config)));
  ASSIGN_OR_RETURN(std::unique_ptr<model::GptModel> model,
                   model::GptModel::Create(config, backend, model::ModelOptions{}));
  checkpoint::StateBuffers buffers;
  buffers.params = model->params();
  buffers.optimizer = checkpoint::ArenaRange{0, 0};  // the weights only
  RETURN_IF_ERROR(
      checkpoint::LoadCheckpoint(&client, manifest, config, model->table(), buffers, timeout));
  return model;
}

}  // namespace cohort::sample

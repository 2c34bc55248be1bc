#include "worker/model/gpt_model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/compute/bf16_math.h"
#include "worker/model/parameter_init.h"

namespace cohort::model {

using compute::DType;
using compute::TensorSpan;

namespace {

// The activation arenas are raw memory counted in bytes (gpt_activations.h):
// a Buffer of fp32 elements covering `bytes`, a multiple of 256.
absl::StatusOr<compute::Buffer> AllocateBytes(compute::Backend& backend, size_t bytes) {
  return backend.Allocate(DType::kFloat32, bytes / sizeof(float));
}

// The communicator's type for a span the tensor group reduces: an
// activation (fp32 or bf16, summed as comm/reduce.h sums it: widened, added
// in fp32, rounded once per pairwise add) or an fp32 statistic.
comm::DataType CommType(DType dtype) {
  CHECK(dtype == DType::kFloat32 || dtype == DType::kBFloat16)
      << "no tensor-group reduction of " << compute::DTypeName(dtype);
  return dtype == DType::kFloat32 ? comm::DataType::kFloat32 : comm::DataType::kBFloat16;
}

}  // namespace

GptModel::GptModel(const GptConfig& config, compute::Backend* backend, const ModelOptions& options)
    : config_(config),
      table_(config, options.layout),
      backend_(backend),
      options_(options),
      tensor_group_(options.layout.tp > 1 ? options.tensor_group : nullptr) {}

GptModel::~GptModel() {
  if (weight_copy_attached_) backend_->DetachParams(params_.span());
}

// One block per layer of each per-layer matrix, and the tied LM head (wte).
// Rows are a weight's input features (its last dimension).
std::vector<compute::ParamBlock> GptModel::WeightCopyBlocks(const ParameterTable& table) {
  std::vector<compute::ParamBlock> blocks;
  for (ParamId id : {kWte, kQkvw, kAttprojw, kFcw, kFcprojw}) {
    const ParameterInfo& info = table[id];
    if (!info.present()) continue;
    const int row_length = static_cast<int>(info.shape.back());
    const size_t layers = info.per_layer ? static_cast<size_t>(info.shape[0]) : 1;
    const size_t numel = info.numel / layers;
    for (size_t l = 0; l < layers; ++l) {
      blocks.push_back(compute::ParamBlock{
          .offset = info.offset + l * numel, .numel = numel, .row_length = row_length});
    }
  }
  // Table order is ascending by offset, which the layout wants.
  std::sort(blocks.begin(), blocks.end(),
            [](const compute::ParamBlock& a, const compute::ParamBlock& b) {
              return a.offset < b.offset;
            });
  return blocks;
}

compute::PassShape GptModel::PassShapeFor(const GptConfig& config, const ModelLayout& layout,
                                          int max_micro_batch) {
  const int local_width = config.width / layout.tp;
  return compute::PassShape{
      .max_batch = max_micro_batch,
      .max_seq = config.context_length,
      .attention_width = local_width,
      .heads = config.heads / layout.tp,
      .max_bias_columns = std::max(config.width, 4 * local_width),
      .vocab_rows = layout.has_embedding() ? layout.vocab_rows(config) : 0,
      .head_rows = layout.has_head() ? layout.vocab_rows(config) : 0,
      .width = config.width,
  };
}

size_t GptModel::BackendBytes(const GptConfig& config, const compute::Backend& backend,
                              const ModelOptions& options, size_t alignment) {
  const ModelLayout& layout = options.layout;
  const ParameterTable table(config, layout);
  const size_t max_b = static_cast<size_t>(options.max_micro_batch);
  const size_t max_t = static_cast<size_t>(config.context_length);
  const size_t slots = static_cast<size_t>(options.activation_slots);
  auto aligned = [alignment](size_t bytes) {
    return (std::max<size_t>(bytes, 1) + alignment - 1) / alignment * alignment;
  };
  // As Create allocates them, in its order; the activations in bytes of
  // their dtypes (gpt_activations.h).
  size_t bytes = 2 * aligned(table.num_params() * sizeof(float));  // weights, gradients
  if (layout.has_embedding()) bytes += aligned(table[kWte].numel * sizeof(float));
  bytes += aligned(ActivationsBytes(config, layout, backend, options.max_micro_batch,
                                    config.context_length) *
                   slots);
  bytes += aligned(
      ActivationGradsBytes(config, layout, backend, options.max_micro_batch, config.context_length));
  bytes += aligned(2 * max_b * max_t * slots * sizeof(int32_t));  // token ids
  if (layout.has_head()) bytes += aligned(max_b * max_t * sizeof(float));  // loss gradient
  return bytes;
}

absl::Status GptModel::AttachWeightCopy() {
  RETURN_IF_ERROR(backend_->AttachParams(params_.span(), WeightCopyBlocks(table_)));
  weight_copy_attached_ = true;
  // The copy is made from what the backend holds now; weights the host
  // wrote since the last upload come with the next Forward's upload, which
  // refreshes it (UploadStaleParams).
  return absl::OkStatus();
}

absl::Status GptModel::set_tensor_group(comm::Communicator* group) {
  const ModelLayout& layout = options_.layout;
  if (layout.tp == 1) return absl::OkStatus();
  if (group == nullptr || group->size() != layout.tp || group->rank() != layout.tp_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a tensor group must have tp=", layout.tp, " ranks with this rank at ", layout.tp_rank));
  }
  tensor_group_ = group;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GptModel>> GptModel::Create(const GptConfig& config,
                                                           compute::Backend* backend,
                                                           const ModelOptions& options) {
  RETURN_IF_ERROR(config.Validate());
  RETURN_IF_ERROR(options.layout.Validate(config));
  if (backend == nullptr) return absl::InvalidArgumentError("GptModel needs a backend");
  if (options.max_micro_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelOptions.max_micro_batch must be >= 1, got ", options.max_micro_batch));
  }
  if (options.activation_slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ModelOptions.activation_slots must be >= 1, got ", options.activation_slots));
  }
  const ModelLayout& layout = options.layout;
  if (layout.tp > 1 &&
      (options.tensor_group == nullptr || options.tensor_group->size() != layout.tp ||
       options.tensor_group->rank() != layout.tp_rank)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ModelOptions.tensor_group must have tp=", layout.tp, " ranks with this rank at ",
        layout.tp_rank, options.tensor_group == nullptr ? " (none given)" : ""));
  }
  const DType activation = backend->activation_dtype();
  if (activation != DType::kFloat32 && activation != DType::kBFloat16) {
    return absl::UnimplementedError(absl::StrCat(
        "GptModel stores activations in float32 or bfloat16; backend '",
        std::string(backend->name()), "' asks for ", compute::DTypeName(activation)));
  }
  std::unique_ptr<GptModel> model(new GptModel(config, backend, options));
  const int max_b = options.max_micro_batch;
  const int max_t = config.context_length;
  const int slots = options.activation_slots;
  const size_t n = model->table_.num_params();
  ASSIGN_OR_RETURN(model->params_, backend->Allocate(DType::kFloat32, n));
  ASSIGN_OR_RETURN(model->grads_, backend->Allocate(DType::kFloat32, n));
  if (layout.has_embedding()) {
    ASSIGN_OR_RETURN(model->embedding_grad_,
                     backend->Allocate(DType::kFloat32, model->table_[kWte].numel));
  }
  // The scratch the ops keep (a GPU's: attention's copies and score
  // gradients, sort and column-sum space) is reserved now, so that a model
  // too big for the device fails here rather than in its first step; and
  // before the activations, since reserving is where a GPU backend decides
  // how it runs attention, which sets the size of attention's state
  // (Backend::AttentionStateNumel).
  RETURN_IF_ERROR(backend->ReserveScratch(PassShapeFor(config, layout, max_b)));
  const size_t per_slot = ActivationsBytes(config, layout, *backend, max_b, max_t);
  ASSIGN_OR_RETURN(model->acts_, AllocateBytes(*backend, per_slot * slots));
  ASSIGN_OR_RETURN(model->grad_acts_,
                   AllocateBytes(*backend, ActivationGradsBytes(config, layout, *backend, max_b,
                                                                max_t)));
  const size_t tokens_per_slot = 2 * static_cast<size_t>(max_b) * max_t;
  ASSIGN_OR_RETURN(model->tokens_, backend->Allocate(DType::kInt32, tokens_per_slot * slots));
  if (layout.has_head()) {
    ASSIGN_OR_RETURN(model->dlosses_,
                     backend->Allocate(DType::kFloat32, static_cast<size_t>(max_b) * max_t));
  }
  if (!backend->host_memory()) {
    model->staging_ = std::make_unique<HostStaging>();
    HostStaging& staging = *model->staging_;
    auto host = [&](size_t numel) { return backend->AllocateHost(DType::kFloat32, numel); };
    ASSIGN_OR_RETURN(staging.params.host, host(n));
    ASSIGN_OR_RETURN(staging.grads.host, host(n));
    if (layout.has_embedding()) {
      ASSIGN_OR_RETURN(staging.embedding_grad.host, host(model->table_[kWte].numel));
    }
    // A pipeline's exchanges are (N, C) activations, of their dtype.
    const size_t tokens = static_cast<size_t>(max_b) * max_t;
    const size_t activation_numel = tokens * config.width;
    if (layout.pp > 1) {
      auto host_activation = [&] { return backend->AllocateHost(activation, activation_numel); };
      for (int s = 0; s < slots; ++s) {
        ASSIGN_OR_RETURN(staging.stage_input.emplace_back(), host_activation());
        ASSIGN_OR_RETURN(staging.stage_output.emplace_back(), host_activation());
      }
      ASSIGN_OR_RETURN(staging.stage_output_grad, host_activation());
      ASSIGN_OR_RETURN(staging.stage_input_grad, host_activation());
    }
    // The tensor group reduces (N, C) activations and the cross-entropy's
    // fp32 sums (2N); one buffer of the larger's bytes serves both
    // (HostSpan views it in each span's dtype).
    if (layout.tp > 1) {
      const size_t bytes =
          std::max(activation_numel * compute::DTypeSize(activation), 2 * tokens * sizeof(float));
      ASSIGN_OR_RETURN(staging.reduce, host((bytes + sizeof(float) - 1) / sizeof(float)));
    }
  }
  model->slots_.resize(slots);
  const size_t per_slot_floats = per_slot / sizeof(float);
  for (int s = 0; s < slots; ++s) {
    model->slots_[s].arena = model->acts_.Slice(per_slot_floats * s, per_slot_floats);
  }
  return model;
}

TensorSpan GptModel::param(ParamId id) const {
  const ParameterInfo& info = table_[id];
  return params_.Slice(info.offset, info.numel);
}

TensorSpan GptModel::grad(ParamId id) const {
  const ParameterInfo& info = table_[id];
  return grads_.Slice(info.offset, info.numel);
}

TensorSpan GptModel::param(ParamId id, int layer) const {
  const ParameterInfo& info = table_[id];
  CHECK(info.per_layer && layer >= 0 && layer < info.shape[0]) << info.name << " layer " << layer;
  return params_.Slice(info.offset + layer * info.LayerNumel(), info.LayerNumel());
}

TensorSpan GptModel::grad(ParamId id, int layer) const {
  const ParameterInfo& info = table_[id];
  CHECK(info.per_layer && layer >= 0 && layer < info.shape[0]) << info.name << " layer " << layer;
  return grads_.Slice(info.offset + layer * info.LayerNumel(), info.LayerNumel());
}

TensorSpan GptModel::embedding_grad() const {
  if (staging_ == nullptr || embedding_grad_.data() == nullptr) return embedding_grad_.span();
  staging_->embedding_grad.Read(backend_, embedding_grad_.span());
  return HostSpan(staging_->embedding_grad.host, DType::kFloat32, embedding_grad_.numel());
}

void GptModel::InitializeParameters(uint64_t seed) {
  // Generate on the host, then copy: the same path for any backend.
  if (staging_ != nullptr) {
    model::InitializeParameters(config_, table_, seed,
                                static_cast<float*>(staging_->params.host.data()));
    staging_->params.newest = Newest::kHostNewer;  // uploaded by the next Forward
    return;
  }
  std::vector<float> host(num_params());
  model::InitializeParameters(config_, table_, seed, host.data());
  backend_->CopyFromHost(params_.span(), host.data());
  backend_->RefreshParamCopy();  // the weights changed outside ClipAdamW (backend.h)
}

// ---- Host staging ---------------------------------------------------------------

float* GptModel::params() {
  if (staging_ == nullptr) return static_cast<float*>(params_.data());
  float* host = staging_->params.Read(backend_, params_.span());
  staging_->params.newest = Newest::kHostNewer;
  return host;
}

const float* GptModel::params() const {
  if (staging_ == nullptr) return static_cast<const float*>(params_.data());
  return staging_->params.Read(backend_, params_.span());
}

void GptModel::MarkParamsChangedOnBackend() {
  if (staging_ != nullptr) staging_->params.newest = Newest::kBackendNewer;
}

float* GptModel::HostCopy::Read(compute::Backend* backend, TensorSpan device) {
  auto* data = static_cast<float*>(host.data());
  if (newest == Newest::kZeroOnBackend) {  // lazily: a cleared gradient costs no copy
    std::fill_n(data, host.numel(), 0.0f);
    newest = Newest::kSynced;
  } else if (newest == Newest::kBackendNewer) {
    // Returns once the copy is done (backend.h), so the host may read it.
    backend->CopyToHost(data, device);
    newest = Newest::kSynced;
  }
  return data;
}

float* GptModel::grads() {
  if (staging_ == nullptr) return static_cast<float*>(grads_.data());
  float* host = staging_->grads.Read(backend_, grads_.span());
  staging_->grads.newest = Newest::kHostNewer;
  return host;
}

const float* GptModel::grads() const {
  if (staging_ == nullptr) return static_cast<const float*>(grads_.data());
  return staging_->grads.Read(backend_, grads_.span());
}

absl::Status GptModel::UploadIfHostNewer(HostCopy& copy, TensorSpan device) {
  if (copy.newest != Newest::kHostNewer) return absl::OkStatus();
  backend_->CopyFromHost(device, copy.host.data());
  RETURN_IF_ERROR(backend_->Synchronize());
  copy.newest = Newest::kSynced;
  return absl::OkStatus();
}

void GptModel::Download(HostCopy& copy, TensorSpan device) {
  backend_->CopyToHost(copy.host.data(), device);
  copy.newest = Newest::kSynced;
}

absl::Status GptModel::UploadStaleParams() {
  if (staging_ == nullptr || staging_->params.newest != Newest::kHostNewer) {
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(UploadIfHostNewer(staging_->params, params_.span()));
  // Weights from the host (a fresh start, a restore, a peer's): the working
  // copy follows (backend.h, AttachParams).
  backend_->RefreshParamCopy();
  return absl::OkStatus();
}

absl::Status GptModel::UploadStaleGrads() {
  if (staging_ == nullptr) return absl::OkStatus();
  return UploadIfHostNewer(staging_->grads, grads_.span());
}

absl::Status GptModel::DownloadGrads() {
  if (staging_ == nullptr) return absl::OkStatus();
  Download(staging_->grads, grads_.span());
  return backend_->Synchronize();
}

absl::Status GptModel::CheckTokens(const char* what, const int32_t* ids, int B, int T) const {
  if (ids == nullptr) return absl::InvalidArgumentError(absl::StrCat("Forward needs ", what, "s"));
  const int N = B * T;
  for (int i = 0; i < N; ++i) {
    if (ids[i] < 0 || ids[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(what, " token ", ids[i], " at (b=", i / T,
                                                     ", t=", i % T, ") outside [0, vocab_size=",
                                                     config_.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status GptModel::TensorAllReduce(TensorSpan span, comm::ReduceOp op) {
  if (tensor_group_ == nullptr) return absl::OkStatus();
  // The backend's queued ops must have produced `span` before it is sent.
  RETURN_IF_ERROR(backend_->Synchronize());
  const comm::DataType type = CommType(span.dtype);
  if (staging_ == nullptr) {
    return tensor_group_->AllReduce(span.data, span.numel, type, op, options_.collective_timeout);
  }
  // The group's collectives work on host memory: reduce a host copy.
  const TensorSpan host = HostSpan(staging_->reduce, span.dtype, span.numel);
  backend_->CopyToHost(host.data, span);
  RETURN_IF_ERROR(backend_->Synchronize());
  RETURN_IF_ERROR(
      tensor_group_->AllReduce(host.data, span.numel, type, op, options_.collective_timeout));
  backend_->CopyFromHost(span, host.data);
  return backend_->Synchronize();
}

TensorSpan GptModel::HostSpan(const compute::Buffer& host, DType dtype, size_t numel) {
  const size_t bytes = numel * compute::DTypeSize(dtype);
  CHECK(bytes <= host.span().bytes()) << bytes << " bytes of " << host.span().bytes();
  return TensorSpan{host.data(), dtype, numel};
}

TensorSpan GptModel::StageInput(int slot, int B, int T) {
  CHECK(slot >= 0 && slot < static_cast<int>(slots_.size())) << "slot " << slot;
  CHECK(B >= 1 && B <= options_.max_micro_batch && T >= 1 && T <= config_.context_length);
  if (staging_ != nullptr) {
    return HostSpan(staging_->stage_input[slot], backend_->activation_dtype(),
                    static_cast<size_t>(B) * T * config_.width);
  }
  return LayOutActivations(config_, layout(), *backend_, slots_[slot].arena, B, T).encoded;
}

TensorSpan GptModel::StageOutput(int slot) const {
  CHECK(slot >= 0 && slot < static_cast<int>(slots_.size()) && slots_[slot].B > 0)
      << "slot " << slot << " has no forward";
  const TensorSpan output = slots_[slot].acts.layers.back().residual3;
  if (staging_ == nullptr) return output;
  // The staged copy exists where a stage sends its output on.
  CHECK(!layout().has_head()) << "StageOutput of a staged model: the last stage sends nothing";
  return HostSpan(staging_->stage_output[slot], output.dtype, output.numel);
}

TensorSpan GptModel::StageOutputGrad(int B, int T) {
  const TensorSpan grad =
      LayOutActivationGrads(config_, layout(), *backend_, grad_acts_.span(), B, T).dresidual;
  return staging_ != nullptr ? HostSpan(staging_->stage_output_grad, grad.dtype, grad.numel)
                             : grad;
}

TensorSpan GptModel::StageInputGrad() const {
  CHECK(last_backward_slot_ >= 0) << "no backward has run";
  const Slot& slot = slots_[last_backward_slot_];
  const TensorSpan grad = LayOutActivationGrads(config_, layout(), *backend_, grad_acts_.span(),
                                                slot.B, slot.T)
                              .dresidual;
  if (staging_ == nullptr) return grad;
  CHECK(!layout().has_embedding())
      << "StageInputGrad of a staged model: the first stage sends no input gradient";
  return HostSpan(staging_->stage_input_grad, grad.dtype, grad.numel);
}

TensorSpan GptModel::logits() const {
  if (slots_[0].B == 0 || slots_[0].logits_overwritten) return TensorSpan{};
  return slots_[0].acts.logits;
}

absl::Status GptModel::CopyLogitsToHost(float* dst) {
  if (slots_[0].B == 0 || !layout().has_head()) {
    return absl::FailedPreconditionError("no Forward with the LM head has run yet");
  }
  if (slots_[0].logits_overwritten) {
    return absl::FailedPreconditionError(
        "the logits of the last Forward are gone: its Backward wrote their gradient over them; "
        "run Forward again to read logits");
  }
  const TensorSpan logits = slots_[0].acts.logits;
  if (logits.dtype == DType::kFloat32) {
    backend_->CopyToHost(dst, logits);
    return backend_->Synchronize();
  }
  // bf16 logits, widened on the host (exact): every reader gets fp32.
  host_logits_.resize(logits.numel);
  backend_->CopyToHost(host_logits_.data(), logits);
  RETURN_IF_ERROR(backend_->Synchronize());
  for (size_t i = 0; i < logits.numel; ++i) {
    dst[i] = compute::kernel_math::FloatOfBf16(host_logits_[i]);
  }
  return absl::OkStatus();
}

}  // namespace cohort::model

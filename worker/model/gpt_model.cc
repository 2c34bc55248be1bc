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
#include "worker/model/parameter_init.h"

namespace cohort::model {

using compute::DType;
using compute::TensorSpan;

GptModel::GptModel(const GptConfig& config, compute::Backend* backend, const ModelOptions& options)
    : config_(config),
      table_(config, options.layout),
      backend_(backend),
      options_(options),
      tensor_group_(options.layout.tp > 1 ? options.tensor_group : nullptr) {}

GptModel::~GptModel() {
  if (weight_copy_attached_) backend_->DetachParams(params_.span());
}

namespace {

// The blocks of the arena that the linear layers read as weights: one per
// layer of each per-layer matrix, and the tied LM head (wte). Rows are a
// weight's input features (its last dimension).
std::vector<compute::ParamBlock> GemmWeightBlocks(const ParameterTable& table) {
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

}  // namespace

absl::Status GptModel::AttachWeightCopy() {
  RETURN_IF_ERROR(backend_->AttachParams(params_.span(), GemmWeightBlocks(table_)));
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
  if (backend->activation_dtype() != DType::kFloat32) {
    return absl::UnimplementedError(absl::StrCat("GptModel runs fp32 only; backend '",
                                                 std::string(backend->name()), "' computes in ",
                                                 compute::DTypeName(backend->activation_dtype())));
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
  const int local_width = config.width / layout.tp;
  RETURN_IF_ERROR(backend->ReserveScratch(compute::PassShape{
      .max_batch = max_b,
      .max_seq = max_t,
      .attention_width = local_width,
      .heads = config.heads / layout.tp,
      .max_bias_columns = std::max(config.width, 4 * local_width),
      .vocab_rows = layout.has_embedding() ? layout.vocab_rows(config) : 0,
      .head_rows = layout.has_head() ? layout.vocab_rows(config) : 0,
      .width = config.width,
  }));
  const size_t per_slot = ActivationsNumel(config, layout, *backend, max_b, max_t);
  ASSIGN_OR_RETURN(model->acts_, backend->Allocate(DType::kFloat32, per_slot * slots));
  ASSIGN_OR_RETURN(model->grad_acts_,
                   backend->Allocate(DType::kFloat32,
                                     ActivationGradsNumel(config, layout, max_b, max_t)));
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
    const size_t activation = static_cast<size_t>(max_b) * max_t * config.width;
    if (layout.pp > 1) {
      for (int s = 0; s < slots; ++s) {
        ASSIGN_OR_RETURN(staging.stage_input.emplace_back(), host(activation));
        ASSIGN_OR_RETURN(staging.stage_output.emplace_back(), host(activation));
      }
      ASSIGN_OR_RETURN(staging.stage_output_grad, host(activation));
      ASSIGN_OR_RETURN(staging.stage_input_grad, host(activation));
    }
    // The widest all-reduce is an (N, C) activation; the cross-entropy's
    // sums (2N) are smaller.
    if (layout.tp > 1) {
      ASSIGN_OR_RETURN(staging.reduce, host(activation));
    }
  }
  model->slots_.resize(slots);
  for (int s = 0; s < slots; ++s) {
    model->slots_[s].arena = model->acts_.Slice(per_slot * s, per_slot);
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
  return HostSpan(staging_->embedding_grad.host, embedding_grad_.numel());
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
  if (staging_ == nullptr) {
    return tensor_group_->AllReduce(span.data, span.numel, comm::DataType::kFloat32, op,
                                    options_.collective_timeout);
  }
  // The group's collectives work on host memory: reduce a host copy.
  const TensorSpan host = HostSpan(staging_->reduce, span.numel);
  backend_->CopyToHost(host.data, span);
  RETURN_IF_ERROR(backend_->Synchronize());
  RETURN_IF_ERROR(tensor_group_->AllReduce(host.data, span.numel, comm::DataType::kFloat32, op,
                                           options_.collective_timeout));
  backend_->CopyFromHost(span, host.data);
  return backend_->Synchronize();
}

TensorSpan GptModel::HostSpan(const compute::Buffer& host, size_t numel) {
  CHECK(numel <= host.numel()) << numel << " of " << host.numel();
  return TensorSpan{host.data(), DType::kFloat32, numel};
}

TensorSpan GptModel::StageInput(int slot, int B, int T) {
  CHECK(slot >= 0 && slot < static_cast<int>(slots_.size())) << "slot " << slot;
  CHECK(B >= 1 && B <= options_.max_micro_batch && T >= 1 && T <= config_.context_length);
  if (staging_ != nullptr) {
    return HostSpan(staging_->stage_input[slot], static_cast<size_t>(B) * T * config_.width);
  }
  return LayOutActivations(config_, layout(), *backend_, slots_[slot].arena, B, T).encoded;
}

absl::StatusOr<double> GptModel::Forward(const int32_t* inputs, const int32_t* targets, int B,
                                         int T) {
  if (layout().pp > 1) {
    return absl::FailedPreconditionError("Forward runs a whole model; use ForwardStage");
  }
  return ForwardStage(0, inputs, targets, B, T);
}

void GptModel::Touch() {
  for (const compute::Buffer* buffer :
       {&params_, &grads_, &embedding_grad_, &acts_, &grad_acts_, &tokens_}) {
    if (buffer->data() != nullptr) backend_->Zero(buffer->span());
  }
  if (staging_ != nullptr) {
    // The host copies are the weights now; the backend's were just zeroed.
    staging_->params.newest = Newest::kHostNewer;
    staging_->grads.newest = Newest::kZeroOnBackend;
    staging_->embedding_grad.newest = Newest::kZeroOnBackend;
  }
}

absl::Status GptModel::CheckCancelled() const {
  if (cancel_ != nullptr && cancel_->load(std::memory_order_relaxed)) {
    return absl::AbortedError("step cancelled");
  }
  return absl::OkStatus();
}

absl::StatusOr<double> GptModel::ForwardStage(int slot_index, const int32_t* inputs,
                                              const int32_t* targets, int B, int T) {
  if (slot_index < 0 || slot_index >= static_cast<int>(slots_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("activation slot ", slot_index,
                                                   " outside [0, ", slots_.size(), ")"));
  }
  if (B < 1 || B > options_.max_micro_batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch size ", B, " outside [1, max_micro_batch=", options_.max_micro_batch, "]"));
  }
  if (T < 1 || T > config_.context_length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence length ", T, " outside [1, context_length=", config_.context_length, "]"));
  }
  const ModelLayout& lay = layout();
  if (lay.has_embedding()) RETURN_IF_ERROR(CheckTokens("input", inputs, B, T));
  if (lay.has_head()) RETURN_IF_ERROR(CheckTokens("target", targets, B, T));
  // DeferNextForward's request holds for this forward only.
  const TensorSpan loss_sum = std::exchange(next_loss_sum_, TensorSpan{});
  RETURN_IF_ERROR(UploadStaleParams());
  // From here on the slot's previous state is overwritten.
  Slot& slot = slots_[slot_index];
  slot.B = 0;
  slot.logits_overwritten = false;
  const int N = B * T;
  const int L = lay.num_layers(config_);
  const int C = config_.width;
  const int Cl = C / lay.tp;  // attention channels of this tensor rank
  const int NHl = config_.heads / lay.tp;
  const bool bias_here = lay.tp_rank == 0;  // row-parallel biases: added once
  compute::Backend& be = *backend_;
  const size_t tokens_per_slot = 2 * static_cast<size_t>(options_.max_micro_batch) *
                                 config_.context_length;
  slot.inputs = tokens_.Slice(tokens_per_slot * slot_index, N);
  slot.targets = tokens_.Slice(tokens_per_slot * slot_index + N, N);
  // Deferred: the caller's arrays are AllocateHost memory it keeps until
  // its next wait (DeferNextForward), so nothing waits here.
  auto upload = [&](TensorSpan dst, const int32_t* src) {
    if (loss_sum.empty()) {
      be.CopyFromHost(dst, src);
    } else {
      be.CopyFromHostAsync(dst, src);
    }
  };
  if (lay.has_embedding()) upload(slot.inputs, inputs);
  if (lay.has_head()) upload(slot.targets, targets);
  GptActivations a = LayOutActivations(config_, lay, be, slot.arena, B, T);
  if (staging_ != nullptr && !lay.has_embedding()) {
    be.CopyFromHost(a.encoded, staging_->stage_input[slot_index].data());  // StageInput
  }

  if (lay.has_embedding()) {
    if (lay.tp == 1) {
      be.EncoderForward(a.encoded, slot.inputs, param(kWte), param(kWpe), B, T, C);
    } else {
      // Each rank looks up the tokens of its vocabulary rows (zero for the
      // rest); the sum over the group is the full lookup plus wpe, bitwise.
      be.EncoderForwardShard(a.encoded, slot.inputs, param(kWte),
                             bias_here ? param(kWpe) : TensorSpan{}, lay.vocab_start(config_),
                             lay.vocab_rows(config_), B, T, C);
      RETURN_IF_ERROR(TensorAllReduce(a.encoded, comm::ReduceOp::kSum));
    }
  }
  for (int l = 0; l < L; ++l) {
    RETURN_IF_ERROR(CheckCancelled());
    GptLayerActivations& la = a.layers[l];
    const TensorSpan residual = l == 0 ? a.encoded : a.layers[l - 1].residual3;
    // A later layer's ln1 came with the previous layer's residual add.
    if (l == 0) {
      be.LayerNormForward(la.ln1, la.ln1_mean, la.ln1_rstd, residual, param(kLn1w, l),
                          param(kLn1b, l), N, C);
    }
    be.MatmulForward(la.qkv, la.ln1, param(kQkvw, l), param(kQkvb, l), N, C, 3 * Cl);
    be.AttentionForward(la.atty, la.att, la.qkv, B, T, Cl, NHl);
    be.MatmulForward(la.attproj, la.atty, param(kAttprojw, l),
                     bias_here ? param(kAttprojb, l) : TensorSpan{}, N, Cl, C);
    RETURN_IF_ERROR(TensorAllReduce(la.attproj, comm::ReduceOp::kSum));
    be.ResidualLayerNormForward(la.residual2, la.ln2, la.ln2_mean, la.ln2_rstd, residual,
                                la.attproj, param(kLn2w, l), param(kLn2b, l), N, C);
    // fch keeps the GELU's input for the backward.
    be.MatmulGeluForward(la.fch_gelu, la.fch, la.ln2, param(kFcw, l), param(kFcb, l), N, C, 4 * Cl);
    be.MatmulForward(la.fcproj, la.fch_gelu, param(kFcprojw, l),
                     bias_here ? param(kFcprojb, l) : TensorSpan{}, N, 4 * Cl, C);
    RETURN_IF_ERROR(TensorAllReduce(la.fcproj, comm::ReduceOp::kSum));
    if (l + 1 < L) {  // the residual add with the next layer's ln1
      GptLayerActivations& next = a.layers[l + 1];
      be.ResidualLayerNormForward(la.residual3, next.ln1, next.ln1_mean, next.ln1_rstd,
                                  la.residual2, la.fcproj, param(kLn1w, l + 1), param(kLn1b, l + 1),
                                  N, C);
    } else {  // the head's lnf or the next stage reads it
      be.ResidualForward(la.residual3, la.residual2, la.fcproj, static_cast<size_t>(N) * C);
    }
  }
  slot.acts = std::move(a);
  double loss = 0.0;
  if (lay.has_head()) {
    slot.B = B;  // HeadForward reads the slot's shape
    slot.T = T;
    ASSIGN_OR_RETURN(loss, HeadForward(slot, loss_sum));
  } else {
    if (staging_ != nullptr) {  // StageOutput, for the caller to send
      be.CopyToHost(staging_->stage_output[slot_index].data(), slot.acts.layers.back().residual3);
    }
    RETURN_IF_ERROR(be.Synchronize());
  }
  slot.B = B;
  slot.T = T;
  return loss;
}

absl::StatusOr<double> GptModel::HeadForward(Slot& slot, TensorSpan loss_sum) {
  const ModelLayout& lay = layout();
  compute::Backend& be = *backend_;
  GptActivations& a = slot.acts;
  const int N = slot.B * slot.T;
  const int C = config_.width;
  const int V = config_.vocab_size;
  const int Vs = lay.vocab_rows(config_);
  be.LayerNormForward(a.lnf, a.lnf_mean, a.lnf_rstd, a.layers.back().residual3, param(kLnfw),
                      param(kLnfb), N, C);
  // Tied LM head: logits = lnf wte^T over this rank's vocabulary rows.
  be.MatmulForward(a.logits, a.lnf, param(kWte), TensorSpan{}, N, C, Vs);
  if (lay.tp == 1) {
    be.CrossEntropyForward(a.losses, a.lse, a.logits, slot.targets, N, V, Vs);
  } else {
    // Vocab-parallel: global row max, then the sums of exponentials and the
    // target logits, each reduced over the tensor group.
    const int start = lay.vocab_start(config_);
    be.CrossEntropyShardMax(a.row_max, a.logits, N, V, Vs, start);
    RETURN_IF_ERROR(TensorAllReduce(a.row_max, comm::ReduceOp::kMax));
    be.CrossEntropyShardSums(a.ce_sums, a.logits, a.row_max, slot.targets, N, V, Vs, start);
    RETURN_IF_ERROR(TensorAllReduce(a.ce_sums, comm::ReduceOp::kSum));
    be.CrossEntropyShardFinish(a.losses, a.lse, a.row_max, a.ce_sums, N);
  }
  if (!loss_sum.empty()) {
    // The device-resident step reads every micro-batch's sum at its end,
    // in one wait (DeferNextForward); the CPU's are this loop's bits.
    be.SumLosses(loss_sum, a.losses.Slice(0, N));
    return std::numeric_limits<double>::quiet_NaN();
  }
  host_losses_.resize(N);
  be.CopyToHost(host_losses_.data(), a.losses);
  RETURN_IF_ERROR(be.Synchronize());
  // Serial double sum: the same mean for any backend thread count.
  double sum = 0.0;
  for (float loss : host_losses_) sum += loss;
  return sum / N;
}

TensorSpan GptModel::StageOutput(int slot) const {
  CHECK(slot >= 0 && slot < static_cast<int>(slots_.size()) && slots_[slot].B > 0)
      << "slot " << slot << " has no forward";
  const TensorSpan output = slots_[slot].acts.layers.back().residual3;
  if (staging_ == nullptr) return output;
  // The staged copy exists where a stage sends its output on.
  CHECK(!layout().has_head()) << "StageOutput of a staged model: the last stage sends nothing";
  return HostSpan(staging_->stage_output[slot], output.numel);
}

TensorSpan GptModel::StageOutputGrad(int B, int T) {
  const TensorSpan grad =
      LayOutActivationGrads(config_, layout(), grad_acts_.span(), B, T).dresidual;
  return staging_ != nullptr ? HostSpan(staging_->stage_output_grad, grad.numel) : grad;
}

TensorSpan GptModel::StageInputGrad() const {
  CHECK(last_backward_slot_ >= 0) << "no backward has run";
  const Slot& slot = slots_[last_backward_slot_];
  const TensorSpan grad =
      LayOutActivationGrads(config_, layout(), grad_acts_.span(), slot.B, slot.T).dresidual;
  if (staging_ == nullptr) return grad;
  CHECK(!layout().has_embedding())
      << "StageInputGrad of a staged model: the first stage sends no input gradient";
  return HostSpan(staging_->stage_input_grad, grad.numel);
}

void GptModel::ZeroGrad() {
  backend_->Zero(grads_.span());
  if (!embedding_grad_.span().empty()) backend_->Zero(embedding_grad_.span());
  if (staging_ != nullptr) {
    staging_->grads.newest = Newest::kZeroOnBackend;
    staging_->embedding_grad.newest = Newest::kZeroOnBackend;
  }
}

absl::Status GptModel::Backward(double loss_scale) {
  if (layout().pp > 1) {
    return absl::FailedPreconditionError("Backward runs a whole model; use BackwardStage");
  }
  RETURN_IF_ERROR(UploadStaleGrads());
  RETURN_IF_ERROR(BackwardOnBackend(0, loss_scale));
  // Both tied parts into grads(): head + embedding, one rounding per element.
  backend_->ResidualForward(grad(kWte), grad(kWte), embedding_grad_.span(),
                            table_[kWte].numel);
  const bool stay = KeepGradientsOnBackend();
  backend_->Zero(embedding_grad_.span());
  if (staging_ != nullptr) staging_->embedding_grad.newest = Newest::kZeroOnBackend;
  if (stay) return absl::OkStatus();
  RETURN_IF_ERROR(backend_->Synchronize());
  return DownloadGrads();
}

absl::Status GptModel::BackwardStage(int slot_index, double loss_scale) {
  RETURN_IF_ERROR(UploadStaleGrads());
  RETURN_IF_ERROR(BackwardOnBackend(slot_index, loss_scale));
  if (KeepGradientsOnBackend()) return absl::OkStatus();
  if (staging_ != nullptr && embedding_grad_.data() != nullptr) {
    Download(staging_->embedding_grad, embedding_grad_.span());
  }
  return DownloadGrads();
}

bool GptModel::KeepGradientsOnBackend() {
  if (staging_ == nullptr || !gradients_stay_) return false;
  staging_->grads.newest = Newest::kBackendNewer;
  if (embedding_grad_.data() != nullptr) staging_->embedding_grad.newest = Newest::kBackendNewer;
  return true;
}

absl::Status GptModel::BackwardOnBackend(int slot_index, double loss_scale) {
  if (slot_index < 0 || slot_index >= static_cast<int>(slots_.size()) ||
      slots_[slot_index].B == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("Backward needs a successful Forward of slot ", slot_index, " first"));
  }
  if (!std::isfinite(loss_scale)) {
    return absl::InvalidArgumentError(absl::StrCat("loss_scale must be finite, got ", loss_scale));
  }
  if (slots_[slot_index].logits_overwritten) {
    return absl::FailedPreconditionError(
        absl::StrCat("Backward needs a new Forward of slot ", slot_index,
                     ": the last Backward wrote the logits' gradient over its logits"));
  }
  const ModelLayout& lay = layout();
  Slot& slot = slots_[slot_index];
  const int B = slot.B;
  const int T = slot.T;
  const int N = B * T;
  const int L = lay.num_layers(config_);
  const int C = config_.width;
  const int Cl = C / lay.tp;
  const int NHl = config_.heads / lay.tp;
  const int V = config_.vocab_size;
  const int Vs = lay.vocab_rows(config_);
  compute::Backend& be = *backend_;
  const GptActivations& a = slot.acts;
  const GptActivationGrads g = LayOutActivationGrads(config_, lay, grad_acts_.span(), B, T);
  last_backward_slot_ = slot_index;
  if (staging_ != nullptr && !lay.has_head()) {
    be.CopyFromHost(g.dresidual, staging_->stage_output_grad.data());  // StageOutputGrad
  }

  if (lay.has_head()) {
    // A cancel seen before the logits are overwritten leaves the slot able
    // to run its backward again.
    RETURN_IF_ERROR(CheckCancelled());
    // d(loss_scale * mean loss)/d(loss at each position).
    const TensorSpan dlosses = LossGradient(static_cast<float>(loss_scale / N), N);
    // The logits' gradient overwrites the logits (backend.h allows it in
    // place): no second vocabulary-sized buffer. From here the slot's logits
    // are gone (logits(), CopyLogitsToHost and a second Backward refuse).
    const TensorSpan dlogits = a.logits;
    slot.logits_overwritten = true;
    if (lay.tp == 1) {
      be.CrossEntropyBackward(dlogits, a.logits, a.lse, slot.targets, dlosses, N, V, Vs);
    } else {
      be.CrossEntropyShardBackward(dlogits, a.logits, a.lse, slot.targets, dlosses, N, V, Vs,
                                   lay.vocab_start(config_));
    }
    // LM head: the first of the two tied wte contributions.
    be.Zero(g.dln);
    be.MatmulBackward(g.dln, grad(kWte), TensorSpan{}, dlogits, a.lnf, param(kWte), N, C, Vs);
    RETURN_IF_ERROR(TensorAllReduce(g.dln, comm::ReduceOp::kSum));
    be.Zero(g.dresidual);
    be.LayerNormBackward(g.dresidual, grad(kLnfw), grad(kLnfb), g.dln, a.layers.back().residual3,
                         param(kLnfw), a.lnf_mean, a.lnf_rstd, N, C);
  }
  // Otherwise g.dresidual already holds the next stage's gradient
  // (StageOutputGrad). It holds d(residual3 of layer l) entering each
  // iteration and d(input residual of layer l) leaving it: the residual adds
  // pass their gradient through unchanged, so the branches only add into it.
  for (int l = L - 1; l >= 0; --l) {
    RETURN_IF_ERROR(CheckCancelled());
    const GptLayerActivations& la = a.layers[l];
    const TensorSpan residual = l == 0 ? a.encoded : a.layers[l - 1].residual3;
    // MLP branch: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))).
    // fcproj's and the GELU's backward in one op, which also gives fc's bias
    // gradient (dfch is written, so it needs no zeroing).
    be.MatmulGeluBackward(g.dfch, grad(kFcb, l), grad(kFcprojw, l), grad(kFcprojb, l), g.dresidual,
                          la.fch_gelu, la.fch, param(kFcprojw, l), N, 4 * Cl, C);
    be.Zero(g.dln);
    be.MatmulBackward(g.dln, grad(kFcw, l), TensorSpan{}, g.dfch, la.ln2, param(kFcw, l), N, C,
                      4 * Cl);
    RETURN_IF_ERROR(TensorAllReduce(g.dln, comm::ReduceOp::kSum));
    be.LayerNormBackward(g.dresidual, grad(kLn2w, l), grad(kLn2b, l), g.dln, la.residual2,
                         param(kLn2w, l), la.ln2_mean, la.ln2_rstd, N, C);
    // Attention branch: residual2 = residual + attproj(attention(qkv(ln1(residual)))).
    be.Zero(g.datty);
    be.MatmulBackward(g.datty, grad(kAttprojw, l), grad(kAttprojb, l), g.dresidual, la.atty,
                      param(kAttprojw, l), N, Cl, C);
    be.Zero(g.dqkv);
    be.AttentionBackward(g.dqkv, g.datty, la.qkv, la.att, B, T, Cl, NHl);
    be.Zero(g.dln);
    be.MatmulBackward(g.dln, grad(kQkvw, l), grad(kQkvb, l), g.dqkv, la.ln1, param(kQkvw, l), N, C,
                      3 * Cl);
    RETURN_IF_ERROR(TensorAllReduce(g.dln, comm::ReduceOp::kSum));
    be.LayerNormBackward(g.dresidual, grad(kLn1w, l), grad(kLn1b, l), g.dln, residual,
                         param(kLn1w, l), la.ln1_mean, la.ln1_rstd, N, C);
  }
  if (lay.has_embedding()) {
    // The token embedding's wte contribution, kept apart from the head's.
    if (lay.tp == 1) {
      be.EncoderBackward(embedding_grad_.span(), grad(kWpe), g.dresidual, slot.inputs, B, T, C);
    } else {
      be.EncoderBackwardShard(embedding_grad_.span(), grad(kWpe), g.dresidual, slot.inputs,
                              lay.vocab_start(config_), Vs, B, T, C);
    }
  } else if (staging_ != nullptr) {  // StageInputGrad, for the caller to send
    be.CopyToHost(staging_->stage_input_grad.data(), g.dresidual);
  }
  // The device-resident step waits once, at its end: a backward whose
  // gradients stay on the backend leaves its errors for that wait.
  if (gradients_stay_ && staging_ != nullptr) return absl::OkStatus();
  return be.Synchronize();
}

TensorSpan GptModel::LossGradient(float value, int N) {
  if (std::bit_cast<uint32_t>(value) != std::bit_cast<uint32_t>(dlosses_value_) ||
      dlosses_filled_ < N) {
    // A synchronous copy: the host vector is free again when it returns, and
    // the backwards before it read the old values in stream order.
    host_dlosses_.assign(N, value);
    backend_->CopyFromHost(dlosses_.Slice(0, N), host_dlosses_.data());
    dlosses_value_ = value;
    dlosses_filled_ = N;
  }
  return dlosses_.Slice(0, N);
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
  backend_->CopyToHost(dst, slots_[0].acts.logits);
  return backend_->Synchronize();
}

}  // namespace cohort::model

// GptModel's forward passes: a whole model, a pipeline stage, and the LM
// head with its loss (the contract is gpt_model.h's).
#include "worker/model/gpt_model.h"

#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace cohort::model {

using compute::TensorSpan;

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
  // The loss is read here (TrainMicroBatch is the pass that defers it).
  RETURN_IF_ERROR(BeginForward(slot_index, inputs, targets, B, T, /*deferred=*/false));
  Slot& slot = slots_[slot_index];
  RETURN_IF_ERROR(ForwardOps(slot, B, T, TensorSpan{}));
  double loss = 0.0;
  const ModelLayout& lay = layout();
  if (lay.has_head()) {
    ASSIGN_OR_RETURN(loss, HeadLoss(slot, B * T, TensorSpan{}));
  } else {
    if (staging_ != nullptr) {  // StageOutput, for the caller to send
      backend_->CopyToHost(staging_->stage_output[slot_index].data(),
                           slot.acts.layers.back().residual3);
    }
    RETURN_IF_ERROR(backend_->Synchronize());
  }
  slot.B = B;
  slot.T = T;
  return loss;
}

absl::Status GptModel::BeginForward(int slot_index, const int32_t* inputs, const int32_t* targets,
                                    int B, int T, bool deferred) {
  if (slot_index < 0 || slot_index >= static_cast<int>(slots_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("activation slot ", slot_index, " outside [0, ", slots_.size(), ")"));
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
  RETURN_IF_ERROR(UploadStaleParams());
  // From here on the slot's previous state is overwritten.
  Slot& slot = slots_[slot_index];
  slot.B = 0;
  slot.logits_overwritten = false;
  const int N = B * T;
  compute::Backend& be = *backend_;
  const size_t tokens_per_slot =
      2 * static_cast<size_t>(options_.max_micro_batch) * config_.context_length;
  slot.inputs = tokens_.Slice(tokens_per_slot * slot_index, N);
  slot.targets = tokens_.Slice(tokens_per_slot * slot_index + N, N);
  // Deferred: the caller's arrays are AllocateHost memory it keeps until
  // its next wait (TrainMicroBatch), so nothing waits here.
  auto upload = [&](TensorSpan dst, const int32_t* src) {
    if (deferred) {
      be.CopyFromHostAsync(dst, src);
    } else {
      be.CopyFromHost(dst, src);
    }
  };
  if (lay.has_embedding()) upload(slot.inputs, inputs);
  if (lay.has_head()) upload(slot.targets, targets);
  slot.acts = LayOutActivations(config_, lay, be, slot.arena, B, T);
  if (staging_ != nullptr && !lay.has_embedding()) {
    be.CopyFromHost(slot.acts.encoded, staging_->stage_input[slot_index].data());  // StageInput
  }
  return absl::OkStatus();
}

absl::Status GptModel::ForwardOps(Slot& slot, int B, int T, TensorSpan loss_sum) {
  const ModelLayout& lay = layout();
  const int N = B * T;
  const int L = lay.num_layers(config_);
  const int C = config_.width;
  const int Cl = C / lay.tp;  // attention channels of this tensor rank
  const int NHl = config_.heads / lay.tp;
  const bool bias_here = lay.tp_rank == 0;  // row-parallel biases: added once
  compute::Backend& be = *backend_;
  GptActivations& a = slot.acts;
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
  if (!lay.has_head()) return absl::OkStatus();
  return HeadOps(slot, N, loss_sum);
}

absl::Status GptModel::HeadOps(Slot& slot, int N, TensorSpan loss_sum) {
  const ModelLayout& lay = layout();
  compute::Backend& be = *backend_;
  GptActivations& a = slot.acts;
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
  // The device-resident step reads every micro-batch's sum at its end,
  // in one wait (TrainMicroBatch); the CPU's are HeadLoss's bits.
  if (!loss_sum.empty()) be.SumLosses(loss_sum, a.losses.Slice(0, N));
  return absl::OkStatus();
}

absl::StatusOr<double> GptModel::HeadLoss(Slot& slot, int N, TensorSpan loss_sum) {
  if (!loss_sum.empty()) return std::numeric_limits<double>::quiet_NaN();
  compute::Backend& be = *backend_;
  host_losses_.resize(N);
  be.CopyToHost(host_losses_.data(), slot.acts.losses);
  RETURN_IF_ERROR(be.Synchronize());
  // Serial double sum: the same mean for any backend thread count.
  double sum = 0.0;
  for (float loss : host_losses_) sum += loss;
  return sum / N;
}

}  // namespace cohort::model

// GptModel's backward passes: gradients zeroed, the head's and the layers'
// backward on the backend, and where the gradients go after (the contract is
// gpt_model.h's).
#include "worker/model/gpt_model.h"

#include <bit>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace cohort::model {

using compute::TensorSpan;

void GptModel::ZeroGrad() {
  ZeroGradOps();
  if (staging_ != nullptr) {
    staging_->grads.newest = Newest::kZeroOnBackend;
    staging_->embedding_grad.newest = Newest::kZeroOnBackend;
  }
}

void GptModel::ZeroGradOps() {
  backend_->Zero(grads_.span());
  if (!embedding_grad_.span().empty()) backend_->Zero(embedding_grad_.span());
}

absl::Status GptModel::Backward(double loss_scale) {
  if (layout().pp > 1) {
    return absl::FailedPreconditionError("Backward runs a whole model; use BackwardStage");
  }
  RETURN_IF_ERROR(UploadStaleGrads());
  RETURN_IF_ERROR(BackwardOnBackend(0, loss_scale));
  // Both tied parts into grads(): head + embedding, one rounding per element.
  backend_->ResidualForward(grad(kWte), grad(kWte), embedding_grad_.span(), table_[kWte].numel);
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
  ASSIGN_OR_RETURN(const TensorSpan dlosses, BeginBackward(slot_index, loss_scale));
  const ModelLayout& lay = layout();
  const Slot& slot = slots_[slot_index];
  const GptActivationGrads g =
      LayOutActivationGrads(config_, lay, *backend_, grad_acts_.span(), slot.B, slot.T);
  if (staging_ != nullptr && !lay.has_head()) {
    backend_->CopyFromHost(g.dresidual, staging_->stage_output_grad.data());  // StageOutputGrad
  }
  RETURN_IF_ERROR(BackwardOps(slot, dlosses));
  if (staging_ != nullptr && !lay.has_embedding()) {  // StageInputGrad, for the caller to send
    backend_->CopyToHost(staging_->stage_input_grad.data(), g.dresidual);
  }
  // The device-resident step waits once, at its end: a backward whose
  // gradients stay on the backend leaves its errors for that wait.
  if (gradients_stay_ && staging_ != nullptr) return absl::OkStatus();
  return backend_->Synchronize();
}

absl::StatusOr<TensorSpan> GptModel::BeginBackward(int slot_index, double loss_scale) {
  if (slot_index < 0 || slot_index >= static_cast<int>(slots_.size()) ||
      slots_[slot_index].B == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("Backward needs a successful Forward of slot ", slot_index, " first"));
  }
  if (!std::isfinite(loss_scale)) {
    return absl::InvalidArgumentError(absl::StrCat("loss_scale must be finite, got ", loss_scale));
  }
  Slot& slot = slots_[slot_index];
  if (slot.logits_overwritten) {
    return absl::FailedPreconditionError(
        absl::StrCat("Backward needs a new Forward of slot ", slot_index,
                     ": the last Backward wrote the logits' gradient over its logits"));
  }
  last_backward_slot_ = slot_index;
  if (!layout().has_head()) return TensorSpan{};
  // A cancel seen before the logits are overwritten leaves the slot able
  // to run its backward again.
  RETURN_IF_ERROR(CheckCancelled());
  // From here the slot's logits are gone (logits(), CopyLogitsToHost and a
  // second Backward refuse): BackwardOps writes their gradient over them.
  slot.logits_overwritten = true;
  // d(loss_scale * mean loss)/d(loss at each position).
  const int N = slot.B * slot.T;
  return LossGradient(static_cast<float>(loss_scale / N), N);
}

absl::Status GptModel::BackwardOps(const Slot& slot, TensorSpan dlosses) {
  const ModelLayout& lay = layout();
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
  const GptActivationGrads g = LayOutActivationGrads(config_, lay, be, grad_acts_.span(), B, T);

  if (lay.has_head()) {
    // The logits' gradient overwrites the logits (backend.h allows it in
    // place): no second vocabulary-sized buffer.
    const TensorSpan dlogits = a.logits;
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
  }
  return absl::OkStatus();
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

}  // namespace cohort::model

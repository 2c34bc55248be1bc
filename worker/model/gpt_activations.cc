#include "worker/model/gpt_activations.h"

#include "common/log.h"
#include "worker/compute/gpu_launch_plan.h"

namespace cohort::model {
namespace {

using compute::TensorSpan;

// Hands out consecutive views of an arena, each of its own dtype and
// starting a whole number of kDeviceAlignment (256) bytes after the arena's
// start; with an empty arena it only counts, so sizing and carving share one
// description of the layout. A GPU backend's buffers start on 256 bytes, so
// every view does too, which is what cuBLASLt assumes of an operand unless
// told less (views packed back to back can be 2- or 4-byte aligned, for
// which it may offer no algorithm). The gaps hold nothing: only offsets
// change, not a single value, on any backend. Counting in bytes lets the
// bf16 activations and the fp32 statistics share one arena (one allocation
// per slot, as before) instead of two arenas per slot that would each need
// their own sizing and alignment.
class Carver {
 public:
  Carver(TensorSpan arena, compute::DType activation) : arena_(arena), activation_(activation) {}
  // A view of the activation dtype, and an fp32 one (statistics, state).
  TensorSpan Activation(size_t numel) { return Take(activation_, numel); }
  TensorSpan Fp32(size_t numel) { return Take(compute::DType::kFloat32, numel); }
  // Bytes used, rounded up so that an arena holding several layouts back to
  // back (GptModel's activation slots) starts each one aligned too.
  size_t used() const { return compute::gpu_plan::AlignUp(used_); }

 private:
  TensorSpan Take(compute::DType dtype, size_t numel) {
    used_ = compute::gpu_plan::AlignUp(used_);
    const size_t bytes = numel * compute::DTypeSize(dtype);
    TensorSpan view;
    if (!arena_.empty()) {
      CHECK(used_ + bytes <= arena_.bytes())
          << "activation view at byte " << used_ << " of " << bytes << " bytes past the arena's "
          << arena_.bytes();
      view = TensorSpan{static_cast<char*>(arena_.data) + used_, dtype, numel};
    }
    used_ += bytes;
    return view;
  }

  TensorSpan arena_;
  compute::DType activation_;
  size_t used_ = 0;  // bytes
};

GptActivations Carve(const GptConfig& config, const ModelLayout& layout,
                     const compute::Backend& backend, Carver& carver, int B, int T) {
  const size_t bt = static_cast<size_t>(B) * T;
  const size_t C = config.width;
  const size_t Cl = C / layout.tp;  // this rank's share of the attention channels
  GptActivations acts;
  acts.encoded = carver.Activation(bt * C);
  acts.layers.resize(layout.num_layers(config));
  for (GptLayerActivations& l : acts.layers) {
    l.ln1 = carver.Activation(bt * C);
    l.ln1_mean = carver.Fp32(bt);
    l.ln1_rstd = carver.Fp32(bt);
    l.qkv = carver.Activation(bt * 3 * Cl);
    l.atty = carver.Activation(bt * Cl);
    l.att = carver.Fp32(
        backend.AttentionStateNumel(B, T, static_cast<int>(Cl), config.heads / layout.tp));
    l.attproj = carver.Activation(bt * C);
    l.residual2 = carver.Activation(bt * C);
    l.ln2 = carver.Activation(bt * C);
    l.ln2_mean = carver.Fp32(bt);
    l.ln2_rstd = carver.Fp32(bt);
    l.fch = carver.Activation(bt * 4 * Cl);
    l.fch_gelu = carver.Activation(bt * 4 * Cl);
    l.fcproj = carver.Activation(bt * C);
    l.residual3 = carver.Activation(bt * C);
  }
  if (layout.has_head()) {
    acts.lnf = carver.Activation(bt * C);
    acts.lnf_mean = carver.Fp32(bt);
    acts.lnf_rstd = carver.Fp32(bt);
    acts.logits = carver.Activation(bt * layout.vocab_rows(config));
    acts.losses = carver.Fp32(bt);
    acts.lse = carver.Fp32(bt);
    if (layout.tp > 1) {
      acts.row_max = carver.Fp32(bt);
      acts.ce_sums = carver.Fp32(2 * bt);
    }
  }
  return acts;
}

GptActivationGrads CarveGrads(const GptConfig& config, const ModelLayout& layout, Carver& carver,
                              int B, int T) {
  const size_t bt = static_cast<size_t>(B) * T;
  const size_t C = config.width;
  const size_t Cl = C / layout.tp;
  GptActivationGrads grads;
  grads.dresidual = carver.Activation(bt * C);
  grads.dln = carver.Activation(bt * C);
  grads.datty = carver.Activation(bt * Cl);
  grads.dqkv = carver.Activation(bt * 3 * Cl);
  grads.dfch = carver.Activation(bt * 4 * Cl);
  return grads;
}

}  // namespace

size_t ActivationsBytes(const GptConfig& config, const ModelLayout& layout,
                        const compute::Backend& backend, int B, int T) {
  Carver counter(TensorSpan{}, backend.activation_dtype());
  Carve(config, layout, backend, counter, B, T);
  return counter.used();
}

size_t ActivationGradsBytes(const GptConfig& config, const ModelLayout& layout,
                            const compute::Backend& backend, int B, int T) {
  Carver counter(TensorSpan{}, backend.activation_dtype());
  CarveGrads(config, layout, counter, B, T);
  return counter.used();
}

GptActivations LayOutActivations(const GptConfig& config, const ModelLayout& layout,
                                 const compute::Backend& backend, TensorSpan arena, int B, int T) {
  CHECK(!arena.empty());
  Carver carver(arena, backend.activation_dtype());
  return Carve(config, layout, backend, carver, B, T);
}

GptActivationGrads LayOutActivationGrads(const GptConfig& config, const ModelLayout& layout,
                                         const compute::Backend& backend, TensorSpan arena, int B,
                                         int T) {
  CHECK(!arena.empty());
  Carver carver(arena, backend.activation_dtype());
  return CarveGrads(config, layout, carver, B, T);
}

}  // namespace cohort::model

#include "worker/model/gpt_activations.h"

#include "common/log.h"
#include "worker/compute/gpu_launch_plan.h"

namespace cohort::model {
namespace {

using compute::TensorSpan;

// Hands out consecutive views of an arena, each starting a whole number of
// kDeviceAlignment (256) bytes after the arena's start; with an empty arena
// it only counts, so sizing and carving share one description of the layout.
// A GPU backend's buffers start on 256 bytes, so every view does too, which
// is what cuBLASLt assumes of an operand unless told less (views packed back
// to back can be 4-byte aligned, for which it may offer no algorithm). The
// gaps hold nothing: only offsets change, not a single value, on any backend.
class Carver {
 public:
  explicit Carver(TensorSpan arena)
      : arena_(arena),
        alignment_(compute::gpu_plan::kDeviceAlignment / compute::DTypeSize(arena.dtype)) {}
  TensorSpan Take(size_t numel) {
    used_ = Aligned(used_);
    TensorSpan view;
    if (!arena_.empty()) view = arena_.Slice(used_, numel);
    used_ += numel;
    return view;
  }
  // Elements used, rounded up so that an arena holding several layouts back
  // to back (GptModel's activation slots) starts each one aligned too.
  size_t used() const { return Aligned(used_); }

 private:
  size_t Aligned(size_t elements) const {
    return (elements + alignment_ - 1) / alignment_ * alignment_;
  }

  TensorSpan arena_;
  size_t alignment_;
  size_t used_ = 0;
};

GptActivations Carve(const GptConfig& config, const ModelLayout& layout,
                     const compute::Backend& backend, Carver& carver, int B, int T) {
  const size_t bt = static_cast<size_t>(B) * T;
  const size_t C = config.width;
  const size_t Cl = C / layout.tp;  // this rank's share of the attention channels
  GptActivations acts;
  acts.encoded = carver.Take(bt * C);
  acts.layers.resize(layout.num_layers(config));
  for (GptLayerActivations& l : acts.layers) {
    l.ln1 = carver.Take(bt * C);
    l.ln1_mean = carver.Take(bt);
    l.ln1_rstd = carver.Take(bt);
    l.qkv = carver.Take(bt * 3 * Cl);
    l.atty = carver.Take(bt * Cl);
    l.att = carver.Take(
        backend.AttentionStateNumel(B, T, static_cast<int>(Cl), config.heads / layout.tp));
    l.attproj = carver.Take(bt * C);
    l.residual2 = carver.Take(bt * C);
    l.ln2 = carver.Take(bt * C);
    l.ln2_mean = carver.Take(bt);
    l.ln2_rstd = carver.Take(bt);
    l.fch = carver.Take(bt * 4 * Cl);
    l.fch_gelu = carver.Take(bt * 4 * Cl);
    l.fcproj = carver.Take(bt * C);
    l.residual3 = carver.Take(bt * C);
  }
  if (layout.has_head()) {
    acts.lnf = carver.Take(bt * C);
    acts.lnf_mean = carver.Take(bt);
    acts.lnf_rstd = carver.Take(bt);
    acts.logits = carver.Take(bt * layout.vocab_rows(config));
    acts.losses = carver.Take(bt);
    acts.lse = carver.Take(bt);
    if (layout.tp > 1) {
      acts.row_max = carver.Take(bt);
      acts.ce_sums = carver.Take(2 * bt);
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
  grads.dresidual = carver.Take(bt * C);
  grads.dln = carver.Take(bt * C);
  grads.datty = carver.Take(bt * Cl);
  grads.dqkv = carver.Take(bt * 3 * Cl);
  grads.dfch = carver.Take(bt * 4 * Cl);
  return grads;
}

}  // namespace

size_t ActivationsNumel(const GptConfig& config, const ModelLayout& layout,
                        const compute::Backend& backend, int B, int T) {
  Carver counter{TensorSpan{}};
  Carve(config, layout, backend, counter, B, T);
  return counter.used();
}

size_t ActivationGradsNumel(const GptConfig& config, const ModelLayout& layout, int B, int T) {
  Carver counter{TensorSpan{}};
  CarveGrads(config, layout, counter, B, T);
  return counter.used();
}

GptActivations LayOutActivations(const GptConfig& config, const ModelLayout& layout,
                                 const compute::Backend& backend, TensorSpan arena, int B, int T) {
  CHECK(!arena.empty());
  Carver carver(arena);
  return Carve(config, layout, backend, carver, B, T);
}

GptActivationGrads LayOutActivationGrads(const GptConfig& config, const ModelLayout& layout,
                                         TensorSpan arena, int B, int T) {
  CHECK(!arena.empty());
  Carver carver(arena);
  return CarveGrads(config, layout, carver, B, T);
}

}  // namespace cohort::model

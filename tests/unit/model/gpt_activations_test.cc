// The activation arenas' layout: every view starts a multiple of 256 bytes
// after its arena's start (what cuBLASLt assumes of an operand on a GPU,
// whose buffers start on 256 bytes), views do not overlap, and the sizes
// are multiples of 256 bytes so that slots laid back to back stay aligned.

#include "worker/model/gpt_activations.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "worker/compute/cpu_backend.h"

namespace cohort::model {
namespace {

using compute::TensorSpan;

constexpr size_t kAlignmentFloats = 256 / sizeof(float);

// The non-empty views, in the order they are carved.
std::vector<TensorSpan> Views(const GptActivations& a) {
  std::vector<TensorSpan> views = {a.encoded};
  for (const GptLayerActivations& l : a.layers) {
    views.insert(views.end(),
                 {l.ln1, l.ln1_mean, l.ln1_rstd, l.qkv, l.atty, l.att, l.attproj, l.residual2,
                  l.ln2, l.ln2_mean, l.ln2_rstd, l.fch, l.fch_gelu, l.fcproj, l.residual3});
  }
  views.insert(views.end(), {a.lnf, a.lnf_mean, a.lnf_rstd, a.logits, a.losses, a.lse,
                             a.row_max, a.ce_sums});
  std::erase_if(views, [](const TensorSpan& v) { return v.empty(); });
  return views;
}

std::vector<TensorSpan> Views(const GptActivationGrads& g) {
  std::vector<TensorSpan> views = {g.dresidual, g.dln, g.datty, g.dqkv, g.dfch};
  std::erase_if(views, [](const TensorSpan& v) { return v.empty(); });
  return views;
}

void ExpectAlignedAndDisjoint(const std::vector<TensorSpan>& views, const TensorSpan& arena,
                              const char* what) {
  const auto* base = static_cast<const float*>(arena.data);
  size_t end = 0;  // of the previous view, in floats from the arena's start
  for (size_t i = 0; i < views.size(); ++i) {
    const size_t offset = static_cast<size_t>(static_cast<const float*>(views[i].data) - base);
    EXPECT_EQ(offset % kAlignmentFloats, 0u) << what << " view " << i << " at " << offset;
    EXPECT_GE(offset, end) << what << " view " << i << " overlaps the one before";
    end = offset + views[i].numel;
    EXPECT_LE(end, arena.numel) << what << " view " << i;
  }
}

TEST(GptActivationsTest, EveryViewStartsOn256BytesAndSizesAreWholeMultiples) {
  // Odd sizes everywhere: 75 channels, 3 heads, a vocabulary of 211
  // (213 padded, so that tp 3 divides it), T 7.
  const GptConfig config{.layers = 2,
                         .heads = 3,
                         .width = 75,
                         .vocab_size = 211,
                         .context_length = 7,
                         .padded_vocab = 213};
  compute::CpuBackend backend(compute::CpuBackendOptions{.num_threads = 1});
  const ModelLayout layouts[] = {{},
                                 {.tp = 3, .tp_rank = 1, .pp = 2, .stage = 1},
                                 {.tp = 1, .tp_rank = 0, .pp = 2, .stage = 0}};
  for (const ModelLayout& layout : layouts) {
    ASSERT_TRUE(layout.Validate(config).ok());
    for (const auto& [B, T] : {std::pair{3, 7}, std::pair{1, 5}}) {
      const size_t numel = ActivationsNumel(config, layout, backend, B, T);
      const size_t grads_numel = ActivationGradsNumel(config, layout, B, T);
      EXPECT_EQ(numel % kAlignmentFloats, 0u);
      EXPECT_EQ(grads_numel % kAlignmentFloats, 0u);
      std::vector<float> arena(numel), grads_arena(grads_numel);
      const TensorSpan span{arena.data(), compute::DType::kFloat32, arena.size()};
      const TensorSpan grads_span{grads_arena.data(), compute::DType::kFloat32, grads_arena.size()};
      const std::vector<TensorSpan> views =
          Views(LayOutActivations(config, layout, backend, span, B, T));
      ExpectAlignedAndDisjoint(views, span, "activation");
      ExpectAlignedAndDisjoint(Views(LayOutActivationGrads(config, layout, grads_span, B, T)),
                               grads_span, "gradient");
      // The views still have their sizes: (B,T,C) first.
      ASSERT_FALSE(views.empty());
      EXPECT_EQ(views[0].numel, static_cast<size_t>(B) * T * config.width);
    }
  }
}

}  // namespace
}  // namespace cohort::model

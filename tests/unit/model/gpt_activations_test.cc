// The activation arenas' layout: every view starts a multiple of 256 bytes
// after its arena's start (what cuBLASLt assumes of an operand on a GPU,
// whose buffers start on 256 bytes), views do not overlap, and the sizes
// are multiples of 256 bytes so that slots laid back to back stay aligned;
// with bf16 activations (backend.h, "Activation storage") the activations
// and their gradients are bf16 and the statistics and attention's state
// fp32, in about half the bytes.

#include "worker/model/gpt_activations.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/compute/cpu_backend.h"

namespace cohort::model {
namespace {

using compute::TensorSpan;

constexpr size_t kAlignment = 256;

// The non-empty views, in the order they are carved.
std::vector<TensorSpan> Views(const GptActivations& a) {
  std::vector<TensorSpan> views = {a.encoded};
  for (const GptLayerActivations& l : a.layers) {
    views.insert(views.end(),
                 {l.ln1, l.ln1_mean, l.ln1_rstd, l.qkv, l.atty, l.att, l.attproj, l.residual2,
                  l.ln2, l.ln2_mean, l.ln2_rstd, l.fch, l.fch_gelu, l.fcproj, l.residual3});
  }
  views.insert(views.end(),
               {a.lnf, a.lnf_mean, a.lnf_rstd, a.logits, a.losses, a.lse, a.row_max, a.ce_sums});
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
  const auto* base = static_cast<const char*>(arena.data);
  size_t end = 0;  // of the previous view, in bytes from the arena's start
  for (size_t i = 0; i < views.size(); ++i) {
    const size_t offset = static_cast<size_t>(static_cast<const char*>(views[i].data) - base);
    EXPECT_EQ(offset % kAlignment, 0u) << what << " view " << i << " at " << offset;
    EXPECT_GE(offset, end) << what << " view " << i << " overlaps the one before";
    end = offset + views[i].bytes();
    EXPECT_LE(end, arena.bytes()) << what << " view " << i;
  }
}

// The statistics and attention's state: fp32 whatever the activations are.
std::vector<TensorSpan> Fp32Views(const GptActivations& a) {
  std::vector<TensorSpan> views;
  for (const GptLayerActivations& l : a.layers) {
    views.insert(views.end(), {l.ln1_mean, l.ln1_rstd, l.att, l.ln2_mean, l.ln2_rstd});
  }
  views.insert(views.end(), {a.lnf_mean, a.lnf_rstd, a.losses, a.lse, a.row_max, a.ce_sums});
  std::erase_if(views, [](const TensorSpan& v) { return v.empty(); });
  return views;
}

size_t CountOf(const std::vector<TensorSpan>& views, compute::DType dtype) {
  return static_cast<size_t>(std::count_if(
      views.begin(), views.end(), [dtype](const TensorSpan& v) { return v.dtype == dtype; }));
}

class GptActivationsTest : public ::testing::TestWithParam<compute::DType> {};

TEST_P(GptActivationsTest, EveryViewStartsOn256BytesAndSizesAreWholeMultiples) {
  // Odd sizes everywhere: 75 channels, 3 heads, a vocabulary of 211
  // (213 padded, so that tp 3 divides it), T 7.
  const GptConfig config{.layers = 2,
                         .heads = 3,
                         .width = 75,
                         .vocab_size = 211,
                         .context_length = 7,
                         .padded_vocab = 213};
  const compute::DType dtype = GetParam();
  compute::CpuBackend backend(
      compute::CpuBackendOptions{.num_threads = 1, .activation_dtype = dtype});
  const ModelLayout layouts[] = {{},
                                 {.tp = 3, .tp_rank = 1, .pp = 2, .stage = 1},
                                 {.tp = 1, .tp_rank = 0, .pp = 2, .stage = 0}};
  for (const ModelLayout& layout : layouts) {
    ASSERT_TRUE(layout.Validate(config).ok());
    for (const auto& [B, T] : {std::pair{3, 7}, std::pair{1, 5}}) {
      const size_t bytes = ActivationsBytes(config, layout, backend, B, T);
      const size_t grads_bytes = ActivationGradsBytes(config, layout, backend, B, T);
      EXPECT_EQ(bytes % kAlignment, 0u);
      EXPECT_EQ(grads_bytes % kAlignment, 0u);
      std::vector<float> arena(bytes / sizeof(float)), grads_arena(grads_bytes / sizeof(float));
      const TensorSpan span{arena.data(), compute::DType::kFloat32, arena.size()};
      const TensorSpan grads_span{grads_arena.data(), compute::DType::kFloat32, grads_arena.size()};
      const GptActivations acts = LayOutActivations(config, layout, backend, span, B, T);
      const std::vector<TensorSpan> views = Views(acts);
      ExpectAlignedAndDisjoint(views, span, "activation");
      const std::vector<TensorSpan> grad_views =
          Views(LayOutActivationGrads(config, layout, backend, grads_span, B, T));
      ExpectAlignedAndDisjoint(grad_views, grads_span, "gradient");
      // The views still have their sizes: (B,T,C) first.
      ASSERT_FALSE(views.empty());
      EXPECT_EQ(views[0].numel, static_cast<size_t>(B) * T * config.width);
      // Statistics and state fp32, every other view (and every gradient)
      // of the activation dtype.
      const size_t fp32 = Fp32Views(acts).size();
      EXPECT_EQ(CountOf(Fp32Views(acts), compute::DType::kFloat32), fp32);
      if (dtype == compute::DType::kBFloat16) {
        EXPECT_EQ(CountOf(views, compute::DType::kBFloat16), views.size() - fp32);
        EXPECT_EQ(CountOf(grad_views, compute::DType::kBFloat16), grad_views.size());
      }
    }
  }
}

TEST(GptActivationsBf16Test, Bf16ActivationsTakeAboutHalfTheBytes) {
  // At width 256 and T 8 the activations are nearly all the bytes; the fp32
  // statistics and attention state (B,NH,T,T) stay fp32, about 1% of them.
  const GptConfig config{
      .layers = 2, .heads = 4, .width = 256, .vocab_size = 500, .context_length = 8};
  compute::CpuBackend fp32(compute::CpuBackendOptions{.num_threads = 1});
  compute::CpuBackend bf16(
      compute::CpuBackendOptions{.num_threads = 1, .activation_dtype = compute::DType::kBFloat16});
  const ModelLayout layout{};
  const double ratio = static_cast<double>(ActivationsBytes(config, layout, bf16, 4, 8)) /
                       static_cast<double>(ActivationsBytes(config, layout, fp32, 4, 8));
  EXPECT_GT(ratio, 0.5);  // the statistics stay fp32
  EXPECT_LT(ratio, 0.55);
  EXPECT_EQ(ActivationGradsBytes(config, layout, bf16, 4, 8) * 2,
            ActivationGradsBytes(config, layout, fp32, 4, 8));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GptActivationsTest,
                         ::testing::Values(compute::DType::kFloat32, compute::DType::kBFloat16),
                         [](const ::testing::TestParamInfo<compute::DType>& info) {
                           return std::string(compute::DTypeName(info.param));
                         });

}  // namespace
}  // namespace cohort::model

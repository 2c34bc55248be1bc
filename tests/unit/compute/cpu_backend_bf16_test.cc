// CpuBackend with bf16 activations (cpu_backend.h; backend.h, "Activation
// storage"), the reference of a GPU's bf16 storage: every op on bf16
// activation spans gives bitwise what the fp32 op gives on the widened
// inputs, with each stored activation rounded to nearest even once, and the
// fp32 outputs (statistics, parameter gradients, attention's state)
// unchanged. Accumulating outputs start from bf16 values (widened, added in
// fp32, rounded once); in-place ops (the cross-entropy backward over the
// logits, a residual add into an input) share one copy. A span of the wrong
// dtype dies.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/compute/bf16_math.h"
#include "worker/compute/cpu_backend.h"

namespace cohort::compute {
namespace {

using kernel_math::Bf16Bits;
using kernel_math::FloatOfBf16;

enum class Kind { kActivation, kFloat32, kInt32 };

// One argument of an op: its kind and initial values (an activation's are
// rounded to bf16 first, so both runs start from the same values).
struct Arg {
  Kind kind;
  std::vector<float> values;
};

std::vector<float> Random(size_t n, uint32_t seed, float scale) {
  std::mt19937 random(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(random);
  return v;
}

Arg Activation(size_t n, uint32_t seed, float scale = 1.0f) {
  std::vector<float> v = Random(n, seed, scale);
  for (float& x : v) x = FloatOfBf16(Bf16Bits(x));
  return Arg{Kind::kActivation, std::move(v)};
}

Arg Fp32(size_t n, uint32_t seed, float scale = 1.0f) {
  return Arg{Kind::kFloat32, Random(n, seed, scale)};
}

Arg Ids(size_t n, int bound, uint32_t seed) {
  std::mt19937 random(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(random() % static_cast<uint32_t>(bound));
  return Arg{Kind::kInt32, std::move(v)};
}

// The arguments' memory on one backend: activations in `activation`,
// the rest as their kind says.
struct Memory {
  std::vector<std::vector<char>> bytes;
  std::vector<TensorSpan> spans;

  Memory(const std::vector<Arg>& args, DType activation) {
    for (const Arg& arg : args) {
      const size_t n = arg.values.size();
      std::vector<char>& b = bytes.emplace_back();
      if (arg.kind == Kind::kInt32) {
        std::vector<int32_t> ids(arg.values.begin(), arg.values.end());
        b.resize(n * sizeof(int32_t));
        std::memcpy(b.data(), ids.data(), b.size());
        spans.push_back(TensorSpan{b.data(), DType::kInt32, n});
      } else if (arg.kind == Kind::kActivation && activation == DType::kBFloat16) {
        std::vector<uint16_t> bits(n);
        for (size_t i = 0; i < n; ++i) bits[i] = Bf16Bits(arg.values[i]);
        b.resize(n * sizeof(uint16_t));
        std::memcpy(b.data(), bits.data(), b.size());
        spans.push_back(TensorSpan{b.data(), DType::kBFloat16, n});
      } else {
        b.resize(n * sizeof(float));
        std::memcpy(b.data(), arg.values.data(), b.size());
        spans.push_back(TensorSpan{b.data(), DType::kFloat32, n});
      }
    }
  }
};

using Op = std::function<void(Backend&, const std::vector<TensorSpan>&)>;

// Runs `op` on an fp32 backend and on a bf16 one from the same values and
// expects every bf16 activation to be the rounded fp32 one, bit for bit,
// and every other argument the fp32 run's bits. Returns how many activation
// elements rounding changed (so a test can see that it rounded anything).
size_t ExpectRoundedFp32Op(const std::vector<Arg>& args, const Op& op, int threads = 2) {
  CpuBackend fp32(CpuBackendOptions{.num_threads = threads});
  CpuBackend bf16(CpuBackendOptions{.num_threads = threads, .activation_dtype = DType::kBFloat16});
  Memory a(args, DType::kFloat32), b(args, DType::kBFloat16);
  op(fp32, a.spans);
  op(bf16, b.spans);
  size_t rounded = 0;
  for (size_t k = 0; k < args.size(); ++k) {
    const size_t n = args[k].values.size();
    const auto* want = reinterpret_cast<const float*>(a.bytes[k].data());
    if (args[k].kind == Kind::kActivation) {
      const auto* got = reinterpret_cast<const uint16_t*>(b.bytes[k].data());
      size_t wrong = 0;
      for (size_t i = 0; i < n; ++i) {
        if (got[i] != Bf16Bits(want[i])) ++wrong;
        if (FloatOfBf16(got[i]) != want[i]) ++rounded;
      }
      EXPECT_EQ(wrong, 0u) << "argument " << k << ": " << wrong << " of " << n
                           << " elements are not the rounded fp32 result";
    } else {
      EXPECT_EQ(std::memcmp(a.bytes[k].data(), b.bytes[k].data(), a.bytes[k].size()), 0)
          << "argument " << k << " (fp32 or int32) differs from the fp32 op's";
    }
  }
  return rounded;
}

constexpr int kB = 2, kT = 7, kC = 24, kNH = 3, kN = kB * kT;

TEST(CpuBackendBf16Test, LayerNormForwardAndBackward) {
  // out, mean, rstd, inp, weight, bias.
  EXPECT_GT(ExpectRoundedFp32Op({Activation(kN * kC, 1), Fp32(kN, 2), Fp32(kN, 3),
                                 Activation(kN * kC, 4, 3.0f), Fp32(kC, 5), Fp32(kC, 6)},
                                [](Backend& be, const std::vector<TensorSpan>& s) {
                                  be.LayerNormForward(s[0], s[1], s[2], s[3], s[4], s[5], kN, kC);
                                }),
            0u);
  // dinp (accumulates), dweight, dbias, dout, inp, weight, mean, rstd: the
  // statistics from an fp32 forward of the same inputs.
  std::vector<Arg> args = {
      Activation(kN * kC, 11),       Fp32(kC, 12), Fp32(kC, 13), Activation(kN * kC, 14),
      Activation(kN * kC, 15, 2.0f), Fp32(kC, 16), Fp32(kN, 17), Fp32(kN, 18)};
  for (float& r : args[7].values) r = 1.0f + std::abs(r);
  EXPECT_GT(ExpectRoundedFp32Op(args,
                                [](Backend& be, const std::vector<TensorSpan>& s) {
                                  be.LayerNormBackward(s[0], s[1], s[2], s[3], s[4], s[5], s[6],
                                                       s[7], kN, kC);
                                }),
            0u);
}

TEST(CpuBackendBf16Test, ResidualLayerNormNormalisesTheSumBeforeItIsRounded) {
  // residual_out, out, mean, rstd, inp1, inp2, weight, bias. The fp32 op's
  // LayerNorm reads the unrounded sum, so the bf16 op's must too (as a
  // GPU's fused kernel reads it from registers).
  EXPECT_GT(ExpectRoundedFp32Op(
                {Activation(kN * kC, 1), Activation(kN * kC, 2), Fp32(kN, 3), Fp32(kN, 4),
                 Activation(kN * kC, 5), Activation(kN * kC, 6), Fp32(kC, 7), Fp32(kC, 8)},
                [](Backend& be, const std::vector<TensorSpan>& s) {
                  be.ResidualLayerNormForward(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], kN,
                                              kC);
                }),
            0u);
}

TEST(CpuBackendBf16Test, MatmulsAndTheirFusedGelu) {
  constexpr int OC = 3 * kC;
  // out, inp, weight, bias.
  EXPECT_GT(ExpectRoundedFp32Op(
                {Activation(kN * OC, 1), Activation(kN * kC, 2), Fp32(OC * kC, 3), Fp32(OC, 4)},
                [](Backend& be, const std::vector<TensorSpan>& s) {
                  be.MatmulForward(s[0], s[1], s[2], s[3], kN, kC, OC);
                }),
            0u);
  // dinp (accumulates), dweight, dbias, dout, inp, weight.
  EXPECT_GT(
      ExpectRoundedFp32Op({Activation(kN * kC, 11), Fp32(OC * kC, 12), Fp32(OC, 13),
                           Activation(kN * OC, 14), Activation(kN * kC, 15), Fp32(OC * kC, 16)},
                          [](Backend& be, const std::vector<TensorSpan>& s) {
                            be.MatmulBackward(s[0], s[1], s[2], s[3], s[4], s[5], kN, kC, OC);
                          }),
      0u);
  // Without dinp (the LM head's would be the model's dln; the optional form).
  ExpectRoundedFp32Op(
      {Fp32(OC * kC, 12), Activation(kN * OC, 14), Activation(kN * kC, 15), Fp32(OC * kC, 16)},
      [](Backend& be, const std::vector<TensorSpan>& s) {
        be.MatmulBackward(TensorSpan{}, s[0], TensorSpan{}, s[1], s[2], s[3], kN, kC, OC);
      });
  // MatmulGeluForward: out, pre, inp, weight, bias. The GELU reads the
  // product before pre is rounded.
  constexpr int H = 4 * kC;
  EXPECT_GT(ExpectRoundedFp32Op({Activation(kN * H, 21), Activation(kN * H, 22),
                                 Activation(kN * kC, 23), Fp32(H * kC, 24), Fp32(H, 25)},
                                [](Backend& be, const std::vector<TensorSpan>& s) {
                                  be.MatmulGeluForward(s[0], s[1], s[2], s[3], s[4], kN, kC, H);
                                }),
            0u);
  // MatmulGeluBackward (the MLP's fcproj: act (N,H) -> dout (N,C)): dpre,
  // dpre_bias, dweight, dbias, dout, act, pre, weight.
  EXPECT_GT(ExpectRoundedFp32Op({Activation(kN * H, 31), Fp32(H, 32), Fp32(kC * H, 33),
                                 Fp32(kC, 34), Activation(kN * kC, 35), Activation(kN * H, 36),
                                 Activation(kN * H, 37, 2.0f), Fp32(kC * H, 38)},
                                [](Backend& be, const std::vector<TensorSpan>& s) {
                                  be.MatmulGeluBackward(s[0], s[1], s[2], s[3], s[4], s[5], s[6],
                                                        s[7], kN, H, kC);
                                }),
            0u);
}

TEST(CpuBackendBf16Test, AttentionForwardThenBackwardKeepsAnFp32State) {
  CpuBackend probe(CpuBackendOptions{.num_threads = 1});
  const size_t state = probe.AttentionStateNumel(kB, kT, kC, kNH);
  // out, state (fp32), qkv, dqkv (accumulates), dout.
  EXPECT_GT(
      ExpectRoundedFp32Op({Activation(kN * kC, 1), Fp32(state, 2), Activation(kN * 3 * kC, 3, 2.0f),
                           Activation(kN * 3 * kC, 4), Activation(kN * kC, 5)},
                          [](Backend& be, const std::vector<TensorSpan>& s) {
                            be.AttentionForward(s[0], s[1], s[2], kB, kT, kC, kNH);
                            be.AttentionBackward(s[3], s[4], s[2], s[1], kB, kT, kC, kNH);
                          }),
      0u);
}

TEST(CpuBackendBf16Test, PointwiseOps) {
  constexpr size_t n = 1000;
  EXPECT_GT(ExpectRoundedFp32Op({Activation(n, 1), Activation(n, 2, 3.0f)},
                                [](Backend& be, const std::vector<TensorSpan>& s) {
                                  be.GeluForward(s[0], s[1], n);
                                }),
            0u);
  // dinp accumulates.
  EXPECT_GT(ExpectRoundedFp32Op({Activation(n, 3), Activation(n, 4, 3.0f), Activation(n, 5)},
                                [](Backend& be, const std::vector<TensorSpan>& s) {
                                  be.GeluBackward(s[0], s[1], s[2], n);
                                }),
            0u);
  EXPECT_GT(ExpectRoundedFp32Op({Activation(n, 6), Activation(n, 7), Activation(n, 8)},
                                [](Backend& be, const std::vector<TensorSpan>& s) {
                                  be.ResidualForward(s[0], s[1], s[2], n);
                                }),
            0u);
  // In place: out is inp1 (one copy, rounded once).
  EXPECT_GT(ExpectRoundedFp32Op({Activation(n, 9), Activation(n, 10)},
                                [](Backend& be, const std::vector<TensorSpan>& s) {
                                  be.ResidualForward(s[0], s[0], s[1], n);
                                }),
            0u);
  // Both inputs accumulate dout.
  EXPECT_GT(ExpectRoundedFp32Op({Activation(n, 11), Activation(n, 12), Activation(n, 13)},
                                [](Backend& be, const std::vector<TensorSpan>& s) {
                                  be.ResidualBackward(s[0], s[1], s[2], n);
                                }),
            0u);
}

TEST(CpuBackendBf16Test, ResidualForwardOnFp32ArenasStaysFp32) {
  // The gradient tree's folds add fp32 parameter-gradient arenas with
  // ResidualForward in any activation dtype: those bits are the fp32 op's.
  constexpr size_t n = 777;
  ExpectRoundedFp32Op({Fp32(n, 1), Fp32(n, 2), Fp32(n, 3)},
                      [](Backend& be, const std::vector<TensorSpan>& s) {
                        be.ResidualForward(s[0], s[1], s[2], n);
                        be.ResidualForward(s[1], s[1], s[2], n);  // in place
                      });
}

TEST(CpuBackendBf16Test, EncoderForwardAndBackward) {
  constexpr int Vp = 40, maxT = 9;
  // out, inp, wte, wpe.
  EXPECT_GT(ExpectRoundedFp32Op(
                {Activation(kN * kC, 1), Ids(kN, Vp, 2), Fp32(Vp * kC, 3), Fp32(maxT * kC, 4)},
                [](Backend& be, const std::vector<TensorSpan>& s) {
                  be.EncoderForward(s[0], s[1], s[2], s[3], kB, kT, kC);
                }),
            0u);
  // A shard without wpe: the absent rows' -0 survives the rounding.
  ExpectRoundedFp32Op({Activation(kN * kC, 5), Ids(kN, Vp, 6), Fp32(16 * kC, 7)},
                      [](Backend& be, const std::vector<TensorSpan>& s) {
                        be.EncoderForwardShard(s[0], s[1], s[2], TensorSpan{}, 8, 16, kB, kT, kC);
                      });
  // dwte, dwpe (fp32 parameter gradients, accumulating), dout, inp.
  ExpectRoundedFp32Op(
      {Fp32(Vp * kC, 11), Fp32(maxT * kC, 12), Activation(kN * kC, 13), Ids(kN, Vp, 14)},
      [](Backend& be, const std::vector<TensorSpan>& s) {
        be.EncoderBackward(s[0], s[1], s[2], s[3], kB, kT, kC);
      });
}

TEST(CpuBackendBf16Test, CrossEntropyForwardAndItsBackwardInPlace) {
  constexpr int V = 37, Vp = 48;
  // losses, lse, logits (then dlogits, in place), targets, dlosses.
  std::vector<Arg> args = {Fp32(kN, 1), Fp32(kN, 2), Activation(kN * Vp, 3, 3.0f), Ids(kN, V, 4),
                           Fp32(kN, 5)};
  EXPECT_GT(ExpectRoundedFp32Op(args,
                                [](Backend& be, const std::vector<TensorSpan>& s) {
                                  be.CrossEntropyForward(s[0], s[1], s[2], s[3], kN, V, Vp);
                                  be.CrossEntropyBackward(s[2], s[2], s[1], s[3], s[4], kN, V, Vp);
                                }),
            0u);
  // Apart: dlogits, logits, lse, targets, dlosses.
  EXPECT_GT(ExpectRoundedFp32Op({Activation(kN * Vp, 6), Activation(kN * Vp, 7, 3.0f), Fp32(kN, 8),
                                 Ids(kN, V, 9), Fp32(kN, 10)},
                                [](Backend& be, const std::vector<TensorSpan>& s) {
                                  be.CrossEntropyBackward(s[0], s[1], s[2], s[3], s[4], kN, V, Vp);
                                }),
            0u);
}

TEST(CpuBackendBf16Test, VocabParallelCrossEntropyShard) {
  // A shard of columns [24, 48) of a vocabulary of 37 (13 valid columns):
  // row_max, sums, losses, lse (fp32), logits (then dlogits in place),
  // targets, dlosses.
  constexpr int V = 37, Vs = 24, start = 24;
  EXPECT_GT(ExpectRoundedFp32Op(
                {Fp32(kN, 1), Fp32(2 * kN, 2), Fp32(kN, 3), Fp32(kN, 4),
                 Activation(kN * Vs, 5, 3.0f), Ids(kN, V, 6), Fp32(kN, 7)},
                [](Backend& be, const std::vector<TensorSpan>& s) {
                  be.CrossEntropyShardMax(s[0], s[4], kN, V, Vs, start);
                  be.CrossEntropyShardSums(s[1], s[4], s[0], s[5], kN, V, Vs, start);
                  be.CrossEntropyShardFinish(s[2], s[3], s[0], s[1], kN);
                  be.CrossEntropyShardBackward(s[4], s[4], s[3], s[5], s[6], kN, V, Vs, start);
                }),
            0u);
}

TEST(CpuBackendBf16Test, ResultsDoNotDependOnTheThreadCount) {
  constexpr int OC = 3 * kC;
  const std::vector<Arg> args = {Activation(kN * OC, 1), Activation(kN * kC, 2), Fp32(OC * kC, 3),
                                 Fp32(OC, 4)};
  const Op op = [](Backend& be, const std::vector<TensorSpan>& s) {
    be.MatmulForward(s[0], s[1], s[2], s[3], kN, kC, OC);
  };
  ExpectRoundedFp32Op(args, op, 1);
  ExpectRoundedFp32Op(args, op, 3);
}

// Spans of the wrong dtype are programmer errors (backend.h): CHECKed.
TEST(CpuBackendBf16DeathTest, SpansOfTheWrongDtypeDie) {
  CpuBackend bf16(CpuBackendOptions{.num_threads = 1, .activation_dtype = DType::kBFloat16});
  CpuBackend fp32(CpuBackendOptions{.num_threads = 1});
  std::vector<float> f(64, 1.0f), g(64, 0.0f);
  std::vector<uint16_t> h(64, Bf16Bits(1.0f)), k(64, 0);
  const TensorSpan f32{f.data(), DType::kFloat32, 64}, f32_out{g.data(), DType::kFloat32, 64};
  const TensorSpan b16{h.data(), DType::kBFloat16, 64}, b16_out{k.data(), DType::kBFloat16, 64};
  // An fp32 activation on a bf16 backend, and the reverse.
  EXPECT_DEATH(bf16.GeluForward(b16_out, f32, 64), "gelu inp: an activation, want bfloat16");
  EXPECT_DEATH(fp32.GeluForward(f32_out, b16, 64), "gelu inp: an activation, want float32");
  // A statistic must stay fp32 with bf16 activations.
  EXPECT_DEATH(bf16.LayerNormForward(b16_out, b16, f32_out, b16, f32, f32, 8, 8),
               "ln mean: want float32");
  // A residual add of mixed dtypes.
  EXPECT_DEATH(bf16.ResidualForward(f32_out, f32, b16, 64), "residual");
  // The right dtypes run.
  bf16.GeluForward(b16_out, b16, 64);
  EXPECT_NE(k[0], 0);
}

TEST(CpuBackendBf16DeathTest, OnlyFp32AndBf16ActivationsExist) {
  EXPECT_DEATH({ CpuBackend backend(CpuBackendOptions{.activation_dtype = DType::kInt32}); },
               "float32 or bfloat16");
}

}  // namespace
}  // namespace cohort::compute

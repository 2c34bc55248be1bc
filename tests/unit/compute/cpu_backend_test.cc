// CpuBackend plumbing (spans, buffers, the factory) and the determinism
// promise: every op gives the same bits for any thread count.

#include "worker/compute/cpu_backend.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/compute/reference_kernels.h"
#include "worker/compute/backend_factory.h"
#include "worker/compute/cpu_kernels.h"

namespace cohort::compute {
namespace {

using ref::RandomFloats;
using ref::Span;

TEST(TensorSpanTest, SliceOffsetsByElementSize) {
  std::vector<float> v(10);
  const TensorSpan s = Span(v);
  const TensorSpan t = s.Slice(3, 4);
  EXPECT_EQ(t.data, v.data() + 3);
  EXPECT_EQ(t.numel, 4u);
  EXPECT_EQ(t.bytes(), 16u);
  EXPECT_EQ(s.Slice(10, 0).numel, 0u);
  EXPECT_DEATH(s.Slice(8, 3), "slice");
}

TEST(CpuBackendTest, AllocateZeroFillsAndBufferMovesOwnership) {
  CpuBackend backend;
  absl::StatusOr<Buffer> buffer = backend.Allocate(DType::kInt32, 1000);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(buffer->numel(), 1000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer->data()) % 64, 0u);
  const auto* p = static_cast<const int32_t*>(buffer->data());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(p[i], 0);
  Buffer moved = std::move(*buffer);
  EXPECT_EQ(moved.data(), p);
  EXPECT_EQ(buffer->data(), nullptr);

  std::vector<int32_t> host(1000);
  for (int i = 0; i < 1000; ++i) host[i] = i;
  backend.CopyFromHost(moved.span(), host.data());
  std::vector<int32_t> back(1000);
  backend.CopyToHost(back.data(), moved.span());
  EXPECT_EQ(back, host);
  backend.Zero(moved.Slice(10, 5));
  EXPECT_EQ(p[9], 9);
  EXPECT_EQ(p[10], 0);
  EXPECT_EQ(p[14], 0);
  EXPECT_EQ(p[15], 15);
  EXPECT_TRUE(backend.Synchronize().ok());
}

TEST(BackendFactoryTest, BuildsCpuAndRejectsWhatItCannot) {
  absl::StatusOr<std::unique_ptr<Backend>> cpu =
      CreateBackend(BackendOptions{.kind = BackendKind::kCpu, .num_threads = 3});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->name(), "cpu");
  EXPECT_EQ(static_cast<CpuBackend*>(cpu->get())->num_threads(), 3);
  EXPECT_EQ(CreateBackend(BackendOptions{.num_threads = -1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Issue 23: the reduced precisions are a GPU's.
  for (Precision reduced : {Precision::kTf32, Precision::kBf16}) {
    const absl::Status status = CreateBackend(BackendOptions{.precision = reduced}).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(), absl::StrCat("the CPU backend computes in fp32; precision ",
                                             PrecisionName(reduced), " needs a GPU"));
  }
}

TEST(BackendFactoryTest, PrecisionNamesRoundTrip) {
  for (Precision precision : {Precision::kFp32, Precision::kTf32, Precision::kBf16}) {
    EXPECT_EQ(PrecisionFromName(PrecisionName(precision)), precision) << PrecisionName(precision);
  }
  for (const char* other : {"", "FP32", "fp16", "bf16 ", "unknown"}) {
    EXPECT_EQ(PrecisionFromName(other), std::nullopt) << "'" << other << "'";
  }
}

// Every op once, on sizes large enough that OpenMP splits the loops and
// OpenBLAS uses several threads; returns every output by name.
std::vector<std::pair<std::string, std::vector<float>>> RunEveryOp(int threads) {
  CpuBackend backend(CpuBackendOptions{.num_threads = threads});
  constexpr int B = 8, T = 64, C = 128, NH = 4, Vp = 512, V = 500, N = B * T;
  // Every loop, the (N,C) ones included, must be big enough to be split.
  static_assert(int64_t{N} * C >= cpu::kMinParallelWork);
  std::vector<int32_t> tokens(N);
  for (int i = 0; i < N; ++i) tokens[i] = (i * 37) % 61;  // repeats
  std::vector<float> wte = RandomFloats(Vp * C, 1), wpe = RandomFloats(T * C, 2);
  std::vector<float> x = RandomFloats(N * C, 3), w = RandomFloats(4 * C * C, 4);
  std::vector<float> bias = RandomFloats(4 * C, 5), lnw = RandomFloats(C, 6);
  std::vector<float> qkv = RandomFloats(N * 3 * C, 7), dout = RandomFloats(N * 4 * C, 8);
  std::vector<float> logits = RandomFloats(N * Vp, 9, 3.0f), dl(N, 1.0f / N);
  std::vector<std::pair<std::string, std::vector<float>>> all;
#define KEEP(v) all.emplace_back(#v, v)

  std::vector<float> enc(N * C), dwte(Vp * C), dwpe(T * C);
  backend.EncoderForward(Span(enc), Span(tokens), Span(wte), Span(wpe), B, T, C);
  backend.EncoderBackward(Span(dwte), Span(dwpe), Span(dout), Span(tokens), B, T, C);
  KEEP(enc), KEEP(dwte), KEEP(dwpe);

  std::vector<float> ln(N * C), mean(N), rstd(N), dx(N * C), dw(C), db(C);
  backend.LayerNormForward(Span(ln), Span(mean), Span(rstd), Span(x), Span(lnw), Span(bias), N, C);
  backend.LayerNormBackward(Span(dx), Span(dw), Span(db), Span(dout), Span(x), Span(lnw),
                            Span(mean), Span(rstd), N, C);
  KEEP(ln), KEEP(mean), KEEP(rstd), KEEP(dx), KEEP(dw), KEEP(db);

  std::vector<float> fc(N * 4 * C), dfx(N * C), dfw(4 * C * C), dfb(4 * C);
  backend.MatmulForward(Span(fc), Span(x), Span(w), Span(bias), N, C, 4 * C);
  backend.MatmulBackward(Span(dfx), Span(dfw), Span(dfb), Span(dout), Span(x), Span(w), N, C,
                         4 * C);
  KEEP(fc), KEEP(dfx), KEEP(dfw), KEEP(dfb);

  std::vector<float> att_out(N * C), att(backend.AttentionStateNumel(B, T, C, NH)), dqkv(N * 3 * C);
  backend.AttentionForward(Span(att_out), Span(att), Span(qkv), B, T, C, NH);
  backend.AttentionBackward(Span(dqkv), Span(dout), Span(qkv), Span(att), B, T, C, NH);
  KEEP(att_out), KEEP(att), KEEP(dqkv);

  std::vector<float> g(N * 4 * C), dg(N * 4 * C);
  backend.GeluForward(Span(g), Span(fc), g.size());
  backend.GeluBackward(Span(dg), Span(fc), Span(dout), g.size());
  KEEP(g), KEEP(dg);

  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[i] = (i * 13) % V;
  std::vector<float> losses(N), lse(N), dlogits(N * Vp);
  backend.CrossEntropyForward(Span(losses), Span(lse), Span(logits), Span(targets), N, V, Vp);
  backend.CrossEntropyBackward(Span(dlogits), Span(logits), Span(lse), Span(targets), Span(dl), N,
                               V, Vp);
  KEEP(losses), KEEP(lse), KEEP(dlogits);
  return all;
}

TEST(CpuBackendTest, EveryOpIsBitwiseIndependentOfThreadCount) {
  const auto one = RunEveryOp(1);
  for (int threads : {1, 2, 3}) {
    const auto other = RunEveryOp(threads);
    ASSERT_EQ(other.size(), one.size());
    for (size_t i = 0; i < one.size(); ++i) {
      const std::vector<float>& a = one[i].second;
      const std::vector<float>& b = other[i].second;
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << one[i].first << " differs with threads=" << threads;
    }
  }
}

}  // namespace
}  // namespace cohort::compute

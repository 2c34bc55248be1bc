// Linear layer on CpuBackend against double references, and its bits with
// several callers at once.

#include <cblas.h>

#include <cstring>
#include <latch>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/compute/reference_kernels.h"
#include "worker/compute/cpu_backend.h"

namespace cohort::compute {
namespace {

using ref::RandomFloats;
using ref::RelativeError;
using ref::Span;
using ref::ToDouble;
using ref::Vec;

constexpr int kN = 37, kC = 29, kOC = 23;

TEST(CpuMatmulTest, ForwardWithAndWithoutBias) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  std::vector<float> x = RandomFloats(kN * kC, 1), w = RandomFloats(kOC * kC, 2);
  std::vector<float> bias = RandomFloats(kOC, 3);
  std::vector<float> out(kN * kOC, 99.0f);  // overwritten, not accumulated
  backend.MatmulForward(Span(out), Span(x), Span(w), Span(bias), kN, kC, kOC);
  EXPECT_LT(RelativeError(out, ref::Matmul(ToDouble(x), ToDouble(w), ToDouble(bias), kN, kC, kOC)),
            1e-6);
  std::vector<float> out2(kN * kOC, 99.0f);
  backend.MatmulForward(Span(out2), Span(x), Span(w), TensorSpan{}, kN, kC, kOC);
  EXPECT_LT(RelativeError(out2, ref::Matmul(ToDouble(x), ToDouble(w), Vec{}, kN, kC, kOC)), 1e-6);
}

TEST(CpuMatmulTest, BackwardAccumulatesAllThreeGradients) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 2});
  std::vector<float> x = RandomFloats(kN * kC, 4), w = RandomFloats(kOC * kC, 5);
  std::vector<float> dout = RandomFloats(kN * kOC, 6);
  std::vector<float> dx(kN * kC, 1.0f), dw(kOC * kC, 2.0f), db(kOC, 3.0f);
  backend.MatmulBackward(Span(dx), Span(dw), Span(db), Span(dout), Span(x), Span(w), kN, kC, kOC);
  Vec want_dx(dx.size(), 1.0), want_dw(dw.size(), 2.0), want_db(db.size(), 3.0);
  for (int n = 0; n < kN; ++n)
    for (int o = 0; o < kOC; ++o) {
      const double g = dout[n * kOC + o];
      want_db[o] += g;
      for (int c = 0; c < kC; ++c) {
        want_dx[n * kC + c] += g * w[o * kC + c];
        want_dw[o * kC + c] += g * x[n * kC + c];
      }
    }
  EXPECT_LT(RelativeError(dx, want_dx), 1e-6);
  EXPECT_LT(RelativeError(dw, want_dw), 1e-6);
  EXPECT_LT(RelativeError(db, want_db), 1e-6);
}

TEST(CpuMatmulTest, BackwardWithoutInputGradientOrBias) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 1});
  std::vector<float> x = RandomFloats(kN * kC, 7), w = RandomFloats(kOC * kC, 8);
  std::vector<float> dout = RandomFloats(kN * kOC, 9);
  std::vector<float> dw(kOC * kC, 0.0f);
  backend.MatmulBackward(TensorSpan{}, Span(dw), TensorSpan{}, Span(dout), Span(x), Span(w), kN, kC,
                         kOC);
  Vec want_dw(dw.size(), 0.0);
  for (int n = 0; n < kN; ++n)
    for (int o = 0; o < kOC; ++o)
      for (int c = 0; c < kC; ++c) want_dw[o * kC + c] += dout[n * kOC + o] * x[n * kC + c];
  EXPECT_LT(RelativeError(dw, want_dw), 1e-6);
}

// Ranks that share a process (in-process tests, a worker's threads) call the
// kernels at the same time with their own thread counts. Each call must get
// the bits of a lone call, whatever OpenBLAS's process-wide thread count
// was before (its default is one thread per core): a count set and restored
// around each call let one caller's restore hand another's products to
// OpenBLAS's threaded driver, whose Haswell kernels round differently
// (issue 43: a validation loss that changed with the schedule). CMake runs
// this test with OPENBLAS_CORETYPE=Haswell, so that it can fail on any CPU
// with AVX2. Shapes: the test model's layers (64 rows) and one that the
// kernels tile.
TEST(CpuMatmulTest, ConcurrentCallersGetTheBitsOfALoneCall) {
  struct Shape {
    int n, c, oc;
  };
  for (const Shape shape : {Shape{64, 64, 192}, Shape{64, 256, 64}, Shape{256, 128, 512}}) {
    SCOPED_TRACE(testing::Message() << shape.n << " x " << shape.c << " -> " << shape.oc);
    std::vector<float> x = RandomFloats(shape.n * shape.c, 11);
    std::vector<float> w = RandomFloats(shape.oc * shape.c, 12);
    std::vector<float> dout = RandomFloats(shape.n * shape.oc, 13);
    struct Result {
      std::vector<float> out, dx, dw;
      bool operator==(const Result& o) const {
        auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
          return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
        };
        return same(out, o.out) && same(dx, o.dx) && same(dw, o.dw);
      }
    };
    auto run = [&](int threads) {
      CpuBackend backend(CpuBackendOptions{.num_threads = threads});
      Result r{std::vector<float>(shape.n * shape.oc), std::vector<float>(shape.n * shape.c, 0.0f),
               std::vector<float>(shape.oc * shape.c, 0.0f)};
      backend.MatmulForward(Span(r.out), Span(x), Span(w), TensorSpan{}, shape.n, shape.c,
                            shape.oc);
      backend.MatmulBackward(Span(r.dx), Span(r.dw), TensorSpan{}, Span(dout), Span(x), Span(w),
                             shape.n, shape.c, shape.oc);
      return r;
    };
    const Result lone = run(1);
    constexpr int kCallers = 4;
    constexpr int kRounds = 40;
    int mismatches = 0;
    for (int round = 0; round < kRounds; ++round) {
      openblas_set_num_threads(kCallers);
      std::latch start(kCallers);
      std::vector<int> differs(kCallers, 0);
      std::vector<std::thread> callers;
      for (int k = 0; k < kCallers; ++k) {
        callers.emplace_back([&, k] {
          start.arrive_and_wait();
          differs[k] = run(1 + (k + round) % 4) == lone ? 0 : 1;
        });
      }
      for (std::thread& caller : callers) caller.join();
      for (const int d : differs) mismatches += d;
    }
    EXPECT_EQ(mismatches, 0) << "calls (of " << kCallers * kRounds
                             << ") whose bits differ from a lone call";
  }
}

TEST(CpuMatmulTest, UndersizedOutputIsAProgrammerError) {
  CpuBackend backend(CpuBackendOptions{.num_threads = 1});
  std::vector<float> x(kN * kC), w(kOC * kC), out(kN * kOC - 1);
  EXPECT_DEATH(backend.MatmulForward(Span(out), Span(x), Span(w), TensorSpan{}, kN, kC, kOC),
               "matmul out");
}

}  // namespace
}  // namespace cohort::compute

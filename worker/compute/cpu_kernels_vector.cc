// Vectorised row primitives for the pointwise, softmax and loss kernels:
// GELU, and exp(x - shift) with its sum. glibc's scalar tanhf, coshf and
// expf made GELU alone half of a small model's step; here exp is our own
// polynomial, written once with GCC vector extensions for AVX2 + FMA
// (chosen at run time when the CPU has them) and once in scalar code for
// other CPUs.
//
// Determinism: every element goes through the same code whatever its
// position. A row's last partial vector is padded into a full one and
// computed by the same vector code as the rest, so a caller that splits a
// flat range at any multiple of kVectorWidth gets the same bits. Sums run in
// lanes combined in a fixed order: bitwise reproducible on a given CPU. (The
// AVX2 and scalar paths round differently, as OpenBLAS's per-CPU kernels do.)
//
// The project compiles with -ffp-contract=off (CMakeLists.txt): the compiler
// fuses no multiply and add of its own, so the bits do not depend on the
// optimisation level (g++ fuses at -O2 and above, not at -O1, where the
// sanitizer builds compile) or on inlining. The AVX2 path fuses where it says
// so (MulAdd), in the exponential's polynomial.

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "worker/compute/cpu_kernels.h"
#include "worker/compute/kernel_math.h"

namespace cohort::compute::cpu {
namespace {

// GELU's formula and constants are kernel_math.h's, which the CUDA kernels
// share: the scalar path calls its functions; the AVX2 path spells the same
// operations, in the same order, out on vectors (kernel_math_test.cc checks
// its bits against the functions given this file's exponential).
using kernel_math::GeluExpArgument;
using kernel_math::GeluFromExp;
using kernel_math::GeluGradFromExp;
using kernel_math::kGeluCubic;
using kernel_math::kGeluScale;

// exp: Cody-Waite reduction x = n ln2 + r with |r| <= ln2/2, a degree-7
// Taylor polynomial for e^r, and 2^n applied in two halves so that n over
// [-150, 128] stays a normal exponent. Within 2 ulp of exp for x in
// [-87.3, 88.7]; gradual underflow down to -104 and 0 below; +inf above
// ln(FLT_MAX); NaN for NaN.
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;  // few mantissa bits: n * kLn2Hi is exact
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: x + it - it rounds x to an integer
constexpr float kExpMax = 88.7228317f;      // ln(FLT_MAX)
constexpr float kExpMin = -104.0f;          // exp below it is under half the smallest subnormal
constexpr int32_t kInfBits = 0x7f800000;

// ---- Scalar path -------------------------------------------------------------

float ExpScalar(float x) {
  const float xc = x < kExpMin ? kExpMin : (x > kExpMax ? kExpMax : x);
  const float n = (xc * kLog2e + kRoundMagic) - kRoundMagic;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni >> 1;  // floor(n / 2): n1 and n - n1 in [-75, 64]
  const float y =
      p * std::bit_cast<float>((n1 + 127) << 23) * std::bit_cast<float>((ni - n1 + 127) << 23);
  if (x < kExpMin) return 0.0f;
  if (x > kExpMax) return std::bit_cast<float>(kInfBits);
  return y;
}

void GeluForwardScalar(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = GeluFromExp(inp[i], ExpScalar(GeluExpArgument(inp[i])));
}

void GeluBackwardScalar(float* dinp, const float* inp, const float* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    dinp[i] += GeluGradFromExp(x, ExpScalar(GeluExpArgument(x))) * dout[i];
  }
}

float MaxScalar(const float* x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

float ExpShiftedSumScalar(float* out, const float* x, int64_t n, float shift) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = ExpScalar(x[i] - shift);
    sum += out[i];
  }
  return sum;
}

double SumExpShiftedScalar(const float* x, int64_t n, float shift) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += ExpScalar(x[i] - shift);
  return sum;
}

void ScaledExpShiftedScalar(float* out, const float* x, int64_t n, float shift, float scale) {
  for (int64_t i = 0; i < n; ++i) out[i] = ExpScalar(x[i] - shift) * scale;
}

// ---- AVX2 + FMA path ---------------------------------------------------------

#if defined(__x86_64__) && defined(__GNUC__)
#define COHORT_HAVE_AVX2_PATH 1
#define COHORT_AVX2 __attribute__((target("avx2,fma")))
#define COHORT_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) inline

using V8f = float __attribute__((vector_size(32)));
using V8i = int32_t __attribute__((vector_size(32)));
using V4d = double __attribute__((vector_size(32)));
constexpr int kLanes = 8;

COHORT_AVX2_INLINE V8f Broadcast(float v) { return V8f{} + v; }

// a * b + c rounded once (vfmadd).
COHORT_AVX2_INLINE V8f MulAdd(V8f a, V8f b, V8f c) { return __builtin_ia32_vfmaddps256(a, b, c); }

COHORT_AVX2_INLINE V8f Load(const float* p) {
  V8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The first `count` (< kLanes) floats at p, the other lanes `fill`.
COHORT_AVX2_INLINE V8f LoadPartial(const float* p, int64_t count, float fill) {
  float lanes[kLanes];
  for (int i = 0; i < kLanes; ++i) lanes[i] = i < count ? p[i] : fill;
  return Load(lanes);
}

COHORT_AVX2_INLINE void Store(float* p, V8f v) { std::memcpy(p, &v, sizeof v); }

COHORT_AVX2_INLINE void StorePartial(float* p, int64_t count, V8f v) {
  float lanes[kLanes];
  Store(lanes, v);
  for (int64_t i = 0; i < count; ++i) p[i] = lanes[i];
}

COHORT_AVX2_INLINE V8f Exp(V8f x) {
  V8f xc = x < kExpMin ? Broadcast(kExpMin) : x;
  xc = xc > kExpMax ? Broadcast(kExpMax) : xc;
  const V8f n = (xc * kLog2e + kRoundMagic) - kRoundMagic;
  const V8f r = (xc - n * kLn2Hi) - n * kLn2Lo;
  V8f p = Broadcast(1.0f / 5040.0f);
  p = MulAdd(p, r, Broadcast(1.0f / 720.0f));
  p = MulAdd(p, r, Broadcast(1.0f / 120.0f));
  p = MulAdd(p, r, Broadcast(1.0f / 24.0f));
  p = MulAdd(p, r, Broadcast(1.0f / 6.0f));
  p = MulAdd(p, r, Broadcast(0.5f));
  p = MulAdd(p, r, Broadcast(1.0f));
  p = MulAdd(p, r, Broadcast(1.0f));
  const V8i ni = __builtin_convertvector(n, V8i);
  const V8i n1 = ni >> 1;
  const V8f y =
      p * reinterpret_cast<V8f>((n1 + 127) << 23) * reinterpret_cast<V8f>((ni - n1 + 127) << 23);
  const V8f low = x < kExpMin ? V8f{} : y;
  return x > kExpMax ? reinterpret_cast<V8f>(V8i{} + kInfBits) : low;
}

COHORT_AVX2_INLINE V8f GeluExp(V8f x) {
  const V8f cube = kGeluCubic * x * x * x;
  return Exp(-2.0f * (kGeluScale * (x + cube)));
}

COHORT_AVX2_INLINE V8f GeluSigmoid(V8f x) { return 1.0f / (1.0f + GeluExp(x)); }

COHORT_AVX2_INLINE V8f GeluLocalGrad(V8f x) {
  const V8f e = GeluExp(x);
  const V8f s = 1.0f / (1.0f + e);
  const V8f one_minus_s = e == reinterpret_cast<V8f>(V8i{} + kInfBits) ? Broadcast(1.0f) : e * s;
  return s + x * (2.0f * s * one_minus_s) * (kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x));
}

COHORT_AVX2 void GeluForwardAvx2(float* out, const float* inp, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const V8f x = Load(inp + i);
    Store(out + i, x * GeluSigmoid(x));
  }
  if (i < n) {
    const V8f x = LoadPartial(inp + i, n - i, 0.0f);
    StorePartial(out + i, n - i, x * GeluSigmoid(x));
  }
}

COHORT_AVX2 void GeluBackwardAvx2(float* dinp, const float* inp, const float* dout, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    Store(dinp + i, Load(dinp + i) + GeluLocalGrad(Load(inp + i)) * Load(dout + i));
  }
  if (i < n) {
    const int64_t rest = n - i;
    const V8f d =
        LoadPartial(dinp + i, rest, 0.0f) +
        GeluLocalGrad(LoadPartial(inp + i, rest, 0.0f)) * LoadPartial(dout + i, rest, 0.0f);
    StorePartial(dinp + i, rest, d);
  }
}

COHORT_AVX2 float MaxAvx2(const float* x, int64_t n) {
  V8f m = Broadcast(x[0]);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const V8f v = Load(x + i);
    m = v > m ? v : m;
  }
  if (i < n) {
    const V8f v = LoadPartial(x + i, n - i, x[0]);
    m = v > m ? v : m;
  }
  float best = m[0];
  for (int j = 1; j < kLanes; ++j) best = m[j] > best ? m[j] : best;
  return best;
}

// Lane sums added in a fixed order.
COHORT_AVX2_INLINE float HorizontalSum(V8f v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

COHORT_AVX2 float ExpShiftedSumAvx2(float* out, const float* x, int64_t n, float shift) {
  V8f sum{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const V8f e = Exp(Load(x + i) - shift);
    Store(out + i, e);
    sum += e;
  }
  if (i < n) {
    // Padding lanes: exp(-inf) = 0 adds nothing.
    const V8f e = Exp(LoadPartial(x + i, n - i, -HUGE_VALF) - shift);
    StorePartial(out + i, n - i, e);
    sum += e;
  }
  return HorizontalSum(sum);
}

COHORT_AVX2 double SumExpShiftedAvx2(const float* x, int64_t n, float shift) {
  V4d lo{}, hi{};
  for (int64_t i = 0; i < n; i += kLanes) {
    // The last partial vector is padded with -inf: exp = 0 adds nothing.
    const V8f e =
        Exp((i + kLanes <= n ? Load(x + i) : LoadPartial(x + i, n - i, -HUGE_VALF)) - shift);
    lo += __builtin_convertvector(__builtin_shufflevector(e, e, 0, 1, 2, 3), V4d);
    hi += __builtin_convertvector(__builtin_shufflevector(e, e, 4, 5, 6, 7), V4d);
  }
  const V4d s = lo + hi;
  return (s[0] + s[1]) + (s[2] + s[3]);
}

COHORT_AVX2 void ScaledExpShiftedAvx2(float* out, const float* x, int64_t n, float shift,
                                      float scale) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) Store(out + i, Exp(Load(x + i) - shift) * scale);
  if (i < n) {
    StorePartial(out + i, n - i, Exp(LoadPartial(x + i, n - i, 0.0f) - shift) * scale);
  }
}

bool UseAvx2() {
  static const bool use = [] {
    __builtin_cpu_init();  // harmless after libgcc's own initialisation
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return use;
}
#else
bool UseAvx2() { return false; }
#endif

}  // namespace

void GeluForwardSpan(float* out, const float* inp, int64_t n) {
#ifdef COHORT_HAVE_AVX2_PATH
  if (UseAvx2()) return GeluForwardAvx2(out, inp, n);
#endif
  GeluForwardScalar(out, inp, n);
}

void GeluBackwardSpan(float* dinp, const float* inp, const float* dout, int64_t n) {
#ifdef COHORT_HAVE_AVX2_PATH
  if (UseAvx2()) return GeluBackwardAvx2(dinp, inp, dout, n);
#endif
  GeluBackwardScalar(dinp, inp, dout, n);
}

float MaxOf(const float* x, int64_t n) {
#ifdef COHORT_HAVE_AVX2_PATH
  if (UseAvx2()) return MaxAvx2(x, n);
#endif
  return MaxScalar(x, n);
}

float ExpShiftedSum(float* out, const float* x, int64_t n, float shift) {
#ifdef COHORT_HAVE_AVX2_PATH
  if (UseAvx2()) return ExpShiftedSumAvx2(out, x, n, shift);
#endif
  return ExpShiftedSumScalar(out, x, n, shift);
}

double SumExpShifted(const float* x, int64_t n, float shift) {
#ifdef COHORT_HAVE_AVX2_PATH
  if (UseAvx2()) return SumExpShiftedAvx2(x, n, shift);
#endif
  return SumExpShiftedScalar(x, n, shift);
}

void ScaledExpShifted(float* out, const float* x, int64_t n, float shift, float scale) {
#ifdef COHORT_HAVE_AVX2_PATH
  if (UseAvx2()) return ScaledExpShiftedAvx2(out, x, n, shift, scale);
#endif
  ScaledExpShiftedScalar(out, x, n, shift, scale);
}

}  // namespace cohort::compute::cpu

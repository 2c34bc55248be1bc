#include "worker/comm/reduce.h"

#include <cmath>
#include <cstring>

namespace cohort::comm {
namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// The loops below are kept branch-free and index-based so the compiler
// vectorises them (runtime alias checks cover out == a or out == b).
template <typename T>
void SumLoop(const T* a, const T* b, T* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
}

// Unsigned wrap-around for signed integers: exact and free of overflow UB.
template <typename T, typename U>
void WrappingSumLoop(const T* a, const T* b, T* out, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    out[i] = static_cast<T>(static_cast<U>(a[i]) + static_cast<U>(b[i]));
  }
}

template <typename T>
void IntMaxLoop(const T* a, const T* b, T* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = a[i] > b[i] ? a[i] : b[i];
}

template <typename T>
void FloatMaxLoop(const T* a, const T* b, T* out, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const T x = a[i];
    const T y = b[i];
    // If y is NaN, x > y is false and y is taken; if x is NaN, x != x.
    out[i] = (x > y || x != x) ? x : y;
  }
}

using ToFloat = float (*)(uint16_t);
using FromFloat = uint16_t (*)(float);

template <ToFloat kTo, FromFloat kFrom>
void Half16Loop(ReduceOp op, const uint16_t* a, const uint16_t* b, uint16_t* out,
                size_t count) {
  if (op == ReduceOp::kSum) {
    for (size_t i = 0; i < count; ++i) out[i] = kFrom(kTo(a[i]) + kTo(b[i]));
  } else {
    for (size_t i = 0; i < count; ++i) {
      const float x = kTo(a[i]);
      const float y = kTo(b[i]);
      out[i] = kFrom((x > y || x != x) ? x : y);
    }
  }
}

}  // namespace

float BFloat16ToFloat(uint16_t bits) { return BitsFloat(static_cast<uint32_t>(bits) << 16); }

uint16_t FloatToBFloat16(float value) {
  uint32_t x = FloatBits(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  // Adding 0x7fff plus the lowest kept bit rounds half-way cases to even.
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24 is exact in float.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return BitsFloat(sign | FloatBits(magnitude));
  }
  if (exponent == 31) return BitsFloat(sign | 0x7f800000u | (mantissa << 13));
  return BitsFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t FloatToHalf(float value) {
  uint32_t x = FloatBits(value);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  uint32_t half;
  if (x >= 0x47800000u) {
    // |value| >= 2^16 (or inf/NaN): infinity, or a quiet NaN.
    half = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (x < 0x38800000u) {
    // Below the smallest normal half (2^-14): let the FPU round by adding a
    // constant that puts the half's subnormal step at float's last mantissa
    // bit (2^-24 * 2^23 = 0.5), then read the mantissa off directly.
    const float magic = 0.5f;
    const float shifted = BitsFloat(x) + magic;
    half = FloatBits(shifted) - FloatBits(magic);
  } else {
    // Rebias the exponent and round the 13 dropped bits to nearest-even; a
    // carry out of the mantissa correctly bumps the exponent (up to inf).
    const uint32_t odd = (x >> 13) & 1u;
    x += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd;
    half = x >> 13;
  }
  return static_cast<uint16_t>(half | sign);
}

void ReduceInto(DataType type, ReduceOp op, const void* a, const void* b, void* out,
                size_t count) {
  const bool sum = op == ReduceOp::kSum;
  switch (type) {
    case DataType::kFloat32: {
      auto* fa = static_cast<const float*>(a);
      auto* fb = static_cast<const float*>(b);
      auto* fo = static_cast<float*>(out);
      sum ? SumLoop(fa, fb, fo, count) : FloatMaxLoop(fa, fb, fo, count);
      return;
    }
    case DataType::kFloat64: {
      auto* da = static_cast<const double*>(a);
      auto* db = static_cast<const double*>(b);
      auto* dout = static_cast<double*>(out);
      sum ? SumLoop(da, db, dout, count) : FloatMaxLoop(da, db, dout, count);
      return;
    }
    case DataType::kBFloat16:
      Half16Loop<BFloat16ToFloat, FloatToBFloat16>(op, static_cast<const uint16_t*>(a),
                                                   static_cast<const uint16_t*>(b),
                                                   static_cast<uint16_t*>(out), count);
      return;
    case DataType::kFloat16:
      Half16Loop<HalfToFloat, FloatToHalf>(op, static_cast<const uint16_t*>(a),
                                           static_cast<const uint16_t*>(b),
                                           static_cast<uint16_t*>(out), count);
      return;
    case DataType::kInt32: {
      auto* ia = static_cast<const int32_t*>(a);
      auto* ib = static_cast<const int32_t*>(b);
      auto* io = static_cast<int32_t*>(out);
      sum ? WrappingSumLoop<int32_t, uint32_t>(ia, ib, io, count) : IntMaxLoop(ia, ib, io, count);
      return;
    }
    case DataType::kInt64: {
      auto* ia = static_cast<const int64_t*>(a);
      auto* ib = static_cast<const int64_t*>(b);
      auto* io = static_cast<int64_t*>(out);
      sum ? WrappingSumLoop<int64_t, uint64_t>(ia, ib, io, count) : IntMaxLoop(ia, ib, io, count);
      return;
    }
    case DataType::kUInt8: {
      auto* ua = static_cast<const uint8_t*>(a);
      auto* ub = static_cast<const uint8_t*>(b);
      auto* uo = static_cast<uint8_t*>(out);
      if (sum) {
        WrappingSumLoop<uint8_t, uint32_t>(ua, ub, uo, count);
      } else {
        IntMaxLoop(ua, ub, uo, count);
      }
      return;
    }
  }
}

}  // namespace cohort::comm

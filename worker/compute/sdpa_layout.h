#pragma once
// The memory layout of the cuDNN fused attention (cuda_cudnn_sdpa.cc), as
// host arithmetic the CPU tests check: the views cuDNN is given of q, k, v,
// the output and the softmax statistics, and where the attention state keeps
// them between the forward and the backward.
//
// The model's qkv is (B,T,3C) with [q | k | v] along the last axis, head h in
// channels [h*hs, (h+1)*hs) of each part. cuDNN wants (B,NH,T,hs) tensors;
// those are strided views of the same memory (no transposes): element
// (b,h,t,d) of q is at b*T*3C + t*3C + h*hs + d, k at +C, v at +2C. The
// output (B,T,C) and its gradient are (B,NH,T,hs) views the same way with a
// row of C. The statistics (logsumexp of each score row) are (B,NH,T,1),
// packed.
//
// The state (Backend::AttentionStateNumel) is counted in fp32 elements
// (backend.h) and holds, each part starting on 256 bytes, a copy of the
// bf16 output and the fp32 statistics: what the backward needs besides qkv
// and dout, which it is given. The activations are bf16 where cuDNN runs
// (precision bf16; backend.h, "Activation storage"), so cuDNN reads qkv and
// writes the output in place and keeps no copy of qkv; the output's copy
// stays because AttentionBackward is not handed the output, which the
// model may overwrite before the backward. About (2C + 4 NH) bytes per
// token, against 4 NH T bytes per token for the probabilities.

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace cohort::compute::sdpa {

struct Shape {
  int B = 0, T = 0, NH = 0, hs = 0;

  int64_t C() const { return int64_t{NH} * hs; }
  int64_t tokens() const { return int64_t{B} * T; }
  bool operator==(const Shape& o) const { return B == o.B && T == o.T && NH == o.NH && hs == o.hs; }
  bool operator<(const Shape& o) const {
    return std::array<int, 4>{B, T, NH, hs} < std::array<int, 4>{o.B, o.T, o.NH, o.hs};
  }
};

// A 4-d view in elements, cuDNN's dims and strides (outermost first).
struct View {
  std::array<int64_t, 4> dims{};
  std::array<int64_t, 4> strides{};
  int64_t offset = 0;  // elements from the base pointer
};

enum class Part { kQ = 0, kK = 1, kV = 2 };

// q, k or v of a (B,T,3C) tensor as (B,NH,T,hs).
inline View QkvView(const Shape& s, Part part) {
  const int64_t row = 3 * s.C();
  return View{{s.B, s.NH, s.T, s.hs}, {s.T * row, s.hs, row, 1}, static_cast<int>(part) * s.C()};
}

// k of a (B,T,3C) tensor transposed, (B,NH,hs,T): the second operand of
// q k^T, the same memory as QkvView(kK).
inline View KeyTransposedView(const Shape& s) {
  View k = QkvView(s, Part::kK);
  std::swap(k.dims[2], k.dims[3]);
  std::swap(k.strides[2], k.strides[3]);
  return k;
}

// A (B,T,C) tensor (the output, its gradient) as (B,NH,T,hs).
inline View HeadsView(const Shape& s) {
  return View{{s.B, s.NH, s.T, s.hs}, {s.T * s.C(), s.hs, s.C(), 1}, 0};
}

// The statistics, (B,NH,T,1) packed.
inline View StatsView(const Shape& s) {
  return View{{s.B, s.NH, s.T, 1}, {int64_t{s.NH} * s.T, s.T, 1, 1}, 0};
}

// The scores and probabilities (B,NH,T,T), packed; cuDNN keeps them virtual.
inline View ScoresView(const Shape& s) {
  return View{{s.B, s.NH, s.T, s.T}, {int64_t{s.NH} * s.T * s.T, int64_t{s.T} * s.T, s.T, 1}, 0};
}

// Where the state's parts start, in BYTES from its base, and its size in
// fp32 elements. Each part starts on 256 bytes (the model's views do too).
struct StateLayout {
  size_t out_bytes = 0;    // offset of the bf16 (B,T,C)
  size_t stats_bytes = 0;  // offset of the fp32 (B,NH,T)
  size_t total_bytes = 0;
  size_t numel() const { return total_bytes / sizeof(float); }
};

constexpr size_t kStateAlignment = 256;

inline size_t AlignUp(size_t bytes) {
  return (bytes + kStateAlignment - 1) / kStateAlignment * kStateAlignment;
}

inline StateLayout StateLayoutOf(const Shape& s) {
  const size_t tokens = static_cast<size_t>(s.tokens());
  const size_t C = static_cast<size_t>(s.C());
  StateLayout layout;
  layout.out_bytes = 0;
  layout.stats_bytes = AlignUp(layout.out_bytes + tokens * C * sizeof(uint16_t));
  layout.total_bytes = AlignUp(layout.stats_bytes + tokens * static_cast<size_t>(s.NH) * 4);
  return layout;
}

// What cuDNN's flash-attention engines take (cuDNN's documented support
// matrix for the fused attention on Ampere and Hopper): a head width that is
// a multiple of 8 and at most 128, so that the other heads fall back to the
// kernels before a plan is asked for. nullptr when supported, else why not.
inline const char* UnsupportedReason(const Shape& s) {
  if (s.B <= 0 || s.T <= 0 || s.NH <= 0 || s.hs <= 0) return "an empty shape";
  if (s.hs % 8 != 0) return "a head width that is not a multiple of 8";
  if (s.hs > 128) return "a head width above 128";
  return nullptr;
}

}  // namespace cohort::compute::sdpa

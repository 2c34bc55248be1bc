// Token and position embedding, forward and backward, over a vocab shard
// (rows [vocab_start, vocab_start + Vs) of wte; the unsharded encoder is the
// shard that holds every row).
//
// The wte gradient is a scatter-add in which tokens repeat. Atomics would
// make its sums depend on timing, so the positions are sorted by token (a
// CUB radix sort: stable, so each token's positions stay in order) and one
// block per distinct token adds that token's rows of dout in position order:
// the CPU backend's summation order, on every run. The shard's row test and
// the sort key are kernel_math.h's, which the CPU tests run. The output and
// its gradient are activations of storage S (float or Bf16: cuda_kernels.h;
// T is the sequence length here), the tables and their gradients fp32.

#include <cub/device/device_radix_sort.cuh>

#include "worker/compute/cuda_kernels.h"
#include "worker/compute/cuda_reduce.cuh"
#include "worker/compute/kernel_math.h"

namespace cohort::compute::cuda {
namespace {

using gpu_plan::AlignUp;
using gpu_plan::GridStrideBlocks;
using gpu_plan::kThreads;

using kernel_math::ShardRow;
using kernel_math::ShardSortKey;
using kernel_math::Store;
using kernel_math::Widen;

template <typename S>
__global__ void EncoderForwardKernel(S* out, const int32_t* inp, const float* wte, const float* wpe,
                                     int vocab_start, int Vs, int T, int C, int64_t total) {
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t bt = i / C;
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>(bt % T);
    const int64_t row = ShardRow(inp[bt], vocab_start, Vs);
    float value;
    if (row >= 0 && wpe != nullptr) {
      value = wte[row * C + c] + wpe[static_cast<int64_t>(t) * C + c];
    } else if (row >= 0) {
      value = wte[row * C + c];
    } else if (wpe != nullptr) {
      value = wpe[static_cast<int64_t>(t) * C + c];
    } else {
      value = -0.0f;  // the additive identity that keeps -0 sums exact (backend.h)
    }
    Store(&out[i], value);
  }
}

// dwpe[t, c] += dout[b, t, c] for b = 0, 1, ... in order.
template <typename S>
__global__ void PositionBackwardKernel(float* dwpe, const S* dout, int B, int T, int C) {
  const int64_t total = static_cast<int64_t>(T) * C;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    float acc = dwpe[i];
    for (int b = 0; b < B; ++b) acc += Widen(dout[static_cast<int64_t>(b) * T * C + i]);
    dwpe[i] = acc;
  }
}

// keys[i] = the shard row of token inp[i], or Vs (sorts last, skipped) for a
// token outside the shard; positions[i] = i.
__global__ void TokenKeysKernel(uint32_t* keys, int32_t* positions, const int32_t* inp,
                                int vocab_start, int Vs, int n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    keys[i] = ShardSortKey(inp[i], vocab_start, Vs);
    positions[i] = static_cast<int32_t>(i);
  }
}

// Block i handles the token whose run of sorted positions starts at i (and
// returns at once when i is inside a run): its dwte row gets the run's rows
// of dout added in position order.
template <typename S>
__global__ void TokenBackwardKernel(float* dwte, const S* dout, const uint32_t* keys,
                                    const int32_t* positions, int n, int Vs, int C) {
  const int i = blockIdx.x;
  const uint32_t key = keys[i];
  if (key >= static_cast<uint32_t>(Vs) || (i > 0 && keys[i - 1] == key)) return;
  float* row = dwte + static_cast<int64_t>(key) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = row[c];
    for (int j = i; j < n && keys[j] == key; ++j) {
      acc += Widen(dout[static_cast<int64_t>(positions[j]) * C + c]);
    }
    row[c] = acc;
  }
}

size_t SortTempBytes(int n, int Vs) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n, 0,
      gpu_plan::KeyBits(static_cast<uint32_t>(Vs)));
  return bytes;
}

}  // namespace

template <typename S>
void EncoderForwardShard(S* out, const int32_t* inp, const float* wte, const float* wpe,
                         int vocab_start, int Vs, int B, int T, int C, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(B) * T * C;
  EncoderForwardKernel<<<GridStrideBlocks(total, kThreads), kThreads, 0, stream>>>(
      out, inp, wte, wpe, vocab_start, Vs, T, C, total);
}

size_t EncoderBackwardScratchBytes(int n, int Vs) {
  const size_t array = AlignUp(static_cast<size_t>(n) * sizeof(uint32_t));
  return 4 * array + AlignUp(SortTempBytes(n, Vs));
}

template <typename S>
cudaError_t EncoderBackwardShard(float* dwte, float* dwpe, const S* dout, const int32_t* inp,
                                 int vocab_start, int Vs, int B, int T, int C, void* scratch,
                                 cudaStream_t stream) {
  if (C <= 0) return cudaSuccess;
  if (dwpe != nullptr) {
    PositionBackwardKernel<<<GridStrideBlocks(static_cast<int64_t>(T) * C, kThreads), kThreads, 0,
                             stream>>>(dwpe, dout, B, T, C);
  }
  const int n = B * T;
  if (n <= 0) return cudaSuccess;
  const size_t array = AlignUp(static_cast<size_t>(n) * sizeof(uint32_t));
  char* base = static_cast<char*>(scratch);
  auto* keys_in = reinterpret_cast<uint32_t*>(base);
  auto* keys_out = reinterpret_cast<uint32_t*>(base + array);
  auto* positions_in = reinterpret_cast<int32_t*>(base + 2 * array);
  auto* positions_out = reinterpret_cast<int32_t*>(base + 3 * array);
  void* sort_temp = base + 4 * array;
  size_t sort_bytes = SortTempBytes(n, Vs);
  TokenKeysKernel<<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(keys_in, positions_in,
                                                                          inp, vocab_start, Vs, n);
  const cudaError_t sorted = cub::DeviceRadixSort::SortPairs(
      sort_temp, sort_bytes, keys_in, keys_out, positions_in, positions_out, n, 0,
      gpu_plan::KeyBits(static_cast<uint32_t>(Vs)), stream);
  if (sorted != cudaSuccess) return sorted;
  const int threads = C < kThreads ? ((C + 31) / 32) * 32 : kThreads;
  TokenBackwardKernel<<<n, threads, 0, stream>>>(dwte, dout, keys_out, positions_out, n, Vs, C);
  return cudaSuccess;
}

#define COHORT_INSTANTIATE_ENCODER(S)                                                              \
  template void EncoderForwardShard<S>(S*, const int32_t*, const float*, const float*, int, int,   \
                                       int, int, int, cudaStream_t);                               \
  template cudaError_t EncoderBackwardShard<S>(float*, float*, const S*, const int32_t*, int, int, \
                                               int, int, int, void*, cudaStream_t);
COHORT_FOR_EACH_STORAGE(COHORT_INSTANTIATE_ENCODER)
#undef COHORT_INSTANTIATE_ENCODER

}  // namespace cohort::compute::cuda
